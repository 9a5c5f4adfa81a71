"""TileLang's `make_mma_swizzle_layout` / `get_swizzle_layout`
(`tilelang.cuda.intrinsics.layout.mma_layout`) in tritile's terms.

Contract
--------
* `make_mma_swizzle_layout(shared_buf, is_smooth=False)`: in TileLang, the XOR-swizzled
  (bank-conflict-free) placement of a shared buffer whose rows are a multiple of 64 bytes
  (``shape[-1] * bits % 512 == 0``), else (or with ``is_smooth``) the identity layout.  In
  tritile the swizzled case is a `tritile.layout.SwizzledLayout` request - the same object as
  `tilelang.layout.make_swizzled_layout`: `T.annotate_layout` accepts it on shared buffers and
  layout inference keeps the swizzle its instructions need (TMA / wgmma / ldmatrix) or picks
  a bank-conflict-free one.  The unswizzled case is TileLang's identity `T.Layout`, which
  `T.annotate_layout` takes as a placement hint.  Either way an element's value never depends
  on where it lives: results are those of the unannotated program (the CPU interpreter
  ignores both).
* `get_swizzle_layout(row_idx, col_idx, row_size, dtype, swizzle_bytes=None)`: TileLang's index
  map, ``(col_tile, row_idx, swizzled_col)`` of element ``(row_idx, col_idx)`` of a row of
  `row_size` elements, on ints or torch integer tensors (for inspecting the placement).
"""
from __future__ import annotations

from tritile.ir.dtypes import as_dtype
from tritile.language.layout import Layout
from tritile.layout import SwizzledLayout


def get_swizzle_layout(row_idx, col_idx, row_size, dtype, swizzle_bytes=None):
    bits = as_dtype(dtype).bits
    row_bytes = bits * int(row_size) // 8
    assert row_bytes % 32 == 0, "Row size must be multiple of 32B."
    if swizzle_bytes is None:
        swizzle_bytes = min(128, row_bytes)
    # 128 / 64 / 32-byte swizzle: the 16-byte vector c of row r moves to c ^ (r % 8 // (8 // vectors))
    elem_per_16B = 128 // bits
    swizzle_vectors = int(swizzle_bytes) // 16
    col_idx_16B = col_idx // elem_per_16B
    col_idx_in_16B = col_idx % elem_per_16B
    col_tile = col_idx_16B // swizzle_vectors
    c = col_idx_16B % swizzle_vectors
    src = (row_idx % 8) // (8 // swizzle_vectors)
    swizzled_col = (c ^ src) * elem_per_16B + col_idx_in_16B
    return col_tile, row_idx, swizzled_col


def make_mma_swizzle_layout(shared_buf, is_smooth: bool = False):
    shape = tuple(shared_buf.shape)
    last = shape[-1]
    can_swizzle = isinstance(last, int) and last * as_dtype(shared_buf.dtype).bits % 512 == 0
    if is_smooth or not can_swizzle:
        return Layout(shape, lambda *args: list(args))
    return SwizzledLayout(shared_buf)
