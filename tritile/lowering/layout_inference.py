"""layout_inference: give every on-chip buffer one encoding (`Buffer.layout`).

Assumes: the IR after pipeline injection and the shared-memory budget (versioned shared
buffers ``[S, ...]``, explicit async ops).  Only meaningful for CUDA targets; on the CPU
target the function is returned unchanged (the interpreter needs no layouts).

Guarantees:
* every shared / fragment buffer gets a `tritile.ir.layouts` encoding, set by rebuilding
  the buffer (``origin`` = the buffer it replaces) and substituting it everywhere in one
  step; a user's `annotated_layout` of a layout class wins and is kept;
* versioned buffers get the encoding of one version (the stage dim is an allocation dim);
* the result does not depend on the order in which ops are visited: each buffer's
  requirements are collected as a set and resolved by a fixed priority with a
  deterministic tie-break (the encoding's text);
* `func.attrs["layout_target"]` records the target the encodings were chosen for (the
  code generator re-runs this pass when it compiles for another one);
* it never fails: where no single encoding serves all consumers, the buffer keeps the
  strongest requirement and the code generator inserts `gl.convert_layout` for the others.

Resolution rules (strongest first):
shared:   wgmma operand, TMA destination or TMA store source -> NVMMASharedLayout of the stored tile (one
          NVMMA layout serves K-major and MN-major 16-bit wgmma operands: MN-major uses are
          fed through a permuted view, so seed 003's shared tile needs no conversion);
          mma.sync operand -> bank-conflict-free SwizzledSharedLayout; else unswizzled.
fragment: gemm accumulator (NVMMADistributedLayout v3 / v2, BlockedLayout for FMA) >
          register gemm operand (DotOperandLayout; not for a transposed one, which the
          code generator permutes in registers, nor for an FMA operand that copies more than
          `_FMA_OPERAND_HOME_REGISTERS` registers into each thread, which it converts) > derived from a decided neighbour
          (SliceLayout for reduction results and for 1-D fragments broadcast inside a
          T.Parallel over a 2-D fragment; a keep-dim reduction's (1, N) / (M, 1) result
          shares its source's BlockedLayout) > coalesced BlockedLayout.
"""
from __future__ import annotations

import dataclasses

from tritile.ir import instructions as isel
from tritile.ir import layouts as lay
from tritile.ir import nodes as ir
from tritile.ir.padding import padded_shape
from tritile.ir.transform import substitute_buffers, walk

