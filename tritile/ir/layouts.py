"""Layout encodings attached to on-chip buffers (`Buffer.layout`) by layout inference.

Each class is a plain frozen dataclass mirroring one Gluon (Triton 3.6) layout class with
the same field names; `str(layout)` is the Gluon constructor call (``gl.BlockedLayout(...)``)
that the code generator pastes into the kernel source, so what the IR printer shows is
exactly what the kernel uses.  Nothing here imports Triton: the IR stays backend-free.

Helpers at the bottom compute the encodings the way Gluon/Triton do (`nvmma_default_for`
follows `NVMMASharedLayout.get_default_for`, `wgmma_accumulator` the Hopper tutorial's
instruction-shape rule) so layout inference and codegen share one definition.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


def _list(values) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


# --------------------------------------------------------------------------------------
# shared-memory encodings
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NVMMASharedLayout:
    """Tensor-core / TMA shared layout; `transposed` = MN-major storage of the 2-D tile."""

    swizzle_byte_width: int
    element_bitwidth: int
    rank: int = 2
    transposed: bool = False

    def __str__(self) -> str:
        return (f"gl.NVMMASharedLayout(swizzle_byte_width={self.swizzle_byte_width}, "
                f"element_bitwidth={self.element_bitwidth}, rank={self.rank}, transposed={self.transposed})")


@dataclass(frozen=True)
class SwizzledSharedLayout:
    vec: int
    per_phase: int
    max_phase: int
    order: tuple

    def __str__(self) -> str:
        return (f"gl.SwizzledSharedLayout(vec={self.vec}, per_phase={self.per_phase}, "
                f"max_phase={self.max_phase}, order={_list(self.order)})")


# --------------------------------------------------------------------------------------
# register (distributed) encodings
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockedLayout:
    size_per_thread: tuple
    threads_per_warp: tuple
    warps_per_cta: tuple
    order: tuple

    @property
    def rank(self) -> int:
        return len(self.order)

    def __str__(self) -> str:
        return (f"gl.BlockedLayout(size_per_thread={_list(self.size_per_thread)}, "
                f"threads_per_warp={_list(self.threads_per_warp)}, "
                f"warps_per_cta={_list(self.warps_per_cta)}, order={_list(self.order)})")


@dataclass(frozen=True)
class NVMMADistributedLayout:
    """Tensor-core accumulator: version (2, 0) = mma.sync (sm_80), (3, 0) = wgmma (sm_90)."""

    version: tuple
    warps_per_cta: tuple
    instr_shape: tuple

    rank = 2

    def __str__(self) -> str:
        return (f"gl.NVMMADistributedLayout(version={_list(self.version)}, "
                f"warps_per_cta={_list(self.warps_per_cta)}, instr_shape={_list(self.instr_shape)})")


@dataclass(frozen=True)
class DotOperandLayout:
    operand_index: int
    parent: object
    k_width: int

    rank = 2

    def __str__(self) -> str:
        return (f"gl.DotOperandLayout(operand_index={self.operand_index}, parent={self.parent}, "
                f"k_width={self.k_width})")


@dataclass(frozen=True)
class SliceLayout:
    """`parent` with dimension `dim` removed (reduction results, broadcast operands)."""

    dim: int
    parent: object

    @property
    def rank(self) -> int:
        return self.parent.rank - 1

    def __str__(self) -> str:
        return f"gl.SliceLayout({self.dim}, {self.parent})"


SHARED_LAYOUTS = (NVMMASharedLayout, SwizzledSharedLayout)
DISTRIBUTED_LAYOUTS = (BlockedLayout, NVMMADistributedLayout, DotOperandLayout, SliceLayout)


# --------------------------------------------------------------------------------------
# constructors shared by layout inference and codegen
# --------------------------------------------------------------------------------------


def nvmma_default_for(tile_shape, bitwidth: int, transposed: bool = False) -> NVMMASharedLayout:
    """`gl.NVMMASharedLayout.get_default_for`: the widest swizzle (128/64/32/0 bytes) that
    the tile's contiguous dimension fills; 0 when the outer dims hold fewer than 8 rows."""
    shape = list(tile_shape)
    if transposed:
        shape = shape[1:] + shape[:1]
    contig_bytes = shape[-1] * bitwidth // 8
    outer = 1
    for s in shape[:-1]:
        outer *= s
    swizzle = 0
    for width in (128, 64, 32):
        if contig_bytes >= width and contig_bytes % width == 0:
            swizzle = width
            break
    if len(shape) < 2 or outer < 8:
        swizzle = 0
    return NVMMASharedLayout(swizzle, bitwidth, len(shape), transposed)


