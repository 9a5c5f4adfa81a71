"""shared_slots: a user's multi-slot shared buffer becomes a versioned one.

TileLang programs declare their own rings of shared tiles, ``A_shared = T.alloc_shared((slots,
block_M, block_K))`` used one slot at a time (``A_shared[ko % slots, :, :]`` for a copy and a
gemm).  Its leading dimension then indexes whole tiles, as the stage dimension of a buffer of
`buffer_versioning` does; so it is made one: the code generator allocates it as `slots` tiles
whose encoding is that of one tile (`layout_inference` sizes layouts by `Buffer.tile_shape`).

Assumes: `buffer_versioning` ran (its buffers have ``num_versions > 1`` and a leading stage
index in every access).

Guarantees:
* A shared buffer is a ring when its tile (`tile_shape`, the stage dim aside) has rank >= 2
  and a leading dim n > 1, no annotated layout, and every access fixes one index of that dim:
  a region has extent 1 there, a load / store an index that names no `T.Parallel` variable
  (one slot for the whole tile).  Any other use leaves the buffer unchanged.
* A ring that is not versioned gets ``num_versions = n``; its shape and accesses are unchanged.
* A ring versioned into ``(V, n, ...)`` gets one leading dim of ``V * n`` versions, indexed
  ``stage * n + slot``, with ``origin`` = the buffer it replaces, substituted everywhere in
  one step.
"""
from __future__ import annotations

import dataclasses

from tritile.ir import nodes as ir
from tritile.ir.transform import Transformer, substitute_buffers, walk


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    rings = ring_buffers(func)
    if not rings:
        return func
    merged = {buf for buf in rings if buf.num_versions > 1}
    if merged:
        func = _MergeSlots(merged).transform(func)
    mapping = {}
    for buf in rings:
        if buf in merged:
            n = buf.shape[1]
            shape = (buf.shape[0] * n,) + tuple(buf.shape[2:])
        else:
            n, shape = buf.shape[0], tuple(buf.shape)
        mapping[buf] = dataclasses.replace(buf, shape=shape, num_versions=buf.num_versions * n, origin=buf)
    return substitute_buffers(func, mapping)


def ring_buffers(func: ir.PrimFunc) -> list:
    """The shared buffers of `func` that are rings (see the module docstring), in allocation order."""
    lane_vars = {id(v) for par in walk(func.kernel.body) if isinstance(par, ir.Parallel) for v in par.vars}
    candidates, refused = [], set()
    for node in walk(func.kernel.body):
        buf = getattr(node, "buffer", None)
        if not isinstance(buf, ir.Buffer) or buf.scope != "shared":
            continue
        lead = 1 if buf.num_versions > 1 else 0
        if isinstance(node, ir.Alloc):
            tile = buf.tile_shape
            if len(tile) >= 2 and isinstance(tile[0], int) and tile[0] > 1 and buf.annotated_layout is None:
                candidates.append(buf)
            continue
        if isinstance(node, ir.Region):
            one_slot = node.extents[lead] == 1
        elif isinstance(node, (ir.Load, ir.Store)):
            one_slot = not any(id(v) in lane_vars for v in walk(node.indices[lead]) if isinstance(v, ir.Var))
        else:
            one_slot = False
        if not one_slot:
            refused.add(id(buf))
    return [buf for buf in candidates if id(buf) not in refused]


class _MergeSlots(Transformer):
    """``buf[stage, slot, ...]`` -> ``buf[stage * n + slot, ...]`` for the versioned rings."""

    def __init__(self, rings: set):
        self.rings = rings

    def _index(self, buf, indices):
        stage, slot = indices[0], indices[1]
        return (ir.BinOp("+", ir.BinOp("*", stage, ir.Const(buf.shape[1])), slot),) + tuple(indices[2:])

    def visit_Region(self, r):
        if r.buffer not in self.rings:
            return r
        return ir.Region(r.buffer, self._index(r.buffer, r.starts), (1,) + tuple(r.extents[2:]))

    def visit_Load(self, n):
        return n if n.buffer not in self.rings else dataclasses.replace(n, indices=self._index(n.buffer, n.indices))

    def visit_Store(self, n):
        return n if n.buffer not in self.rings else dataclasses.replace(n, indices=self._index(n.buffer, n.indices))
