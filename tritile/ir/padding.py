"""Tiles whose extents are not powers of two: each on-chip extent padded to the next one.

Triton's (and Gluon's) register tensors have power-of-two shapes, so a fragment, shared tile
or `T.Parallel` extent like 192 or 576 lives in a tile of the next power of two (256, 1024).
The lanes past the extent - the *pad lanes* - are masked so that they never change a result:

* loads from global memory are masked to the extent (pad lanes read 0), stores and atomics to
  global memory are masked to it (pad lanes are dropped);
* every writer of an on-chip tile leaves its pad lanes 0: allocations are zeros (a padded shared
  buffer is allocated with a zero value), `T.Parallel` writes only its lanes inside the extents,
  a fill or a reduction result is masked to the extent;
* so a gemm over a padded K dim adds 0 * 0 for each pad lane (and pad rows / columns of its
  result are sums of products with 0: 0 while the operands are finite);
* reductions replace pad lanes with the reduction's identity (-inf for max, 0 for sum, ...),
  scans mask their result.

Instruction selection, layout inference and both backends size tiles, layouts and gemm
instruction shapes by `padded_shape`; a pow2 tile is its own padded tile (nothing changes for
it).  Splitting an extent into power-of-two parts (192 = 128 + 64) would spend no work on pad
lanes, but needs a tile per part; padding is the one rule every op follows.
"""
from __future__ import annotations


def padded(extent: int) -> int:
    """The power of two a tile extent is padded to (the extent itself when it is one)."""
    return 1 << (extent - 1).bit_length() if isinstance(extent, int) and extent > 0 else extent


def padded_shape(shape) -> list:
    return [padded(d) for d in shape]


def is_padded(shape) -> bool:
    """Does a tile of `shape` have pad lanes?"""
    return any(padded(d) != d for d in shape)


def padded_buffer_shape(buf) -> list:
    """The allocated shape of an on-chip buffer: its tile dims padded, a versioned buffer's
    leading stage dim kept (it indexes allocations, not lanes)."""
    lead = 1 if buf.num_versions > 1 else 0
    return list(buf.shape[:lead]) + padded_shape(buf.shape[lead:])
