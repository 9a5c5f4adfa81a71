"""Explicit warp specialization: `T.alloc_barrier`, `T.barrier_arrive`, `T.barrier_wait`,
`T.tma_copy` and `with T.ws(*groups):` lowered to tile IR (`ir.AllocBarrier`,
`ir.BarrierArrive`, `ir.BarrierWait`, `ir.Copy`, `ir.WarpGroups`).

Contract: a barrier operand is a barrier buffer (its mbarrier 0) or one element of it
(`mbars[i]`); parities are 0 / 1 int expressions; `T.ws` groups are distinct warp groups
(128 threads each) that exist in the kernel's thread count.  `T.tma_copy(src, dst, barrier=b)`
is a copy whose completion the program synchronises through `b` (the interpreter performs it
at once; its bytes are not counted against the barrier's arrivals).  Violations are
`CompileError`s at the call.
"""
from __future__ import annotations

from dataclasses import dataclass

from tritile.errors import CompileError
from tritile.frontend import access as acc
from tritile.frontend import builtins
from tritile.frontend import exprs
from tritile.ir import nodes as ir
from tritile.ir.dtypes import uint64


@dataclass
class WarpGroupSpec:
    """What `T.ws(*groups)` evaluates to: the context manager of a `with` statement."""

    groups: tuple


def alloc_barrier(p, a, loc):
    p.require_kernel("T.alloc_barrier", loc)
    counts = a["arrive_count"]
    counts = list(counts) if isinstance(counts, (list, tuple)) else [counts]
    values = []
    for c in counts:
        c = c.value if isinstance(c, ir.Const) else c
        if not isinstance(c, int) or isinstance(c, bool) or c < 1:
            raise CompileError(f"T.alloc_barrier: arrive_count must be positive compile-time integers, got {c!r}",
                               loc)
        values.append(c)
    if not values:
        raise CompileError("T.alloc_barrier: arrive_count is an empty list", loc)
    buf = p.new_buffer((len(values),), uint64, "barrier", loc)
    p.emit(ir.AllocBarrier(buf, tuple(values), loc=loc))
    return buf


def _barrier(value, what, loc) -> tuple:
    """(barrier buffer, index Expr) of a barrier operand."""
    if isinstance(value, ir.Buffer) and value.scope == "barrier":
        return value, ir.Const(0)
    if isinstance(value, acc.BufferAccess) and value.buffer.scope == "barrier" and value.is_point:
        return value.buffer, acc.element_indices(value)[0]
    raise CompileError(f"{what}: expected a barrier from T.alloc_barrier (or one element of it), got {value!r}", loc)


def barrier_arrive(p, a, loc):
    p.require_kernel("T.barrier_arrive", loc)
    buf, index = _barrier(a["mbarrier"], "T.barrier_arrive", loc)
    p.emit(ir.BarrierArrive(buf, index, loc=loc))


def barrier_wait(p, a, loc):
    p.require_kernel("T.barrier_wait", loc)
    buf, index = _barrier(a["mbarrier"], "T.barrier_wait", loc)
    parity = p.scalar(a["parity"], loc)
    if isinstance(parity, (int, ir.Const)):
        value = parity.value if isinstance(parity, ir.Const) else parity
        if value not in (0, 1) or isinstance(value, (bool, float)):
            raise CompileError(f"T.barrier_wait: parity must be 0 or 1, got {value!r}", loc)
        parity = ir.Const(value)
    elif parity.dtype.is_float:
        raise CompileError(f"T.barrier_wait: parity must be an integer, got type {parity.dtype}", loc)
    p.emit(ir.BarrierWait(buf, index, exprs.cast(parity, ir.int32, loc), loc=loc))


def mbarrier_arrive(p, a, loc):
    """TileLang's `T.mbarrier_arrive(mbarrier)`: `T.barrier_arrive`; a cluster barrier's peer CTA
    (`cta_id=`) is not modelled."""
    if a["cta_id"] is not None:
        raise CompileError("T.mbarrier_arrive: cta_id= (arriving at a peer CTA's cluster barrier) is not supported", loc)
    barrier_arrive(p, a, loc)


def tma_copy(p, a, loc):
    p.require_kernel("T.tma_copy", loc)
    src = a["src"].buffer if isinstance(a["src"], acc.BufferAccess) else a["src"]
    if a["barrier"] is None and getattr(src, "scope", None) == "global":
        raise CompileError("T.tma_copy: a load from global memory needs barrier=... (from T.alloc_barrier)", loc)
    if a["barrier"] is not None:
        _barrier(a["barrier"], "T.tma_copy barrier", loc)
    return builtins.copy(p, {"src": a["src"], "dst": a["dst"]}, loc)  # the data movement is T.copy's


def ws(p, a, loc):
    p.require_kernel("T.ws", loc)
    groups = []
    for g in a["warp_group_idx"]:
        g = g.value if isinstance(g, ir.Const) else g
        if not isinstance(g, int) or isinstance(g, bool) or g < 0:
            raise CompileError(f"T.ws: warp group indices must be non-negative compile-time integers, got {g!r}", loc)
        if (g + 1) * ir.WARP_GROUP_THREADS > p.kernel_threads:
            raise CompileError(f"T.ws({g}): the kernel's {p.kernel_threads} threads have no warp group {g} "
                               f"({ir.WARP_GROUP_THREADS} threads each)", loc)
        groups.append(g)
    if not groups or len(set(groups)) != len(groups):
        raise CompileError(f"T.ws: give one or more distinct warp groups, got {groups}", loc)
    return WarpGroupSpec(tuple(groups))


HANDLERS = {"alloc_barrier": alloc_barrier, "barrier_arrive": barrier_arrive, "barrier_wait": barrier_wait,
            "mbarrier_arrive": mbarrier_arrive, "mbarrier_wait_parity": barrier_wait, "tma_copy": tma_copy, "ws": ws}