def swizzled_for_mma(tile_shape, bitwidth: int) -> SwizzledSharedLayout:
    """Bank-conflict-avoiding layout for mma.sync operands read with ldmatrix (Triton's
    classic rule: 16-byte vectors, phases spread over 128-byte rows)."""
    elem_bytes = max(1, bitwidth // 8)
    inner = tile_shape[-1]
    vec = max(1, min(16 // elem_bytes, inner))
    per_phase = max(1, 128 // (inner * elem_bytes))
    max_phase = max(1, min(8 // per_phase, inner // vec))
    order = tuple(reversed(range(len(tile_shape))))
    return SwizzledSharedLayout(vec, per_phase, max_phase, order)


def plain_shared(rank: int) -> SwizzledSharedLayout:
    return SwizzledSharedLayout(1, 1, 1, tuple(reversed(range(rank))))


def _pow2_floor(x: int) -> int:
    p = 1
    while p * 2 <= x:
        p *= 2
    return p


def blocked_for(tile_shape, bitwidth: int, num_warps: int) -> BlockedLayout:
    """Coalesced register layout: 16-byte vectors along the last dim, a warp's lanes
    covering contiguous rows first, warps stacked along the outer dims as far as their extent
    goes, the warps left over along the last dim (a [1, 8192] row split over every warp, not
    copied into each), and only what no dim has room for replicated on dim 0."""
    rank = len(tile_shape)
    inner = tile_shape[-1]
    vec = _pow2_floor(max(1, min(128 // max(bitwidth, 8), inner)))
    lanes_inner = _pow2_floor(max(1, min(32, inner // vec)))
    size = [1] * rank
    size[-1] = vec
    tpw = [1] * rank
    tpw[-1] = lanes_inner
    tpw[0] *= 32 // lanes_inner  # rank 1: all lanes on the single dim
    warps = [1] * rank
    left = num_warps
    for dim in range(rank):  # outer dims first, each up to the groups of rows it has
        room = _pow2_floor(max(1, tile_shape[dim] // (size[dim] * tpw[dim])))
        warps[dim] = min(left, room)
        left //= warps[dim]
    warps[0] *= left  # more warps than the tile has room for: replicated, as before
    return BlockedLayout(tuple(size), tuple(tpw), tuple(warps), tuple(reversed(range(rank))))


def wgmma_accumulator(m: int, n: int, num_warps: int, policy: str, bitwidth: int) -> Optional[NVMMADistributedLayout]:
    """The wgmma accumulator layout for an M×N tile, or None when wgmma cannot cover it
    (fewer than 4 warps, M not a multiple of 64 per warpgroup column, N not a multiple of 8)."""
    if num_warps % 4 or n % 8 or m % 64:
        return None
    groups = num_warps // 4
    if policy == "FullCol":
        warps = [4, num_warps // 4]
    elif policy == "FullRow":
        warps = [num_warps, 1]
    else:  # Square: M first while the tile has rows left (tutorial 05's rule), by prime factors
        warps = [4, 1]  # so that three warpgroups (12 warps) grow by 3, not past 12 by doubling
        while warps[0] * warps[1] < num_warps:
            left = num_warps // (warps[0] * warps[1])
            factor = next(f for f in range(2, left + 1) if left % f == 0)
            if m > 16 * warps[0]:
                warps[0] *= factor
            else:
                warps[1] *= factor
    if m % (16 * warps[0]) or n % (8 * warps[1]):
        return None
    n_reps = -(-num_warps // -(-m // 16))
    max_n = max(n // max(n_reps, 1), 8)
    instr_n = 256
    while instr_n > max_n or n % instr_n:
        instr_n -= 8
    if instr_n < 8 or groups < 1:
        return None
    return NVMMADistributedLayout((3, 0), tuple(warps), (16, instr_n, 256 // bitwidth))


def mma_v2_accumulator(m: int, n: int, num_warps: int, policy: str) -> Optional[NVMMADistributedLayout]:
    """The mma.sync (m16n8) accumulator layout for an M×N tile, or None if M/N are not
    multiples of the 16×8 instruction."""
    if m % 16 or n % 8:
        return None
    wm, wn = 1, 1
    while wm * wn < num_warps:
        rows, cols = m // (16 * wm), n // (8 * wn)
        grow_m = {"FullRow": True, "FullCol": False}.get(policy, rows * 16 >= cols * 8)
        if grow_m and rows >= 2 and rows % 2 == 0:
            wm *= 2
        elif cols >= 2 and cols % 2 == 0:
            wn *= 2
        elif rows >= 2 and rows % 2 == 0:
            wm *= 2
        else:
            wm *= 2  # more warps than tiles: Gluon replicates, still correct
    return NVMMADistributedLayout((2, 0), (wm, wn), (16, 8))


def dot_operand(index: int, parent, bitwidth: int) -> DotOperandLayout:
    return DotOperandLayout(index, parent, max(1, 32 // bitwidth))


def fma_operand_elements_per_thread(operand: DotOperandLayout, shape) -> int:
    """Elements each thread holds of an FMA dot operand of `shape` ((M, K) for A, (K, N) for
    B) in `operand`, a DotOperandLayout of a BlockedLayout accumulator: every thread keeps
    the whole K extent of each of its accumulator's rows (A) or columns (B), so the operand is
    copied into every thread of the other dim - a 64x128 A on 4 warps of [1, 32] lanes is
    2048 registers a thread."""
    parent = operand.parent
    dim = 0 if operand.operand_index == 0 else 1  # the accumulator dim the operand shares
    extent = shape[0] if operand.operand_index == 0 else shape[1]
    k = shape[1] if operand.operand_index == 0 else shape[0]
    covered = parent.size_per_thread[dim] * parent.threads_per_warp[dim] * parent.warps_per_cta[dim]
    return parent.size_per_thread[dim] * max(1, -(-extent // covered)) * k


def slice_of(layout, dim: int) -> SliceLayout:
    return SliceLayout(dim, layout)
