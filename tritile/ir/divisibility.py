"""Runtime integers specialised on divisibility, as Triton specialises integer arguments.

Triton compiles each integer kernel argument that is a multiple of 16 at launch with the
`tt.divisibility = 16` attribute, and its analyses then prove row pitches aligned and masks
constant over vectors.  tritile does the same at the tile-IR level, before the pass list: a
program with runtime integers - its `T.dynamic` dims and its integer scalar parameters
(`valid_len: T.int32`; not bools or floats), `specialized_vars(func)` - is compiled once per
*divisibility key* - one bool per such Var, "this value is a positive multiple of `DIVISOR`" -
and the key's program is `specialize(func, key)`: every divisible Var replaced, everywhere
(buffer shapes and strides, grid, body, `dynamic_vars`, `scalar_params`, `dim_bindings`,
`stride_bindings`), by a new Var
carrying ``multiple_of=DIVISOR`` (the printer shows it, so each variant's IR text, and with it
every compile cache key, is its own).  Instruction selection (`tritile.ir.instructions`) then
proves e.g. ``K * 2`` bytes a multiple of 16 and takes TMA or cp.async for a `T.dynamic` last
dim, and the code generators pass `tt.divisibility` for those arguments
(`tritile.codegen.arg_attrs`): a scalar bound of a masked loop (``i < valid_len``) then lets
Triton vectorise the mask, as its own launcher would.  Nothing else changes: values are not
assumed multiples of any tile, so edge tiles stay masked (TMA clips them).

`key(key_vars, values)` is the key of a call's values (`ArgumentBinder` computes it per call);
`key_of_sizes(func, sizes)` the key of values given by name (`get_source(stage, dims=...)`).
"""
from __future__ import annotations

import dataclasses

from tritile.ir import nodes as ir
from tritile.ir.transform import substitute_buffers, substitute_vars, walk

DIVISOR = 16  # Triton's tt.divisibility for integer arguments: 16 bytes of 1-byte elements


def divisible(value: int) -> bool:
    """Does a dim of size `value` take the divisible variant: a positive multiple of DIVISOR.
    Not 0: a TMA descriptor cannot describe an empty dimension (a size of 0 takes the variant
    that assumes nothing, whose masks handle it)."""
    return value > 0 and value % DIVISOR == 0


def specialized_vars(func: ir.PrimFunc) -> list:
    """The Vars a key has a bool for, in order: the `T.dynamic` dims, then the integer scalar
    parameters (the kernel arguments Triton would specialise)."""
    return [*func.dynamic_vars, *(v for v in func.scalar_vars if v.dtype.is_int)]


def key(key_vars: list, values: dict) -> tuple:
    """One bool per Var of `key_vars`: is its value in `values` `divisible`."""
    return tuple([divisible(values[v]) for v in key_vars])


def key_of_sizes(func: ir.PrimFunc, sizes: dict) -> tuple:
    """The key of `sizes` ({T.dynamic dim or integer scalar parameter name: int}); a Var not
    named is taken as not divisible.  A name that is no such Var of `func` raises ValueError,
    a non-int value TypeError."""
    key_vars = specialized_vars(func)
    names = {v.name for v in key_vars}
    for name, value in sizes.items():
        if name not in names:
            raise ValueError(f"dims: {name!r} is not a T.dynamic dimension or integer scalar parameter of "
                             f"{func.name} (it has {', '.join(sorted(names)) or 'none'})")
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"dims[{name!r}] must be an int, got {value!r}")
    return tuple([v.name in sizes and divisible(sizes[v.name]) for v in key_vars])


def specialize(func: ir.PrimFunc, divisible: tuple) -> tuple:
    """(one-kernel `func` with the Vars `divisible` flags (`specialized_vars` order) replaced by
    Vars known to be multiples of DIVISOR, {old Var: new Var}); `func` itself and {} when none
    is flagged."""
    renamed = {v: ir.Var(v.name, v.dtype, multiple_of=DIVISOR)
               for v, flag in zip(specialized_vars(func), divisible) if flag}
    if not renamed:
        return func, {}
    buffers = {}
    for buf in [*func.params, *(getattr(n, "buffer", None) for n in walk(func.kernel.body))]:
        if isinstance(buf, ir.Buffer) and buf not in buffers and any(_mentions(d, renamed) for d in
                                                                     (*buf.shape, *(buf.strides or ()))):
            shape = tuple(substitute_vars(d, renamed) if isinstance(d, ir.Expr) else d for d in buf.shape)
            strides = None if buf.strides is None else tuple(
                substitute_vars(d, renamed) if isinstance(d, ir.Expr) else d for d in buf.strides)
            buffers[buf] = dataclasses.replace(buf, shape=shape, strides=strides)
    out = substitute_vars(substitute_buffers(func, buffers), renamed)
    return dataclasses.replace(out, dim_bindings={renamed.get(v, v): where for v, where in func.dim_bindings.items()},
                               stride_bindings={renamed.get(v, v): where
                                                for v, where in func.stride_bindings.items()}), renamed


def _mentions(dim, renamed: dict) -> bool:
    return isinstance(dim, ir.Expr) and any(n in renamed for n in walk(dim) if isinstance(n, ir.Var))
