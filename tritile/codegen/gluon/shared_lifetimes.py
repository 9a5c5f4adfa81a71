"""Shared buffers allocated where their lifetime starts, so that Triton can reuse their bytes.

Triton places `gl.allocate_shared_memory` values by liveness: two buffers share bytes when one's
last use comes before the other's allocation.  Allocating every `T.alloc_shared` at the top of
the kernel keeps them all live at once.  FlashAttention's epilogue tile `O_shared` and its
`Q_shared` are never live together; with 64x128 tiles at head dim 64 they took 82 KB a CTA
(two CTAs an SM), 74 KB when the epilogue reused Q's bytes (three), 375 -> 424 TFLOP/s on an
H100 (bench/results/d64_smem_whatif_h100.txt).

Contract: for a kernel that is neither warp specialized (its buffers are allocated before the
fork) nor persistent (its buffers are hoisted above the tile loop), `plan(em, func)` defers
each top-level shared `Alloc` to the first later top-level statement that touches its buffer
(`em.deferred_allocs`: id(statement) -> [buffers]); `lower_alloc` then emits nothing for it and
`emit_before(em, stmt)` allocates it right before that statement.  A buffer no statement
touches keeps its place.

Gemm operands are the exception: they are all allocated before the kernel's first statement,
so that no two of them share bytes.  On the H100 a wgmma read wrong values from a 64-byte
swizzled operand tile placed over the bytes of an earlier loop's 128-byte swizzled operand
(pipeline replay program 1056: a 1-stage GEMM loop, then a 2-stage one; 94 % of the outputs
wrong, every fence and barrier tried left it wrong, operands that did not share bytes were
right).  The shared-memory budget counts every buffer anyway.

Why reuse stays safe: Triton ends a buffer's lifetime at its last use in program order, but
an asynchronous wgmma goes on reading its shared operands until it is waited for.  Every
wgmma still in flight is therefore retired before a deferred allocation (TMA stores, the other
asynchronous reader, are waited for where they are issued in such kernels; asynchronous copies
write buffers that are read later, so those stay live).
"""
from __future__ import annotations

from tritile.ir import nodes as ir
from tritile.ir.transform import top_level, touches, walk


def plan(em, func: ir.PrimFunc):
    if em.partitions is not None or func.attrs.get("persistent_tile_loop") is not None:
        return
    top = top_level(func.kernel.body)
    operands = gemm_operands(func.kernel.body)
    for at, stmt in enumerate(top):
        if not (isinstance(stmt, ir.Alloc) and stmt.buffer.scope == "shared"):
            continue
        buf = stmt.buffer
        if id(buf) in operands:
            first_use = top[0]
        else:
            first_use = next((s for s in top[at + 1:] if not isinstance(s, ir.Alloc) and touches(s, buf)), None)
        if first_use is not None:
            em.deferred_allocs.setdefault(id(first_use), []).append(buf)
            em.deferred_buffers.add(id(buf))


def gemm_operands(body) -> set:
    """ids of the shared buffers that some `T.gemm` in `body` reads."""
    return {id(region.buffer) for g in walk(body) if isinstance(g, ir.Gemm)
            for region in (g.a, g.b) if region.buffer.scope == "shared"}


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
