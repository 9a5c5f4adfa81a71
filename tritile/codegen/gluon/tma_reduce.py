"""Tile atomics by TMA reduce (sm_90): `T.atomic_add(dQ[...], dq)` of a whole fragment becomes
one `cp.reduce.async.bulk.tensor ... .add` of the fragment staged in shared memory.

Why: an atomic per element from the registers (even 16 bytes wide, `red.global.add.v4.f32`)
goes through the SM's load/store pipe, and the warps that issue it wait for its operands to be
read before they may reuse the registers: in the FlashAttention backward at head dim 128 the
dQ atomics held 7.6 % of the consumers' stall samples at the next step's first instruction,
and converting the wgmma accumulator to the 16-byte layout cost a shared-memory round trip and
a CTA barrier more (ncu, bench/NOTES.md session 22).  A TMA reduce hands the whole tile to the
copy engine, as FlashAttention-3 does: the kernel ran 10 % faster (5.93 -> 5.31 ms at
4x32x4096x128).

Contract (`lower`, for an atomic `applies` takes: `instructions.uses_tma_reduce`, and a rank-3+
tensor's tile through a rows view it provably stays inside, or a tensor addressed at its full
rank): the fragment is cast to the destination's dtype and stored into a staging tile of shared
memory (NVMMA layout), fenced for the async proxy, and reduced into the global tile through a
descriptor like a TMA store's; the hardware drops the elements past the tensor's edges, as the
atomic's bounds test does.  The
staging tile of each (dtype, shape, layout) is allocated once for the whole kernel body
(`Emitter.body_prefix`), so no other buffer ever shares its bytes while a reduce still reads
them; before each write the statement waits until earlier bulk copies have read it
(`tma.store_wait(0)`: the reduce of the previous step drains under this step's work), and the
kernel waits once more at its end.  Relaxed, like the atomics it replaces: the sum is the same
set of additions in another order.

`TRITILE_TMA_REDUCE=0` keeps such atomics per element (an A/B switch).

Gluon 3.6 has no front-end for the reduce; its builder has the op (`create_async_tma_reduce`,
what `triton.language`'s `desc.atomic_add` lowers to), which `async_reduce_add` calls.
"""
from __future__ import annotations

import math

from triton._C.libtriton import ir as triton_ir
from triton.experimental.gluon.language._core import builtin

from tritile.codegen.gluon.emitter import GL_DTYPES
from tritile.ir import instructions as isel
from tritile.ir import layouts as lay
from tritile.ir import nodes as ir
from tritile.switches import schedule_switch

# the generated module's import of the builtin, added where a kernel uses it
IMPORT = "from tritile.codegen.gluon.tma_reduce import async_reduce_add\n"


@builtin
def async_reduce_add(tensor_desc, coord, src, _semantic=None):
    """``global[coord ...] += src`` by one TMA reduce (a bulk async group, waited on as TMA
    stores are: `tma.store_wait`)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(triton_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                              src.handle)


def applies(em, s: ir.AtomicAdd, shared_bytes: int) -> bool:
    """Does `lower` take atomic `s`: a tile atomic TMA can reduce, into a tensor addressed at its
    full rank or through a rows view its tile provably stays inside (`Emitter.rows_view`; where
    that is not proven the atomics stay per element, as before the full-rank descriptor was the
    rows view's fallback: a full-rank reduce of a tile leaving the tensor has not run on a GPU),
    and its staging tile allocated already or fitting beside the kernel's `shared_bytes` and the
    staging tiles allocated so far?"""
    if schedule_switch("TRITILE_TMA_REDUCE") == "off" or not isel.uses_tma_reduce(s, em.target) \
            or not (isel.tma_full_rank(s.dst.buffer) or em.rows_view(s.dst)):
        return False
    layout, nbytes = _staging(s.dst)
    return em.staged(_key(s.dst, layout)) or \
        shared_bytes + em.body_prefix_bytes() + nbytes <= em.target.shared_memory_limit


def _staging(dst: ir.Region) -> tuple:
    """(NVMMA layout, bytes) of the staging tile of a reduce into `dst`."""
    shape = list(dst.tile_shape)
    return lay.nvmma_default_for(shape, dst.buffer.dtype.bits), math.prod(shape) * dst.buffer.dtype.itemsize


def _key(dst: ir.Region, layout) -> tuple:
    """(dtype, shape, layout) of a staging tile: tiles of one key are one allocation."""
    return GL_DTYPES[dst.buffer.dtype.name], tuple(dst.tile_shape), str(layout)


def lower(em, s: ir.AtomicAdd, value: str) -> None:
    """Emit the staged TMA reduce of `value` (the fragment's register tile, already in the
    destination's dtype) into `s.dst`."""
    dst = s.dst
    layout, nbytes = _staging(dst)
    stage = em.body_staging(_key(dst, layout), em.layout_name(layout), nbytes)
    em.emit("tma.store_wait(0)")  # the previous reduce (or TMA store) has read the staging tile
    em.emit(f"{stage}.store({value})")
    em.emit("fence_async_shared()")  # generic-proxy smem writes before the async-proxy read
    desc, coords, block = em.descriptor(dst, layout)
    em.emit(f"async_reduce_add({desc}, [{coords}], {em.tma_view(stage, len(dst.tile_shape), block)})")