# requirement priorities (lower wins)
_ACCUMULATOR, _DOT_OPERAND, _DERIVED = 0, 1, 2


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    if getattr(target, "kind", "cpu") != "cuda":
        return func
    num_warps = max(1, func.kernel.partition_threads // 32)
    buffers = [n.buffer for n in walk(func.kernel.body) if isinstance(n, ir.Alloc)]
    shared_uses = _shared_requirements(func, target, num_warps)
    decided = {}
    for buf in buffers:
        if isinstance(buf.annotated_layout, lay.SHARED_LAYOUTS + lay.DISTRIBUTED_LAYOUTS):
            decided[buf] = buf.annotated_layout
        elif buf.scope == "shared":
            decided[buf] = _shared_layout(buf, shared_uses.get(buf, set()))
    _decide_fragments(func, target, num_warps, [b for b in buffers if b.scope == "fragment"], decided)
    mapping = {buf: dataclasses.replace(buf, origin=buf, layout=layout) for buf, layout in decided.items()}
    func = substitute_buffers(func, mapping)
    return dataclasses.replace(func, attrs={**func.attrs, "layout_target": str(target)})


# --------------------------------------------------------------------------------------
# shared buffers
# --------------------------------------------------------------------------------------


def _shared_requirements(func, target, num_warps) -> dict:
    uses = {}
    for node in walk(func.kernel.body):
        if isinstance(node, ir.Gemm):
            engine = isel.gemm_engine(node, target, num_warps)
            for op in (node.a, node.b):
                if op.buffer.scope == "shared":
                    uses.setdefault(op.buffer, set()).add(engine)
        elif isinstance(node, (ir.Copy, ir.AsyncCopy)) and isel.uses_tma(node, target):
            uses.setdefault(node.dst.buffer, set()).add("tma")
    store_sources = isel.tma_store_sources(func, target)
    for node in walk(func.kernel.body):
        if isinstance(node, ir.Alloc) and id(node.buffer) in store_sources:
            uses.setdefault(node.buffer, set()).add("tma")
    return uses


def _shared_layout(buf: ir.Buffer, uses: set):
    tile = padded_shape(buf.tile_shape)  # the allocated tile (ir/padding.py)
    bits = buf.dtype.bits
    if len(tile) >= 2 and uses & {"wgmma", "tma"} or "tma" in uses:  # a 1-D TMA tile: unswizzled
        return lay.nvmma_default_for(tile, bits)
    if len(tile) >= 2 and "mma_v2" in uses:
        return lay.swizzled_for_mma(tile, bits)
    return lay.plain_shared(len(tile))


# --------------------------------------------------------------------------------------
# fragments
# --------------------------------------------------------------------------------------


def _decide_fragments(func, target, num_warps, fragments, decided):
    strong = {}  # buffer -> set of (priority, text, layout)
    for node in walk(func.kernel.body):
        if not isinstance(node, ir.Gemm):
            continue
        acc = isel.accumulator_layout(node, target, num_warps)
        strong.setdefault(node.c.buffer, set()).add((_ACCUMULATOR, str(acc), acc))
        for index, op in enumerate((node.a, node.b)):
            # a transposed register operand is permuted in registers before the dot, so
            # its stored (K, M) / (N, K) tile has no operand layout of its own
            if op.buffer.scope == "fragment" and not (node.transpose_a, node.transpose_b)[index]:
                dot = isel.operand_layout(node, index, target, num_warps)
                if _fits_as_home(dot, op.buffer):
                    strong.setdefault(op.buffer, set()).add((_DOT_OPERAND, str(dot), dot))
    for buf in fragments:
        if buf not in decided and buf in strong:
            decided[buf] = min(strong[buf], key=lambda r: r[:2])[2]

    links = _derivation_links(func)
    pending = [b for b in fragments if b not in decided]
    while pending:
        progress = False
        for buf in pending:
            candidates = {(str(l), l) for l in (derive(decided) for derive in links.get(buf, ())) if l is not None}
            if candidates:
                decided[buf] = min(candidates, key=lambda c: c[0])[1]
                progress = True
        pending = [b for b in pending if b not in decided]
        if pending and not progress:
            # nothing to derive from: the highest-rank undecided buffer gets a blocked
            # layout, from which its lower-rank neighbours may then be derived.  Its vectors
            # are 16 bytes of the narrowest dtype among the undecided tiles of its shape: an
            # fp16 tile computed through fp32 ones then loads and stores 16 bytes a thread
            # with no layout conversion before its store (fp32 tiles hold two vectors)
            first = min(pending, key=lambda b: (-len(b.shape), b.name, str(b.shape)))
            bits = min(b.dtype.bits for b in pending if list(b.shape) == list(first.shape))
            decided[first] = lay.blocked_for(padded_shape(first.shape), max(bits, 16), num_warps)
            pending.remove(first)


# registers a thread an FMA dot operand may take as its buffer's own layout; past it the buffer
# keeps a blocked layout and each gemm converts it (seed 3201 #221: a float32 64x128 fragment
# held as FMA operand A took 2048 registers a thread across the loop, and the Gluon compile
# ran for minutes in ptxas; converted at the gemm, Triton's own choice, it compiles in seconds)
_FMA_OPERAND_HOME_REGISTERS = 128


def _fits_as_home(dot, buf: ir.Buffer) -> bool:
    if not isinstance(dot.parent, lay.BlockedLayout):  # a tensor-core operand: no copies across threads
        return True
    # the FMA engine computes in the 32-bit accumulator's dtype: a register an element
    return lay.fma_operand_elements_per_thread(dot, padded_shape(buf.shape)) <= _FMA_OPERAND_HOME_REGISTERS


def _derivation_links(func) -> dict:
    """buffer -> list of functions `decided -> layout or None` proposing a derived layout."""
    links = {}

    def add(buf, fn):
        links.setdefault(buf, []).append(fn)

    for node in walk(func.kernel.body):
        if isinstance(node, ir.Reduce) and node.src.buffer.scope == node.dst.buffer.scope == "fragment":
            src, dst, dim = node.src.buffer, node.dst.buffer, node.dim
            if len(dst.shape) == len(src.shape) - 1:
                add(dst, lambda d, src=src, dim=dim: lay.slice_of(d[src], dim) if src in d else None)
            elif len(dst.shape) == len(src.shape) and dst.shape[dim] == 1:
                # keep-dim result: the source's blocked layout fits any shape (an MMA one does not)
                add(dst, lambda d, src=src: d[src] if isinstance(d.get(src), lay.BlockedLayout) else None)
        elif isinstance(node, ir.Copy) and node.src.buffer.scope == node.dst.buffer.scope == "fragment":
            a, b = node.src.buffer, node.dst.buffer
            if tuple(a.shape) == tuple(b.shape):  # same layout: the copy is free
                add(b, lambda d, a=a: d.get(a))
                add(a, lambda d, b=b: d.get(b))
        elif isinstance(node, ir.Parallel):
            _parallel_links(node, add)
    return links


def _parallel_links(par: ir.Parallel, add):
    """Fragments indexed by exactly the loop vars of a T.Parallel want one layout; inside a
    2-D T.Parallel a 1-D fragment indexed by loop var k broadcasts along the other dim of
    every 2-D fragment indexed (i, j): it wants SliceLayout(1 - k, theirs)."""
    full, rows = [], []
    rank = len(par.vars)
    for node in walk(par.body):
        if isinstance(node, (ir.Load, ir.Store)) and node.buffer.scope == "fragment":
            idx = node.indices
            if len(idx) == rank and all(a is b for a, b in zip(idx, par.vars)) \
                    and tuple(node.buffer.shape) == tuple(par.extents):
                full.append(node.buffer)
            elif len(idx) == 1 and rank == 2:
                for k, var in enumerate(par.vars):
                    if idx[0] is var:
                        rows.append((node.buffer, k))
    for anchor in full:
        for buf, k in rows:
            add(buf, lambda d, anchor=anchor, k=k: lay.slice_of(d[anchor], 1 - k) if anchor in d else None)
        for other in full:
            if other is not anchor:
                add(other, lambda d, anchor=anchor: d.get(anchor))
