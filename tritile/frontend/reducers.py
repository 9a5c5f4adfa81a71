"""TileLang's reducers (`T.alloc_reducer`) as tile reductions.

A reducer is a fragment that a `T.Parallel` loop updates with ``r[i] = r[i] + x[i, j]``
(``T.max(r[i], ...)``, ``T.min``, or `T.reducer_update(r[i], x)`) while the index leaves one
of the loop's variables out: every point of that variable contributes to the same element.
`expand` rewrites such a loop so that each lane writes its own contribution into a partial
fragment of the loop's shape (filled with the combine's identity first, so lanes an `if`
leaves out contribute nothing), and after the loop one `Reduce` (clear=False) folds the
partials along the missing variable into the reducer - the values TileLang computes, in tile
operations every backend has.  `T.finalize_reducer` then has nothing left to combine.

Contract: `expand(p, loop)` returns the statements replacing the `Parallel` `loop` (the loop
itself when it updates no reducer).  A reducer read other than in its update, an update with
the wrong combine for the reducer's op, an index that is not the loop's variables with exactly
one left out (in order), or an update under a nested loop is a CompileError at the update.
"""
from __future__ import annotations

import math

from tritile.errors import CompileError
from tritile.frontend import exprs
from tritile.ir import nodes as ir
from tritile.ir.transform import walk

OPS = {"sum": "+", "max": "max", "min": "min", "bitand": "&", "bitor": "|", "bitxor": "^"}  # op -> its combine


def identity(op: str, dtype) -> ir.Const:
    """The value a reduction of `op` starts from (sum, bitor, bitxor 0; bitand all bits set; max
    the lowest value, min the highest)."""
    if op in ("sum", "bitor", "bitxor"):
        return exprs.make_const(0, dtype)
    if op == "bitand":
        return exprs.make_const(-1 if dtype.kind == "int" else (1 << dtype.bits) - 1, dtype)
    if dtype.is_float and dtype.bits >= 16:
        return exprs.make_const(-math.inf if op == "max" else math.inf, dtype)
    return dtype.min if op == "max" else dtype.max


def update_value(op: str, reducer: ir.Buffer, indices: tuple, value, loc) -> ir.Expr:
    """``reducer[indices] combine value`` as the frontend would build ``r[i] = r[i] + value``."""
    current = ir.Load(reducer, indices, reducer.dtype)
    return exprs.cast(exprs.binary(OPS[op], current, exprs.cast(value, reducer.dtype, loc), loc), reducer.dtype, loc)


def _strip_cast(e, dtype=None):
    return e.value if isinstance(e, ir.Cast) and (dtype is None or e.dtype == dtype) else e


def _contribution(store: ir.Store, op: str):
    """The contributed value of an update ``r[idx] = r[idx] combine c`` (None if `store` is not one)."""
    value = _strip_cast(store.value, store.buffer.dtype)
    if not isinstance(value, ir.BinOp) or value.op != OPS[op]:
        return None
    for mine, other in ((value.lhs, value.rhs), (value.rhs, value.lhs)):
        load = _strip_cast(mine)
        if isinstance(load, ir.Load) and load.buffer is store.buffer and load.indices == store.indices:
            return other
    return None


def expand(p, loop: ir.Parallel) -> list:
    reducers = p.reducers
    if not any(isinstance(n, ir.Store) and n.buffer in reducers for n in walk(loop.body)):
        return [loop]
    partials = {}  # reducer -> (partial buffer, reduced dim)

    def partial_of(store: ir.Store):
        reducer, op = store.buffer, reducers[store.buffer]
        kept = [k for k, v in enumerate(loop.vars) if any(i is v for i in store.indices)]
        expected = tuple(loop.vars[k] for k in kept)
        scalar = not kept and all(isinstance(i, ir.Const) and i.value == 0 for i in store.indices) and \
            all(d == 1 for d in reducer.shape)
        if not scalar and (len(store.indices) != len(expected) or any(a is not b for a, b in zip(store.indices, expected))
                           or tuple(reducer.shape) != tuple(loop.extents[k] for k in kept)):
            raise CompileError(f"reducer {reducer.name} must be indexed by the T.Parallel variables with one left out, "
                               f"in order, and have their extents as its shape", store.loc)
        if len(loop.vars) - len(kept) != 1:
            raise CompileError(f"the update of reducer {reducer.name} leaves {len(loop.vars) - len(kept)} T.Parallel "
                               f"variables out; tritile reduces over exactly one", store.loc)
        if reducer not in partials:
            buf = ir.Buffer(p.unique_name(f"{reducer.name}_partial"), tuple(loop.extents), reducer.dtype, "fragment",
                            loc=store.loc)
            partials[reducer] = (buf, next(k for k in range(len(loop.vars)) if k not in kept))
        return partials[reducer][0]

    def rewrite(seq: ir.Seq) -> ir.Seq:
        out = []
        for s in seq.stmts:
            if isinstance(s, ir.Store) and s.buffer in reducers:
                op = reducers[s.buffer]
                contribution = _contribution(s, op)
                if contribution is None:
                    raise CompileError(f"reducer {s.buffer.name} (op={op!r}) is updated only as "
                                       f"`r[i] = r[i] {OPS[op]} value` / T.reducer_update inside T.Parallel", s.loc)
                _no_reads(contribution, reducers, s.loc)
                partial = partial_of(s)
                out.append(ir.Store(partial, tuple(loop.vars), update_value(op, partial, tuple(loop.vars),
                                                                              contribution, s.loc), loc=s.loc))
            elif isinstance(s, ir.If):
                _no_reads(s.cond, reducers, s.loc)
                out.append(ir.If(s.cond, rewrite(s.then_body), s.else_body and rewrite(s.else_body), loc=s.loc))
            elif isinstance(s, ir.Seq):
                out.append(rewrite(s))
            else:
                if any(isinstance(n, ir.Store) and n.buffer in reducers for n in walk(s)):
                    raise CompileError("a reducer update inside a loop nested in T.Parallel is not supported", s.loc)
                _no_reads(s, reducers, s.loc)
                out.append(s)
        return ir.Seq(out)

    body = rewrite(loop.body)
    before, after = [], []
    for reducer, (partial, dim) in partials.items():
        op = reducers[reducer]
        before += [ir.Alloc(partial, loc=loop.loc),
                   ir.Fill(ir.Region.full(partial), identity(op, partial.dtype), loc=loop.loc)]
        after.append(ir.Reduce(op, ir.Region.full(partial), ir.Region.full(reducer), dim, clear=False, loc=loop.loc))
    return before + [ir.Parallel(loop.vars, loop.extents, body, loc=loop.loc)] + after


def _no_reads(node, reducers, loc):
    for n in walk(node):
        if isinstance(n, ir.Load) and n.buffer in reducers:
            raise CompileError(f"reducer {n.buffer.name} is read inside the T.Parallel loop that updates reducers; "
                               f"read it after the loop (T.finalize_reducer)", loc)
