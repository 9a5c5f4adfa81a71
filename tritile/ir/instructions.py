"""Instruction selection for NVIDIA targets: which hardware path a tile op takes.

Layout inference and warp specialization (which must give each buffer the encoding, and each
copy the producer, its instruction needs) and the Gluon emitter (which must emit that
instruction) all ask these functions, so they can never disagree; it lives beside the IR's
layouts because the target-independent passes may not import a backend.  Every function is a pure function of the IR node, the target and the warp
count - but `tma_rows_view`, the addressing of a tile that already takes TMA, which the code
generator asks with its static bounds of the variables (layouts and plans do not depend on it).

Paths:
* `gemm_engine`: "wgmma" (sm_90, 16/8-bit inputs, B in shared, M a multiple of 64),
  "mma_v2" (mma.sync m16n8, sm_80+, 16/8-bit inputs), or "fma" (everything else, notably
  float32 inputs: we use exact FP32 FMA instead of TF32 tensor cores, so float32 GEMMs match
  torch's float32 matmul at 1e-4; a `Gemm(tf32=True)` - TileLang's `T.tfloat32` operands -
  takes mma.sync's TF32 path).
* `uses_tma`: a global->shared copy that a TMA descriptor can serve (sm_90, rank-2 tile
  equal to one whole buffer version, same dtype, a row pitch provably a multiple of 16
  bytes: static, or a `T.dynamic` dim specialised on divisibility, `ir/divisibility.py`); a
  tile of a rank-3/4 tensor (attention's [B, H, S, D]) in the shape of its 2-D rows view
  where a descriptor of the tensor's full rank could serve it too (`full_rank_describes`):
  the rows view where the tile provably stays inside its own rows (`tma_rows_view`), else the
  full rank; a 1-D tile along a tensor's last dim (the backward's per-row LSE / Delta) through
  `tma_row_vector`.
  A `T.StridedTensor` qualifies where its declared strides allow it (`strides_allow_rows`:
  last stride 1, the others multiples of 16 bytes): as a contiguous tensor where its leading
  dims flatten into rows, else through a descriptor of its full rank (`tma_full_rank`: a
  fused projection's permuted q / k / v slices); otherwise its copies take pointer loads /
  stores.
* `uses_tma_store`: a whole fragment -> rank-2 global tile (the GEMM epilogue), staged
  through an NVMMA shared tile and written with one TMA store.
* `tma_store_sources`: the shared buffers whose copies to global memory are TMA stores
  straight from them (FlashAttention's ``T.copy(acc_o, O_shared); T.copy(O_shared, Output[..])``
  epilogue): every such copy takes one whole buffer version to a TMA tile, and the buffer is
  written only by whole-version `T.copy`s, before which the code generator waits for the
  stores still reading it.
* `uses_cp_async`: a non-TMA async global->shared copy whose per-thread vectors are provably
  4-byte aligned (cp.async moves 4/8/16 bytes); otherwise the copy is a synchronous masked
  load + shared store, correct for any row stride (`T.dynamic` dims not known to be
  multiples of 16, K = 33 fp16).

Register (fragment) gemm operands are fed to the tensor cores as DotOperandLayout tensors;
a transposed one (A stored (K, M), B stored (N, K)) is permuted in registers first, so it
takes the same engine as an untransposed one.  wgmma reads B from shared memory only: a
register B uses mma.sync.  The FMA engine computes in the accumulator's dtype (operands
are cast to it: Triton's FMA dot requires equal element types).
"""
from __future__ import annotations

import math

from tritile.ir import layouts as lay
from tritile.ir import nodes as ir
from tritile.ir.padding import is_padded, padded_shape
from tritile.ir.transform import walk, written_buffer
from tritile.ir.verifier import gemm_mnk
from tritile.switches import schedule_switch


def _is_tensor_core_dtype(dtype) -> bool:
    return dtype.bits in (8, 16) and dtype.kind in ("float", "int")


def padded_mnk(g: ir.Gemm) -> tuple:
    """The gemm's (M, N, K) as its tiles hold them: padded to powers of two (ir/padding.py;
    pad lanes of the operands are 0, so a padded K adds nothing)."""
    return tuple(padded_shape(gemm_mnk(g)))


