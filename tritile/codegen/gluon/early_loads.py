"""Early loads: a CTA's one-time tile loads issued as TMA copies and waited for at first use.

A synchronous ``T.copy(global -> shared)`` at the top level of a kernel that is neither warp
specialized nor persistent runs once per CTA.  Lowered as a masked load and a shared store,
it holds every thread until its data arrived, before anything after it can start -
FlashAttention's Q tile, ahead of the K/V loop's first TMA copies.  When TMA can serve it
(`instructions.uses_tma`), the copy is issued on an mbarrier of its own where it stands,
and the threads wait for it right before the first top-level statement that touches the
buffer, so its latency overlaps whatever comes between (the loop's first copies).  Measured
bound on an H100 (bench/NOTES.md, session 12): removing the Q load altogether made the head
dim 64 kernel 4.7 % (causal 6.2 %) faster.

The copy qualifies when its buffer is not referenced before it (no read may still be in
flight when TMA writes) and is referenced after it (the wait has a place); the barrier is
initialised at the copy and invalidated after the wait (its shared memory may be reused).
Warp-specialized kernels hand such copies to their producer instead (tile loads,
`warp_specialize.py`).
"""
from __future__ import annotations

from tritile.ir import instructions as isel
from tritile.codegen.gluon import rings
from tritile.ir import nodes as ir
from tritile.ir.transform import top_level, touches


def plan(em, func: ir.PrimFunc):
    """Fill `em.early_loads` (id(copy) -> barrier name) and `em.early_load_waits`
    (id(first statement using the buffer) -> [copy])."""
    if em.partitions is not None or func.attrs.get("persistent_tile_loop") is not None or not em.target.has_tma:
        return
    top = top_level(func.kernel.body)
    for at, copy in enumerate(top):
        if not (isinstance(copy, ir.Copy) and copy.src.buffer.scope == "global"
                and copy.dst.buffer.scope == "shared" and isel.uses_tma(copy, em.target)):
            continue
        buf = copy.dst.buffer
        if any(touches(s, buf) for s in top[:at] if not isinstance(s, ir.Alloc)):
            continue
        first_use = next((s for s in top[at + 1:] if touches(s, buf)), None)
        if first_use is None:
            continue
        em.early_loads[id(copy)] = em.fresh(f"{em.name(buf)}_loaded")
        em.early_load_waits.setdefault(id(first_use), []).append(copy)


def emit_issue(em, copy: ir.Copy):
    """Where the copy stood: its barrier, the expected bytes and the TMA copy."""
    bar = f"{em.early_loads[id(copy)]}.index(0)"
    em.emit(f"{em.early_loads[id(copy)]} = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())")
    em.emit(f"mbarrier.init({bar}, count=1)")
    em.emit(f"mbarrier.expect({bar}, {rings.tile_bytes(copy)})")
    desc, coords, block = em.descriptor(copy.src, em.buffer_layout(copy.dst.buffer))
    em.emit(f"tma.async_copy_global_to_shared({desc}, [{coords}], {bar}, {em.tma_shared_view(copy.dst, copy.loc, block)})")


def emit_waits(em, stmt):
    """Before `stmt`: wait for the early loads it is the first to use."""
    for copy in em.early_load_waits.get(id(stmt), ()):
        bar = f"{em.early_loads[id(copy)]}.index(0)"
        em.emit(f"mbarrier.wait({bar}, 0)")
        em.emit(f"mbarrier.invalidate({bar})")
