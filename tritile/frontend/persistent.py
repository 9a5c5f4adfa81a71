"""TileLang's `T.Persistent(domain, wave_size, index, group_size=8)`: a persistent tile loop,
written out as the plain IR TileLang's own lowering builds (`PersistentFor`, src/ir.cc).

``for bx, by in T.Persistent([m_tiles, n_tiles], sm_num, block_id):`` - each of the `wave_size`
programs (`index` = its id, 0 .. wave_size - 1) walks the tiles of `domain` wave by wave: in wave
w it takes tile number ``t = w * wave_size + index``.  Tiles are numbered in groups of
`group_size` (g = max(1, min(group_size, last extent))) consecutive indices of the last
dimension: decomposing t over the grouped domain ``[ceildiv(last, g), domain[0], ...,
domain[-2], g]`` (last entry fastest) gives the group, the other coordinates and the position in
the group; the last coordinate is ``group * g + position``.  There are
``ceildiv(prod(grouped domain), wave_size)`` waves; a tile whose last coordinate falls past the
last extent (the padding of the last group, or past the final wave's end) is skipped.

IR: ``For(w, 0, waves)`` whose body binds the tile number and each coordinate (`Let`) and runs
the user's body under ``If(last coordinate < last extent)`` - ordinary statements every stage,
the interpreter and both backends already handle.
"""
from __future__ import annotations

from dataclasses import dataclass

from tritile.errors import CompileError
from tritile.frontend import exprs
from tritile.ir import nodes as ir


@dataclass
class PersistentSpec:
    """What `T.Persistent(...)` evaluates to: the iterator of a `for` statement."""

    domain: tuple  # int32 Exprs or ints
    wave_size: object
    index: object
    group_size: object


def persistent(p, a, loc):
    p.require_kernel("T.Persistent", loc)
    domain = a["domain"]
    if not isinstance(domain, (list, tuple)) or not domain:
        raise CompileError(f"T.Persistent: domain must be a non-empty list of tile counts, got {domain!r}", loc)
    group_size = 8 if a["group_size"] is None else a["group_size"]
    values = {"domain": [_int_scalar(p, d, "domain entry", loc) for d in domain],
              "wave_size": _int_scalar(p, a["wave_size"], "wave_size", loc),
              "index": _int_scalar(p, a["index"], "index", loc),
              "group_size": _int_scalar(p, group_size, "group_size", loc)}
    for name in ("wave_size", "group_size"):
        if isinstance(values[name], int) and values[name] < 1:
            raise CompileError(f"T.Persistent: {name} must be positive, got {values[name]}", loc)
    return PersistentSpec(tuple(values["domain"]), values["wave_size"], values["index"], values["group_size"])


def _int_scalar(p, value, what, loc):
    value = p.scalar(value, loc)
    if isinstance(value, ir.Const):
        value = value.value
    if isinstance(value, bool) or isinstance(value, float) or (isinstance(value, ir.Expr) and value.dtype.is_float):
        raise CompileError(f"T.Persistent: {what} must be an integer, got {value!r}", loc)
    return value if isinstance(value, int) else exprs.cast(value, "int32", loc)


def _product(values, loc):
    out = 1
    for v in values:
        out = exprs.binary("*", out, v, loc)
    return out


def emit_loop(p, spec: PersistentSpec, names: list, parse_body, loc):
    """Emit the wave loop of `for <names> in T.Persistent(...)`; `parse_body(bindings)` parses
    the `for` statement's body with `bindings` (name -> the tile's coordinate Var)."""
    if len(names) != len(spec.domain):
        raise CompileError(f"T.Persistent has a domain of {len(spec.domain)} dimensions but the loop binds "
                           f"{len(names)} names", loc)
    b = lambda op, x, y: exprs.binary(op, x, y, loc)  # noqa: E731 - folds Python ints, builds IR otherwise
    last = spec.domain[-1]
    group = b("max", 1, b("min", spec.group_size, last))
    grouped = [b("//", b("-", b("+", last, group), 1), group), *spec.domain[:-1], group]
    waves = b("//", b("-", b("+", _product(grouped, loc), spec.wave_size), 1), spec.wave_size)
    wave = ir.Var("w")
    tile = ir.Var("tile_id", ir.int32)
    lets = [ir.Let(tile, b("+", b("*", wave, spec.wave_size), spec.index), loc=loc)]
    # t decomposed over `grouped`, last entry fastest: coordinate i of the domain (i < last) is
    # entry i + 1, the last coordinate is group * g + position
    digits, rest = [], tile
    for extent in reversed(grouped[1:]):
        digits.insert(0, b("%", rest, extent))
        rest = b("//", rest, extent)
    coords = [*digits[:-1], b("+", b("*", rest, group), digits[-1])]
    coord_vars = [ir.Var(n, c.dtype) for n, c in zip(names, coords)]
    lets += [ir.Let(v, c, loc=loc) for v, c in zip(coord_vars, coords)]
    body = parse_body(dict(zip(names, coord_vars)))
    guarded = ir.If(b("<", coord_vars[-1], last), body, loc=loc)
    p.emit(ir.For(wave, ir.Const(0), exprs.cast(waves, "int32", loc), ir.Seq([*lets, guarded]), loc=loc))


HANDLERS = {"Persistent": persistent}
