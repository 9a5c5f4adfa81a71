"""Which global tiles the triton.language backend moves through TMA tensor descriptors.

On a target with TMA (sm_90, sm_100) a `T.copy` between a global tile and an on-chip tile (or
another global tile) reads the global tile with ``desc.load([starts])`` and writes it with
``desc.store([starts], tile)``, on a host-side `triton.tools.tensor_descriptor.TensorDescriptor`
the kernel takes as an argument (`tritile.runtime.launcher` builds it per call, encoded once
per address and geometry).  The descriptor's block is the region's extents at the tensor's
full rank (unit dims included) and its shape the tensor's, so the hardware's out-of-bounds
rule - each dim checked against the tensor's size, zeros read, lanes past it not written - is
the masked path's exactly; the tile is reshaped to the register tile's shape.

A copy takes a descriptor only where that holds and the hardware and Triton 3.6 take it,
everything proved at compile time (else it keeps the masked ``tl.load`` / ``tl.store``):

* the tensor (`DescriptorPlan.tensor_ok`): at most 5 dims; 1, 2 or 4-byte elements (not
  bool); every stride but the last (row-major, from the shape; a `T.StridedTensor`'s declared
  ones, whose last must be 1) a multiple of 16 bytes; every
  dim positive (a static size, or a runtime one in the variant that knows it a multiple of 16,
  `ir/divisibility.py`: a descriptor cannot describe an empty dim, and a runtime size that
  may be 0 or ragged proves nothing); and either read only by the kernel (descriptor loads), or
  never read and written by one `T.copy` outside every loop (a descriptor store).  The last
  rule keeps TMA's asynchronous proxy away from every other access to the bytes it writes:
  a TMA load is not ordered after the threads' earlier plain stores, and Triton waits for a
  TMA store only until it has read its shared source, so it is not ordered with a later load,
  nor with another write of the same bytes (by another statement, or by the same one in a
  later loop iteration).
* the tile (`DescriptorPlan.box`): every extent a power of two (a padded tile keeps the masked
  path, whose masks cover its pad lanes) and at most 256 (TMA's box limit); the innermost
  extent at least 16 bytes; the innermost start a provable multiple of 16 bytes and every start
  a 32-bit integer (Triton's rules for descriptor offsets).

cuda:80 and AMD targets have no TMA: their copies are all masked.  `TRITILE_TRITON_TMA=0`
keeps every copy masked on TMA targets too (to measure what the descriptors buy); it is read
when a kernel is generated and is part of the compile cache key (`enabled`).
"""
from __future__ import annotations

import math

from tritile.codegen.semantics import POINTER_TYPES
from tritile.ir import nodes as ir
from tritile.ir.instructions import is_multiple_of, known_positive, strides_allow_rows
from tritile.ir.padding import is_padded
from tritile.ir.transform import walk, written_buffer
from tritile.switches import schedule_switch

MAX_RANK = 5  # TMA tensors have 1 to 5 dims
MAX_BOX = 256  # elements along one dim of a TMA box
ALIGN = 16  # bytes: global strides, the innermost box row and the innermost start


def enabled() -> bool:
    """Descriptors unless `TRITILE_TRITON_TMA` says 0 / off."""
    return schedule_switch("TRITILE_TRITON_TMA") != "off"


class DescriptorPlan:
    """The global tensors of `func` whose tiles may use descriptors on `target` (none without
    TMA), and the test of one tile (`box`)."""

    def __init__(self, func: ir.PrimFunc, target):
        self.tensors = set()  # ids of the global params whose copies may use descriptors
        if not getattr(target, "has_tma", False) or not enabled():
            return
        one_way = _read_only_or_stored_once(func.kernel.body)
        self.tensors = {id(p) for p in func.params if id(p) in one_way and tensor_ok(p)}

    def box(self, region: ir.Region):
        """The descriptor block of a copy's global `region` (its extents), or None where the
        copy keeps the masked path."""
        buf = region.buffer
        if id(buf) not in self.tensors:
            return None
        box = tuple(region.extents)
        elem = buf.dtype.itemsize
        if is_padded(box) or any(not isinstance(e, int) or e > MAX_BOX for e in box) or box[-1] * elem < ALIGN:
            return None
        if not all(isinstance(s, int) or s.dtype.name == "int32" for s in region.starts):
            return None
        # a unit dim between two wider ones (`K[b, rows, h, :]`, a [1, 64, 1, 64] box) read wrong
        # values on the H200 (tests/test_kernels_multi_kernel.py's split kernel, session 18, not
        # seen in Triton's interpreter): such tiles keep the masked path; leading unit dims are fine
        wide = [i for i, e in enumerate(box) if e != 1]
        if wide and any(box[i] == 1 for i in range(wide[0], len(box))):
            return None
        return box if is_multiple_of(region.starts[-1], ALIGN // math.gcd(ALIGN, elem)) else None


def tensor_ok(buf: ir.Buffer) -> bool:
    """Can a descriptor describe global tensor `buf` (its dtype, rank, strides, dims)?  Not one
    with a `T.annotate_safe_value`: TMA fills out-of-bounds elements with 0."""
    if buf.safe_value is not None:
        return False
    dtype = buf.dtype
    if dtype.kind == "bool" or dtype.bits not in (8, 16, 32) or dtype.lanes != 1 or dtype.name not in POINTER_TYPES:
        return False
    if not 1 <= len(buf.shape) <= MAX_RANK or not all(known_positive(d) for d in buf.shape):
        return False
    per = ALIGN // math.gcd(ALIGN, dtype.itemsize)  # elements in 16 bytes
    if buf.strides is not None:  # a T.StridedTensor: its declared strides
        return strides_allow_rows(buf, per)
    factor = 1  # a known factor of the stride of dim d: the product of the dims after it
    for d in reversed(buf.shape[1:]):
        factor *= d if isinstance(d, int) else d.multiple_of
        if factor % per:
            return False
    return True


def _read_only_or_stored_once(body) -> set:
    """ids of the global buffers `body` only reads, or never reads and writes by one `T.copy`
    outside every loop."""
    named, writers = {}, {}
    for node in walk(body):
        buf = getattr(node, "buffer", None)
        if isinstance(node, (ir.Region, ir.Load, ir.Store)) and buf.scope == "global":
            named[id(buf)] = named.get(id(buf), 0) + 1
        written = written_buffer(node)
        if written is not None and written.scope == "global":
            writers.setdefault(id(written), []).append(node)  # each write names its target once
    in_loops = {id(node) for loop in walk(body) if isinstance(loop, (ir.For, ir.While)) for node in walk(loop.body)}
    out = set()
    for key, count in named.items():
        written = writers.get(key, [])
        if not written or (len(written) == count == 1 and isinstance(written[0], ir.Copy)
                           and id(written[0]) not in in_loops):
            out.add(key)
    return out
