"""heaviest_first: launch the blocks with the most loop iterations first.

Assumes: the pipeline passes ran (a software-pipelined loop is a `For` with
``pipelined_from > 0`` whose `stop` is its trip count's bound, possibly through top-level
`Let`s), and the grid extents are static.

Guarantees: values are unchanged (only the order in which the GPU launches blocks moves).
`Kernel.reversed_axes` lists the grid axes whose block index runs backwards: block
``g - 1 - program_id(axis)`` is launched as the axis's program ``program_id(axis)``.  An
axis is reversed when a top-level pipelined loop's trip count, with the other block indices
at 0, is larger for the axis's last block than for its first - causal attention, whose row
block bx reads bx + 1 key tiles.  Launched last, those heavy blocks would run alone at
the end of the grid while the other SMs idle; launched first, the light ones fill the tail
(FlashAttention-2's reversed row-block order for causal masks).  Persistent kernels
(lowering/persistent_tiles.py) and rasterised grids (`T.use_swizzle`) keep their order.
"""
from __future__ import annotations

import dataclasses

from tritile.ir import nodes as ir
from tritile.ir.transform import substitute_vars, top_level
from tritile.lowering.pipeline_injection import fold


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    kernel = func.kernel
    if kernel.swizzle is not None or "persistent_tile_loop" in func.attrs:
        return func
    extents = [g.value if isinstance(g, ir.Const) else g for g in kernel.grid]
    if not all(isinstance(g, int) for g in extents):
        return func
    stmts = top_level(kernel.body)
    lets = {s.var: s.value for s in stmts if isinstance(s, ir.Let)}
    stops = [_resolve(s.stop, lets) for s in stmts if isinstance(s, ir.For) and s.pipelined_from > 0]
    reversed_axes = tuple(axis for axis, extent in enumerate(extents)
                          if extent > 1 and any(_heavier_last(stop, kernel.block_vars, axis, extent) for stop in stops))
    if not reversed_axes:
        return func
    return dataclasses.replace(func, kernel=dataclasses.replace(kernel, reversed_axes=reversed_axes))


def _resolve(e, lets: dict):
    """`e` with top-level Let variables replaced by their values (transitively)."""
    for _ in range(len(lets) + 1):
        new = substitute_vars(e, lets)
        if new is e:
            break
        e = new
    return e


def _heavier_last(stop, block_vars, axis: int, extent: int) -> bool:
    def trips(index: int):
        at = {v: ir.Const(index if k == axis else 0) for k, v in enumerate(block_vars)}
        value = fold(substitute_vars(stop, at))
        return value.value if isinstance(value, ir.Const) else None

    first, last = trips(0), trips(extent - 1)
    return first is not None and last is not None and last > first