def gemm_engine(g: ir.Gemm, target, num_warps: int) -> str:
    m, n, k = padded_mnk(g)
    a_dt, b_dt = g.a.buffer.dtype, g.b.buffer.dtype
    if g.tf32 and a_dt == b_dt and a_dt.name == "float32":
        # mma.sync m16n8k8.tf32 (wgmma's tf32 reads both shared operands K-major only: a lever)
        ok = k % 8 == 0 and lay.mma_v2_accumulator(m, n, num_warps, g.policy) is not None
        return "mma_v2" if ok else "fma"
    if a_dt != b_dt or not _is_tensor_core_dtype(a_dt):
        return "fma"
    if a_dt.kind == "int" and g.c.buffer.dtype.name != "int32":
        return "fma"
    if target.has_wgmma and g.b.buffer.scope == "shared" and k % (256 // a_dt.bits) == 0:
        # 8-bit wgmma reads both smem operands K-major only (a register A is always K-major).
        k_major = (not g.transpose_a or g.a.buffer.scope != "shared") and g.transpose_b
        acc = lay.wgmma_accumulator(m, n, num_warps, g.policy, a_dt.bits)
        if acc is not None and (a_dt.bits == 16 or k_major):
            return "wgmma"
    if k % (32 // a_dt.bits * 8) == 0 and lay.mma_v2_accumulator(m, n, num_warps, g.policy) is not None:
        if not (a_dt.bits == 8 and (g.transpose_a or not g.transpose_b)):
            return "mma_v2"
    return "fma"


def accumulator_layout(g: ir.Gemm, target, num_warps: int):
    m, n, _ = padded_mnk(g)
    engine = gemm_engine(g, target, num_warps)
    if engine == "wgmma":
        return lay.wgmma_accumulator(m, n, num_warps, g.policy, g.a.buffer.dtype.bits)
    if engine == "mma_v2":
        return lay.mma_v2_accumulator(m, n, num_warps, g.policy)
    return lay.blocked_for((m, n), 32, num_warps)


def operand_layout(g: ir.Gemm, index: int, target, num_warps: int):
    """Register layout of gemm operand `index` (0 = A, 1 = B) when it is fed from registers."""
    parent = accumulator_layout(g, target, num_warps)
    if gemm_engine(g, target, num_warps) == "fma":
        return lay.DotOperandLayout(index, parent, 0)
    return lay.dot_operand(index, parent, g.a.buffer.dtype.bits)


def _static(x):
    return x.value if isinstance(x, ir.Const) else x


def is_multiple_of(e, n: int) -> bool:
    """Is the integer expression `e` provably a multiple of n (e.g. ``k * 128`` for 128)?"""
    coefficients, constant = _linear_terms(e)
    return constant % n == 0 and all(c % n == 0 for c in coefficients)


def _linear_terms(e):
    """(coefficients, constant) of an integer expression read as sum(c_i * t_i) + k, where a
    term t_i is anything but a sum, a difference or a product with a constant (a Var, a
    ``T.max(...)``, a ``%``): ``bx * 192 + part * 64`` -> ({192, 64}, 0).  A Var known to be
    a multiple of m (a runtime dim specialised on divisibility) is the term m * t:
    ``K`` with ``multiple_of=16`` -> ({16}, 0)."""
    if isinstance(e, ir.Var):
        return {e.multiple_of}, 0
    if isinstance(e, int):
        return set(), e
    if isinstance(e, ir.Const) and isinstance(e.value, int):
        return set(), e.value
    if isinstance(e, ir.BinOp) and e.op in ("+", "-"):
        (lhs, lk), (rhs, rk) = _linear_terms(e.lhs), _linear_terms(e.rhs)
        return lhs | rhs, lk + rk if e.op == "+" else lk - rk
    if isinstance(e, ir.BinOp) and e.op == "*":
        for factor, other in ((e.lhs, e.rhs), (e.rhs, e.lhs)):
            scale = _static(factor)
            if isinstance(scale, int):
                coefficients, k = _linear_terms(other)
                return {c * scale for c in coefficients}, k * scale
    return {1}, 0


def strides_allow_rows(buf: ir.Buffer, elements: int, rows_view: bool = False) -> bool:
    """Can a tile of global `buf` move as rows of adjacent elements whose starts are multiples of
    `elements` (TMA: 16 bytes; cp.async: 4 bytes)?  A `T.Tensor` (row-major; its row pitch, the
    last dim, is the caller's to check): yes.  A `T.StridedTensor`: its last stride is 1 and every
    other stride a provable multiple of `elements`; and for the 2-D rows view of a rank-3+
    tensor (`rows_view`) its leading dims flatten into rows - each stride before the last two is
    the next one times the next dim, provably (static ints)."""
    strides = buf.strides
    if strides is None:
        return True
    if _static(strides[-1]) != 1 or not all(is_multiple_of(s, elements) for s in strides[:-1]):
        return False
    if rows_view:
        for d in range(len(strides) - 2):
            outer, inner, size = _static(strides[d]), _static(strides[d + 1]), _static(buf.shape[d + 1])
            if not all(isinstance(x, int) for x in (outer, inner, size)) or outer != inner * size:
                return False
    return True


def tma_rows_view(region, inside) -> bool:
    """Is a TMA tile of global `region` served by a 2-D descriptor over its tensor's contiguous
    ``[prod(shape[:-1]), shape[-1]]`` rows view rather than one of its full rank?  A rank-1 or
    rank-2 tensor's always is (it is its own view).  A rank-3+ tensor's (a tile of unit leading
    extents: `_tma_tile_ok`, `tma_row_vector`) where its leading dims flatten into rows (not
    `tma_full_rank`) and every index but the last provably stays inside the tensor:
    ``inside(start, extent, size)``, the caller's static bounds of the variables (block indices
    below the grid, loop variables below their stop; codegen/signs.py).  The hardware clips a
    rows view only at the view's end, so a row block starting before its own leading index's
    rows or running past them - a loop overrunning its head, ``k * 64`` for k < ceildiv(128, 7)
    (mutant 583) - or a leading index outside its dim would read the neighbouring rows where
    every other path reads zeros, and write them where it drops the writes; a descriptor of the
    full rank clips every dim at its own size, as the masked path does.  Divisibility of the
    rows by the block and its start proves neither end (a start can be negative, a loop can run
    long), so only the bounds decide."""
    buf = region.buffer
    if len(buf.shape) <= 2:
        return True
    return not tma_full_rank(buf) and all(inside(start, extent, size) for start, extent, size
                                          in zip(region.starts[:-1], region.extents[:-1], buf.shape[:-1]))


def tma_full_rank(buf: ir.Buffer) -> bool:
    """Is global `buf` addressed by TMA through descriptors of its full rank (block ``[1, ...,
    1, rows, cols]``, every start a coordinate) whatever the tile, rather than the 2-D rows
    view?  A `T.StridedTensor` whose leading dims do not flatten into rows (a fused projection's
    ``qkv.view(b, t, 3, H, D).permute(2, 0, 3, 1, 4)`` slices: [B, H, S, D] with strides
    (S*3*H*D, D, 3*H*D, 1)) but that a full-rank descriptor can describe (`full_rank_describes`).
    Contiguous tensors and flattening strided ones take the rows view where their tile provably
    stays inside it (`tma_rows_view`) and a full-rank descriptor elsewhere.
    `TRITILE_FULL_RANK_TMA=0` leaves the non-flattening tensors to cp.async / pointer accesses
    (an A/B switch: the attention backward on views measured slower with these descriptors,
    bench/NOTES.md session 20); it does not take the fallback of the others away."""
    if schedule_switch("TRITILE_FULL_RANK_TMA") == "off":
        return False
    per = 16 // math.gcd(16, buf.dtype.itemsize)
    return full_rank_describes(buf) and not strides_allow_rows(buf, per, rows_view=True)


def full_rank_describes(buf: ir.Buffer) -> bool:
    """Can a TMA descriptor of the full rank of global `buf` describe it: 3 to 5 dims (TMA's
    limit), each provably positive (a descriptor cannot describe an empty dim), strides a
    descriptor takes (row-major ones, or declared ones whose last is 1 and the others multiples
    of 16 bytes)?  The hardware then clips every dim at its own size, so a tile may start or
    end anywhere."""
    if not 3 <= len(buf.shape) <= 5 or not all(known_positive(d) for d in buf.shape):
        return False
    return strides_allow_rows(buf, 16 // math.gcd(16, buf.dtype.itemsize))


def known_positive(dim) -> bool:
    """Is a tensor dim provably positive: a static one, or a runtime one in the variant that knows
    it a multiple of 16 (`ir/divisibility.py`), a positive multiple?"""
    if isinstance(dim, int):
        return dim > 0
    return isinstance(dim, ir.Var) and dim.multiple_of > 1


def _rows_tile(region) -> bool:
    """Is a tile of a rank-3+ global tensor one of the row blocks its rows view is for: unit
    extents on the leading dims, the whole of a static last dim, and a row block aligned to its
    leading index's static rows - the rows a multiple of the block and of every coefficient of
    the block's start (``bx * 192 + part * 64`` needs rows % 192 == 0), a constant offset inside
    the smallest of them.  Alignment does not keep a block inside its rows (a loop may run past
    them, a start may be negative: `tma_rows_view` decides that); it selects the tiles that take
    TMA at all, the same as before the full-rank descriptor became the rows view's fallback.
    Others (flash decoding's GQA query rows ``hid * 8`` in 64-row blocks) keep the masked path: a
    full-rank descriptor would serve them too, not measured."""
    buf = region.buffer
    rows, inner = buf.shape[-2], buf.shape[-1]
    block_rows = region.extents[-2]
    if not (all(e == 1 for e in region.extents[:-2]) and isinstance(rows, int) and isinstance(inner, int)
            and region.extents[-1] == inner and _static(region.starts[-1]) == 0 and rows % block_rows == 0
            and is_multiple_of(region.starts[-2], block_rows)):
        return False
    coefficients, offset = _linear_terms(region.starts[-2])
    return all(rows % c == 0 for c in coefficients) and offset + block_rows <= min(coefficients | {rows})


def _tma_tile_ok(region, box) -> bool:
    """A TMA descriptor for `region` of a global tensor with block `box`: rank 2, or unit leading
    extents of a rank-3+ tensor that a descriptor of its full rank can describe
    (`full_rank_describes`) - at its full rank (`tma_full_rank`), or in the rows view's shape
    (`_rows_tile`), which the code generator addresses through the rows view only where the tile
    provably stays inside it (`tma_rows_view`, else at the full rank) -; a row pitch provably a
    multiple of 16 bytes (a static last dim, or a
    runtime one specialised as a multiple of 16 elements: the host descriptor is encoded from
    the tensor's actual shape and strides at launch, and clips the edge tiles; a
    `T.StridedTensor`'s declared strides, `_pitches_ok`), a box row of
    at least 16 bytes, box dims <= 256 (the hardware limit), and a start along the last dim
    provably a multiple of 16 bytes (`_starts_aligned`)."""
    global_buf = region.buffer
    elem = global_buf.dtype.itemsize
    if global_buf.address is not None:  # a T.make_tensor tensor: no host descriptor (its address is the kernel's)
        return False
    if is_padded(box) or not _starts_aligned(region):  # padded boxes take masked loads / stores
        return False
    if tma_full_rank(global_buf):
        addressed = all(e == 1 for e in region.extents[:-2])
    else:
        addressed = ((len(global_buf.shape) == 2 or full_rank_describes(global_buf) and _rows_tile(region))
                     and _pitches_ok(global_buf, 16 // math.gcd(16, elem)))
    return (addressed and len(box) == 2 and tma_element(global_buf.dtype)
            and box[-1] * elem >= 16 and all(b <= 256 for b in box))


def tma_element(dtype) -> bool:
    """Can a TMA descriptor hold elements of `dtype`: 8, 16 or 32 bits, not bool - a descriptor
    of Triton's i1 aborted the process in Triton's descriptor metadata (an assertion of
    ir.cc's `getTensorDescMetadata`: a mutated attention backward storing dV as bool)."""
    return dtype.bits in (8, 16, 32) and dtype.kind != "bool"


def _starts_aligned(region) -> bool:
    """Is the start of global `region` along its last dim provably a multiple of 16 bytes?  A TMA
    copy from ``A[row, k * 3]`` (fp16: 6 bytes in) stopped the H100 with "an illegal instruction
    was encountered" (bench/NOTES.md, session 27: a mutated GEMM); such copies take cp.async or
    masked loads instead."""
    return is_multiple_of(region.starts[-1], 16 // math.gcd(16, region.buffer.dtype.itemsize))


def _pitches_ok(buf: ir.Buffer, elements: int) -> bool:
    """Are the row pitches of global `buf` (2-D, or its 2-D rows view) provably multiples of
    `elements`: a row-major tensor's last dim, a `T.StridedTensor`'s strides (`strides_allow_rows`)."""
    if buf.strides is None or buf.ndim == 1:  # a rank-1 tensor is one row of pitch shape[-1]
        return is_multiple_of(buf.shape[-1], elements) and strides_allow_rows(buf, elements)
    return strides_allow_rows(buf, elements, rows_view=len(buf.shape) > 2)


def tma_row_vector(region, box) -> bool:
    """A 1-D tile `box` along the last dim of a global tensor, with unit extents on the
    other dims, served by a 2-D descriptor with block ``(1, n)`` over the tensor's
    ``[prod(shape[:-1]), shape[-1]]`` rows view (a rank-1 tensor is one row): a row pitch
    provably a multiple of 16 bytes, a block of at most 256 elements whose bytes are a multiple
    of 128 (TMA writes shared memory at 128-byte aligned addresses: each version of a
    pipelined tile must start at one).  The hardware clips
    at the row's end (past it reads zeros, as a masked load does); a rank-3+ tensor's leading
    indices must provably lie inside it for the rows view (`tma_rows_view`), else the block is
    ``(1, ..., 1, n)`` of a descriptor of its full rank (`full_rank_describes`)."""
    global_buf = region.buffer
    elem = global_buf.dtype.itemsize
    return (len(box) == 1 and global_buf.address is None and not is_padded(box) and _starts_aligned(region)
            and tuple(region.extents[-1:]) == tuple(box)
            and all(e == 1 for e in region.extents[:-1]) and tma_element(global_buf.dtype)
            and (len(global_buf.shape) <= 2 or full_rank_describes(global_buf))
            and _pitches_ok(global_buf, 16 // math.gcd(16, elem)) and box[0] * elem % 128 == 0 and box[0] <= 256)


def uses_tma(copy, target) -> bool:
    src, dst = copy.src, copy.dst
    if not target.has_tma or src.buffer.scope != "global" or dst.buffer.scope != "shared":
        return False
    if src.buffer.safe_value is not None:  # TMA fills out-of-bounds elements with 0
        return False
    if src.buffer.dtype != dst.buffer.dtype:
        return False
    tile = dst.buffer.tile_shape
    if tuple(src.tile_shape) != tuple(tile) or dst.tile_shape != tuple(tile):
        return False
    lead = 1 if dst.buffer.num_versions > 1 else 0
    if any(_static(s) != 0 for s in dst.starts[lead:]):
        return False
    return _tma_tile_ok(src, tile) or tma_row_vector(src, tile)


def uses_tma_store(copy, target) -> bool:
    """A whole-fragment -> global tile copy stored through shared memory with one TMA store
    (the descriptor clips rows/columns past the tensor's end, so edge tiles are fine)."""
    src, dst = copy.src, copy.dst
    if not target.has_tma or src.buffer.scope != "fragment" or dst.buffer.scope != "global":
        return False
    if tuple(src.extents) != tuple(src.buffer.shape) or tuple(dst.tile_shape) != tuple(src.buffer.shape):
        return False
    return _tma_tile_ok(dst, tuple(dst.tile_shape))


# the element types `cp.reduce.async.bulk.tensor ... .add` takes that a tile atomic adds
TMA_REDUCE_ADD_DTYPES = ("float32", "float16", "bfloat16")


def uses_tma_reduce(atomic, target) -> bool:
    """A relaxed tile `T.atomic_add` of a whole fragment into a global tile that TMA can address
    (`_tma_tile_ok`: the hardware drops the elements past the tensor's edges, as the atomic's
    bounds test does), of float32 / float16 / bfloat16: one TMA reduce of the fragment staged in
    shared memory rather than an atomic per element from the registers (the FlashAttention
    backward's dQ, bench/NOTES.md session 22).  Its old value unused (no `return_prev`)."""
    dst, value = atomic.dst, atomic.value
    if not target.has_tma or atomic.kind != "add" or atomic.sem != "relaxed" or atomic.prev is not None:
        return False
    if not isinstance(value, ir.Region) or value.buffer.scope != "fragment" or dst.buffer.scope != "global":
        return False
    if dst.buffer.dtype.name not in TMA_REDUCE_ADD_DTYPES:
        return False
    if tuple(value.extents) != tuple(value.buffer.shape) or tuple(dst.tile_shape) != tuple(value.buffer.shape):
        return False
    return _tma_tile_ok(dst, tuple(dst.tile_shape))


def _whole_version(region) -> bool:
    """Does a shared region cover one whole version of its buffer (the stage index aside)?"""
    tile = region.buffer.tile_shape
    lead = 1 if region.buffer.num_versions > 1 else 0
    return tuple(region.tile_shape) == tuple(tile) and all(_static(s) == 0 for s in region.starts[lead:])


def tma_store_sources(func: ir.PrimFunc, target) -> set:
    """ids of the shared buffers copied to global memory by TMA stores read straight from them.
    A buffer qualifies when it has a shared -> global copy, every such copy takes one whole
    version of it to a TMA-able tile of the same dtype (`_tma_tile_ok`), its encoding may be
    NVMMA (no other user annotation), and every statement writing it is a `T.copy` of a whole
    version - the code generator waits for the TMA stores before those writes."""
    if not target.has_tma:
        return set()
    stores, writers = {}, {}
    for node in walk(func.kernel.body):
        if isinstance(node, ir.Copy) and node.src.buffer.scope == "shared" and node.dst.buffer.scope == "global":
            stores.setdefault(id(node.src.buffer), []).append(node)
        written = written_buffer(node)
        if written is not None and written.scope == "shared":
            writers.setdefault(id(written), []).append(node)
    out = set()
    for key, copies in stores.items():
        buf = copies[0].src.buffer
        if isinstance(buf.annotated_layout, lay.SHARED_LAYOUTS) and not isinstance(buf.annotated_layout, lay.NVMMASharedLayout):
            continue
        tile = tuple(buf.tile_shape)
        if not all(c.src.buffer.dtype == c.dst.buffer.dtype and _whole_version(c.src)
                   and tuple(c.dst.tile_shape) == tile and _tma_tile_ok(c.dst, tile) for c in copies):
            continue
        if all(isinstance(w, ir.Copy) and _whole_version(w.dst) for w in writers.get(key, [])):
            out.add(key)
    return out


def uses_cp_async(copy) -> bool:
    """Can cp.async serve this global->shared copy?  Each thread copies a contiguous vector
    of the tile's last dim; Triton emits cp.async only when it proves every vector is at
    least 4 bytes and 4-byte aligned.  The base pointer is 16-byte aligned (checked at
    launch), so that holds for 1/2-byte elements when the tensor's last dim (a factor of
    every other stride, and the bound of the last-dim mask) is a provable multiple of 4 bytes
    (static, or a runtime dim specialised as a multiple of 16, which the code generators
    pass to Triton as `tt.divisibility`) and the tile's last-dim start and extent are
    provable multiples of 4 bytes; a `T.StridedTensor`'s last stride must be 1 and its other
    strides provable multiples of 4 bytes instead.  Any other runtime last dim is not assumed
    aligned: such copies take the synchronous path."""
    src = copy.src
    buf = src.buffer
    if buf.safe_value is not None:  # cp.async fills out-of-bounds elements with 0
        return False
    elem = buf.dtype.itemsize
    per = 4 // math.gcd(4, elem)
    if not strides_allow_rows(buf, per):  # a T.StridedTensor's rows: adjacent elements, aligned pitches
        return False
    if elem >= 4:
        return True
    return ((buf.strides is not None or is_multiple_of(buf.shape[-1], per)) and src.extents[-1] % per == 0
            and is_multiple_of(src.starts[-1], per))
