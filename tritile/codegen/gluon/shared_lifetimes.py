"""Shared buffers allocated where tritile/ir/shared_lifetimes.py's plan puts them, so that
Triton can reuse the bytes of buffers that are never live together.

Contract: `plan(em, func)` records the plan's deferred allocations (`em.deferred_allocs`:
id(top-level statement) -> [buffers to allocate before it], `em.deferred_buffers`); `lower_alloc`
then emits nothing for such a buffer and `emit_before(em, stmt)` allocates it right before
that statement.  A warp-specialized kernel (its buffers are allocated before the fork) or a
persistent one (its buffers are hoisted above the tile loop) keeps every allocation on top.

Why reuse stays safe: Triton ends a buffer's lifetime at its last use in program order, but
an asynchronous wgmma goes on reading its shared operands until it is waited for.  Every
wgmma still in flight is therefore retired before a deferred allocation (TMA stores, the other
asynchronous reader, are waited for where they are issued in such kernels).  Asynchronous
copies (TMA, cp.async) go on writing theirs until waited for, and their buffer's last use is
the copy itself when nothing reads it: every copy of a pipelined loop is waited for by the
loop's drain, before any statement after it (rings.py turns the drain into a wait on the last
group a TMA ring left in flight; cp.async waits for all its groups), so neither a deferred
allocation nor a TMA-store staging tile placed over a ring's bytes receives a copy's data.
"""
from __future__ import annotations

from tritile.ir import nodes as ir
from tritile.ir.shared_lifetimes import lifetimes
from tritile.ir.transform import top_level


def plan(em, func: ir.PrimFunc):
    keep_on_top = em.partitions is not None or func.attrs.get("persistent_tile_loop") is not None
    top = top_level(func.kernel.body)
    for span in lifetimes(func.kernel.body, keep_on_top):
        if span.deferred:
            em.deferred_allocs.setdefault(id(top[span.first]), []).append(span.buffer)
            em.deferred_buffers.add(id(span.buffer))


def emit_before(em, stmt):
    """Before `stmt`: allocate the shared buffers it is the first to touch."""
    from tritile.codegen.gluon.rules import emit_shared_alloc

    buffers = em.deferred_allocs.get(id(stmt))
    if not buffers:
        return
    in_flight = sorted(em.tokens | em.inflight, key=em.name)
    if in_flight:  # their wgmmas may still read bytes the new buffers are given
        em.settle(in_flight)
    for buf in buffers:
        emit_shared_alloc(em, buf)
