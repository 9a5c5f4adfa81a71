"""Persistent tile scheduling: a grid of one program per SM, each looping over output tiles.

Input: a lowered `PrimFunc` (runs after layout inference) whose kernel has a 2-D grid and a
`T.use_swizzle(panel_size, order)` hint.  Output: the same program with

    Kernel(grid=(min(tiles, P),), block_vars=(pid,)):
        <shared allocations of the body>           # hoisted: one allocation for every tile
        for tile_iter in range(ceildiv(tiles - pid, P)):
            tile = pid + tile_iter * P
            bx = ...; by = ...                      # TileLang's panel rasterisation of `tile`
            <the rest of the body>

where ``tiles = gx * gy`` and P = the number of programs.  Programs running at the same time
work on consecutive `tile` values, so the panel rasterisation (the same mapping as
codegen/gluon/block_order.py: panels of `panel_size` rows or columns, serpentine) groups the
tiles in flight as the non-persistent launch order would.  Every tile is computed exactly
once, by the same body, so values are unchanged (the interpreter runs the result as is).
The tile loop's var is recorded as ``func.attrs["persistent_tile_loop"]``; the Gluon backend
then allocates each pipelined loop's mbarrier ring once, before the tile loop, and continues
its phase across tiles (tile_iter * groups per tile), and lets a TMA-store epilogue of one
tile complete under the next tile's main loop.

When (``run``): off by default - on an H100 it measured neutral for examples/gemm.py
(bench/NOTES.md, 2026-11-22: within +-3% of the plain launch at 4096^3, 8192^3, 1024x8192^2,
one sample each), so it is opt-in.  ``TRITILE_PERSISTENT=auto`` enables it for CUDA targets
with a 2-D grid of static extents and a swizzle hint, more tiles than SMs and not a multiple
of them (the case where a plain launch's last wave is partly idle), ``=1`` wherever it is
applicable.  Applicable: every pipelined loop's bounds are independent of the block vars (so
each tile commits the same number of commit groups and the ring phase can be computed).
`persist(func, num_programs)` applies it unconditionally (tests use small program counts).
"""
from __future__ import annotations

import dataclasses
import os

from tritile.ir import nodes as ir
from tritile.ir.transform import walk

# SM counts of the default GPU of each architecture, used when no GPU is present
DEFAULT_NUM_SMS = {90: 132, 89: 128, 86: 84, 80: 108}


def num_sms(target) -> int:
    """Streaming multiprocessors of the current GPU, else the target architecture's default."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return DEFAULT_NUM_SMS.get(target.arch, 132)


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    mode = os.environ.get("TRITILE_PERSISTENT", "0").strip().lower()
    if target.kind != "cuda" or mode in ("", "0", "off", "false") or not applicable(func):
        return func
    sms = num_sms(target)
    gx, gy = (_static(g) for g in func.kernel.grid)
    if mode == "auto" and (gx is None or gy is None or gx * gy <= sms or (gx * gy) % sms == 0):
        return func
    return persist(func, sms)


def applicable(func: ir.PrimFunc) -> bool:
    """2-D grid with a swizzle hint; pipelined loop bounds do not depend on the block vars;
    not warp specialized (the producer partition walks one tile's loops)."""
    k = func.kernel
    if "warp_specialization" in func.attrs:
        return False
    if len(k.grid) != 2 or k.swizzle is None or k.swizzle[1] not in ("row", "column"):
        return False
    block_vars = {id(v) for v in k.block_vars}
    for loop in walk(k.body):
        if isinstance(loop, ir.For) and loop.pipelined_from > 0:
            bounds = [n for e in (loop.start, loop.stop, loop.step) for n in walk(e)]
            if any(isinstance(n, ir.Var) and id(n) in block_vars for n in bounds):
                return False
    return True


def persist(func: ir.PrimFunc, num_programs: int) -> ir.PrimFunc:
    k = func.kernel
    gx, gy = k.grid
    bx, by = k.block_vars
    tiles = ir.BinOp("*", gx, gy)
    pid = ir.Var("pid")
    tile_iter = ir.Var("tile_iter")
    tile = ir.Var("tile")
    P = ir.Const(num_programs)
    hoisted = [s for s in k.body.stmts if isinstance(s, ir.Alloc) and s.buffer.scope == "shared"]
    rest = [s for s in k.body.stmts if not (isinstance(s, ir.Alloc) and s.buffer.scope == "shared")]
    body = [ir.Let(tile, ir.BinOp("+", pid, ir.BinOp("*", tile_iter, P)), loc=k.loc)]
    body += _rasterize(tile, (bx, by), (gx, gy), k.swizzle, k.loc)
    trips = ir.BinOp("//", ir.BinOp("+", ir.BinOp("-", tiles, pid), ir.Const(num_programs - 1)), P)
    loop = ir.For(tile_iter, ir.Const(0), trips, ir.Seq(body + rest), loc=k.loc)
    kernel = dataclasses.replace(k, grid=(ir.BinOp("min", tiles, P),), block_vars=(pid,),
                                 body=ir.Seq(hoisted + [loop]), swizzle=None)
    attrs = dict(func.attrs, persistent_tile_loop=tile_iter, persistent_programs=num_programs)
    return dataclasses.replace(func, kernel=kernel, attrs=attrs)


def _rasterize(tile: ir.Var, block_vars, grid, swizzle, loc) -> list:
    """Lets binding the block vars of linear tile index `tile` (block_order.py's mapping)."""
    panel, order = swizzle
    major, minor = (0, 1) if order == "row" else (1, 0)
    size_major, size_minor = grid[major], grid[minor]
    c = ir.Const

    def let(name, value):
        var = ir.Var(f"_{name}")
        lets.append(ir.Let(var, value, loc=loc))
        return var

    lets = []
    span = ir.BinOp("*", c(panel), size_major)
    offset = let("in_panel", ir.BinOp("%", tile, span))
    index = let("panel", ir.BinOp("//", tile, span))
    width = let("width", ir.BinOp("min", ir.BinOp("-", size_minor, ir.BinOp("*", index, c(panel))), c(panel)))
    along = let("along", ir.BinOp("//", offset, width))
    # serpentine: odd panels walk back, so the tiles at a panel boundary stay L2-hot
    back = ir.BinOp("-", ir.BinOp("-", size_major, c(1)), ir.BinOp("*", c(2), along))
    lets.append(ir.Let(block_vars[major], ir.BinOp("+", along, ir.BinOp("*", ir.BinOp("%", index, c(2)), back)), loc=loc))
    lets.append(ir.Let(block_vars[minor], ir.BinOp("+", ir.BinOp("%", offset, width),
                                                   ir.BinOp("*", index, c(panel))), loc=loc))
    return lets


def _static(e):
    if isinstance(e, int):
        return e
    if isinstance(e, ir.Const) and isinstance(e.value, int):
        return e.value
    return None
