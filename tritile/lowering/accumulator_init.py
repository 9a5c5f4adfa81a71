"""accumulator_init: a gemm overwrites its accumulator, and the accumulator's initial value is
applied after it.

Assumes: the frontend's IR (this pass runs first, before any pipelining).

Guarantees: in every statement list, an initialisation of a fragment ``C`` that a later
``T.gemm(.., C)`` of the same list accumulates into (whole ``C``, ``clear_accum=False``) -
``T.fill(C, v)`` / ``T.clear(C)``, or a ``T.Parallel`` over ``C``'s shape whose only store is
``C[lanes] = v`` - is removed, the gemm gets ``clear_accum=True`` and, unless ``v`` is zero,
a ``T.Parallel`` right after the gemm adds ``v``.  The addition is pushed into the branches of
``T.if_then_else`` and dropped where a branch adds zero, so a mask
``if_then_else(c, 0, -inf)`` becomes ``if_then_else(c, C[i, j], C[i, j] + -inf)``.
Taken only when ``v`` does not read ``C`` and the statements in between neither access ``C``
nor write what ``v`` reads.  Values: ``C = v + A B`` either way, the sum in the other order
(exact for a mask of zeros and infinities over finite products).

Why: causal attention initialises its scores with the mask before ``S += Q K^T``
(TileLang's example).  Built before the wgmma, the mask is live in registers while it issues;
under FlashAttention's deferred ``P V`` that made ptxas serialise every wgmma of the split
kernel (advisory C7511).  After the gemm the mask is a select in place on the scores, which
`uniform_selects` removes off the diagonal; a cleared accumulator also needs no zeros.
"""
from __future__ import annotations

import dataclasses

from tritile.ir import nodes as ir
from tritile.ir.transform import Transformer
from tritile.lowering.pipeline_injection import fold
from tritile.lowering.pipeline_planning import accesses


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    return dataclasses.replace(func, kernel=dataclasses.replace(func.kernel, body=_Lists().transform(func.kernel.body)))


class _Lists(Transformer):
    def visit_Seq(self, seq: ir.Seq):
        stmts, changed = list(seq.stmts), False
        while (rewritten := _first_rewrite(stmts)) is not None:
            stmts, changed = rewritten, True
        return dataclasses.replace(seq, stmts=stmts) if changed else seq


def _first_rewrite(stmts: list):
    """`stmts` with the first gemm whose initialisation may move past it rewritten, or None."""
    for g, gemm in enumerate(stmts):
        if not isinstance(gemm, ir.Gemm) or gemm.clear_accum or not _is_whole(gemm.c):
            continue
        acc = gemm.c.buffer
        if acc in (gemm.a.buffer, gemm.b.buffer):
            continue
        init = _initialisation(stmts, g, acc)
        if init is None:
            continue
        after = _bias_after(stmts[init], acc, gemm.loc)
        return (stmts[:init] + stmts[init + 1:g] + [dataclasses.replace(gemm, clear_accum=True)]
                + ([after] if after is not None else []) + stmts[g + 1:])
    return None


def _is_whole(region: ir.Region) -> bool:
    return (region.buffer.scope == "fragment" and tuple(region.extents) == tuple(region.buffer.shape)
            and all(isinstance(s, ir.Const) and s.value == 0 for s in region.starts))


def _initialisation(stmts: list, g: int, acc: ir.Buffer):
    """Index of the statement before `stmts[g]` that initialises all of `acc` and may move
    past the gemm, or None."""
    between_writes = set()
    for k in range(g - 1, -1, -1):
        stmt = stmts[k]
        if _initialises(stmt, acc):
            reads = {a.buffer for a in accesses(stmt.value if isinstance(stmt, ir.Fill) else stmt) if not a.write}
            return None if acc in reads or reads & between_writes else k
        touched = accesses(stmt)
        if any(a.buffer is acc for a in touched):
            return None
        between_writes |= {a.buffer for a in touched if a.write}
    return None


def _initialises(stmt, acc: ir.Buffer) -> bool:
    """Whether `stmt` writes every element of `acc` and nothing else: a whole fill, or a
    `T.Parallel` over its shape of `Let`s and one store ``acc[lanes] = value``."""
    if isinstance(stmt, ir.Fill):
        return stmt.dst.buffer is acc and _is_whole(stmt.dst)
    if not isinstance(stmt, ir.Parallel) or tuple(stmt.extents) != tuple(acc.shape) or not stmt.body.stmts:
        return False
    *lets, store = stmt.body.stmts
    return (all(isinstance(s, ir.Let) for s in lets) and isinstance(store, ir.Store) and store.buffer is acc
            and len(store.indices) == len(stmt.vars)
            and all(index is var for index, var in zip(store.indices, stmt.vars)))


def _bias_after(init, acc: ir.Buffer, loc) -> ir.Stmt | None:
    """The statement that adds `init`'s value to the gemm's result, or None when it adds zero."""
    if isinstance(init, ir.Fill):
        lanes = tuple(ir.Var(f"i{d}", ir.int32) for d in range(len(acc.shape)))
        lets, value = [], init.value
        parallel = ir.Parallel(lanes, tuple(acc.shape), ir.Seq([]), loc=init.loc)
    else:
        parallel, (*lets, store) = init, init.body.stmts
        lanes, value = init.vars, store.value
    current = ir.Load(acc, tuple(lanes), acc.dtype)
    added = _added(current, value)
    if added is current:
        return None
    store = ir.Store(acc, tuple(lanes), added, loc=loc)
    return dataclasses.replace(parallel, body=ir.Seq(list(lets) + [store]))


def _added(current: ir.Load, value):
    """``current + value`` with the addition pushed into selects and adding zero dropped."""
    if isinstance(value, ir.Call) and value.fn == "if_then_else":
        cond, then_value, else_value = value.args
        then_sum, else_sum = _added(current, then_value), _added(current, else_value)
        if then_sum is current and else_sum is current:
            return current
        return ir.Call("if_then_else", (cond, then_sum, else_sum), current.dtype)
    folded = fold(value)
    if isinstance(folded, ir.Const) and folded.value == 0:
        return current
    return ir.BinOp("+", current, ir.Cast(value, current.dtype) if value.dtype != current.dtype else value, current.dtype)
