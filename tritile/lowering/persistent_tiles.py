"""Persistent tile scheduling: a grid of one program per SM, each looping over output tiles.

Input: a lowered `PrimFunc` (runs after layout inference) whose kernel has a grid of 1 to 3
dims.  Output: the same program with

    Kernel(grid=(min(tiles, P),), block_vars=(pid,)):
        <shared allocations of the body>           # hoisted: one allocation for every tile
        for tile_iter in range(<pid's share of the tiles>):
            tile = tile_iter * P + (pid, or P - 1 - pid when tile_iter is odd)
            bx = ...; by = ...                      # the block vars of `tile`
            <the rest of the body>

where ``tiles`` = the product of the grid and P = the number of programs.  Programs running
at the same time work on consecutive `tile` values, which map to block vars as a plain launch
orders its blocks (the first grid dim fastest) or, on a 2-D grid with a `T.use_swizzle` hint,
by TileLang's panel rasterisation (codegen/block_order.py's mapping), so the tiles in
flight share operands as in a plain launch.  Rounds alternate direction (pid, then P - 1 -
pid): when a tile's cost grows along the launch order (causal attention's row blocks), each
program's rounds then alternate cheap and dear tiles - for 4x32x32 causal tiles on 132
programs the dearest program's share drops from 1.117x to 1.031x the mean.

Tiles of different costs (a pipelined loop whose trip count depends on the block vars,
computable at compile time) are dealt from a schedule table instead, where that evens the
programs' work out better (`balanced_schedule`: longest first within windows of whole rows,
each tile to the least-loaded program; 1.000x the mean for those causal tiles):

        for tile_iter in range(tile_schedule[pid]):
            tile = tile_schedule[P + pid * stride + tile_iter]

`tile_schedule` is an `ir.ConstTable` (int32 values fixed at compile time, read through
`ir.TableRead`); the Gluon backend passes it as one more kernel argument, which the runtime
copies to each device once.

Every tile is computed exactly once, by the same body, so values are unchanged (the
interpreter runs the result as is).  A warp-specialized kernel split into
`ConsumerPartitions` keeps the split at the top: the tile loop goes inside it, each consumer
partition walking the same tiles.

The tile loop's var is recorded as ``func.attrs["persistent_tile_loop"]``; the Gluon backend
then allocates each pipelined loop's mbarrier ring once, before the tile loop, and continues
each slot's phase across tiles (tiles may have different trip counts), lets a TMA-store
epilogue of one tile complete under the next tile's main loop and, under warp
specialization, lets the producer load the next tile's first stages while the consumers
finish the current tile.

When (``run``, ``TRITILE_PERSISTENT``): ``auto`` (the default) for warp-specialized CUDA
kernels, ``1`` wherever applicable, ``0`` never.  Kernels without warp specialization stay
as they are in ``auto``: on an H100 persistence measured neutral for examples/gemm.py
(bench/NOTES.md, 2026-11-22: within +-3% of the plain launch at 4096^3, 8192^3, 1024x8192^2).
Applicable: see `applicable`; and the kernel's shared buffers must fit the target all allocated
at once (hoisted above the tile loop, they no longer reuse each other's bytes:
ir/shared_lifetimes.py), else the kernel stays as it is.  `persist(func, num_programs)` applies it unconditionally
(tests use small program counts).
"""
from __future__ import annotations

import dataclasses
import heapq

from tritile.ir import nodes as ir
from tritile.ir.transform import top_level, walk
from tritile.lowering.shared_memory_budget import fits_allocated_at_once
from tritile.switches import schedule_switch

# SM counts of the default GPU of each architecture, used when no GPU is present
DEFAULT_NUM_SMS = {90: 132, 89: 128, 86: 84, 80: 108}


def num_sms(target) -> int:
    """Streaming multiprocessors of the current GPU, else the target architecture's default."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return DEFAULT_NUM_SMS.get(target.arch, 132)


def mode() -> str:
    """"on", "off" or "auto" (the default), from TRITILE_PERSISTENT."""
    return schedule_switch("TRITILE_PERSISTENT")


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    chosen = mode()
    if target.kind != "cuda" or chosen == "off" or not applicable(func):
        return func
    if chosen == "auto" and "warp_specialization" not in func.attrs:
        return func
    if not fits_allocated_at_once(func, target):  # hoisted buffers no longer share bytes
        return func
    return persist(func, num_sms(target))


def applicable(func: ir.PrimFunc) -> bool:
    """A grid of 1 to 3 dims (a swizzle hint only on a 2-D grid), and under warp
    specialization exactly one pipelined loop whose buffers nothing before it touches (the
    producer walks one ring per tile, and the consumers release its slots only from the
    loop on: see codegen/gluon/warp_specialize.py)."""
    k = func.kernel
    if not 1 <= len(k.grid) <= 3 or (k.swizzle is not None and (len(k.grid) != 2 or k.swizzle[1] not in ("row", "column"))):
        return False
    if "warp_specialization" in func.attrs:
        loops = [n for n in walk(k.body) if isinstance(n, ir.For) and n.pipelined_from > 0]
        return len(loops) == 1 and not _ring_used_before(k.body)
    return True


def _ring_used_before(body: ir.Seq) -> bool:
    """Does a statement before the first async copy read or write a buffer the copies fill?"""
    filled = {id(n.dst.buffer) for n in walk(body) if isinstance(n, ir.AsyncCopy)}
    for s in top_level(body):
        nodes = list(walk(s))
        if any(isinstance(n, ir.AsyncCopy) for n in nodes):
            return False
        if not isinstance(s, ir.Alloc) and any(
                isinstance(getattr(n, "buffer", None), ir.Buffer) and id(n.buffer) in filled for n in nodes):
            return True
    return False


def persist(func: ir.PrimFunc, num_programs: int, alternate: bool = True, balance: bool = True) -> ir.PrimFunc:
    """`func` on `num_programs` programs; `alternate`: rounds alternate direction (else
    every round deals tile pid + round * P to program pid); `balance`: deal tiles of
    different costs from a schedule table where it evens the programs' work out better
    (see `balanced_schedule`)."""
    if "persistent_tile_loop" in func.attrs:
        raise ValueError(f"kernel {func.name!r} already walks its tiles on "
                         f"{func.attrs['persistent_programs']} programs")
    k = func.kernel
    tiles = k.grid[0]
    for extent in k.grid[1:]:
        tiles = ir.BinOp("*", tiles, extent)
    pid = ir.Var("pid")
    tile_iter = ir.Var("tile_iter")
    tile = ir.Var("tile")
    P = ir.Const(num_programs)
    hoisted = [s for s in k.body.stmts if isinstance(s, ir.Alloc) and s.buffer.scope == "shared"]
    rest = [s for s in k.body.stmts if not (isinstance(s, ir.Alloc) and s.buffer.scope == "shared")]
    c = ir.Const

    def snake(round_):  # pid's place in round `round_`: pid, or P - 1 - pid in odd rounds
        if not alternate:
            return pid
        return ir.BinOp("+", pid, ir.BinOp("*", ir.BinOp("%", round_, c(2)), ir.BinOp("-", c(num_programs - 1),
                                                                                     ir.BinOp("*", c(2), pid))))

    decode = (_rasterize(tile, k.block_vars, k.grid, k.swizzle, k.loc) if k.swizzle is not None
              else _launch_order(tile, k.block_vars, k.grid, k.loc))
    table = balanced_schedule(k, tile, decode, rest, num_programs, alternate) if balance else None
    if table is not None:  # counts[P], then each program's tiles in a row of `stride`
        stride = (len(table.values) - num_programs) // num_programs
        trips = ir.TableRead(table, pid)
        dealt = ir.TableRead(table, ir.BinOp("+", ir.BinOp("+", P, ir.BinOp("*", pid, c(stride))), tile_iter))
    else:
        # `min` with the last tile is the identity (`trips` stops each program before it runs out of
        # tiles) but bounds the tile for the codegen's interval analysis, which cannot see that a
        # round's snake and `trips` depend on pid together: block indices decoded from the tile then
        # provably stay inside the grid, and tile accesses along them need no mask
        dealt = ir.BinOp("min", ir.BinOp("+", ir.BinOp("*", tile_iter, P), snake(tile_iter)),
                         ir.BinOp("-", tiles, c(1)))
        rounds = ir.BinOp("//", tiles, P)  # full rounds; the last, partial one has tiles % P tiles
        in_last = ir.BinOp("min", ir.BinOp("max", ir.BinOp("-", ir.BinOp("%", tiles, P), snake(rounds)), c(0)), c(1))
        trips = ir.BinOp("+", rounds, in_last)
    body = [ir.Let(tile, dealt, loc=k.loc)] + decode
    split = rest[0] if len(rest) == 1 and isinstance(rest[0], ir.ConsumerPartitions) else None
    if split is not None:  # each consumer partition walks the tiles (the split stays top level)
        loop = ir.For(tile_iter, ir.Const(0), trips, ir.Seq(body + split.body.stmts), loc=k.loc)
        top = dataclasses.replace(split, body=ir.Seq([loop]))
    else:
        top = loop = ir.For(tile_iter, ir.Const(0), trips, ir.Seq(body + rest), loc=k.loc)
    kernel = dataclasses.replace(k, grid=(ir.BinOp("min", tiles, P),), block_vars=(pid,),
                                 body=ir.Seq(hoisted + [top]), swizzle=None)
    attrs = dict(func.attrs, persistent_tile_loop=tile_iter, persistent_programs=num_programs)
    return dataclasses.replace(func, kernel=kernel, attrs=attrs)


def balanced_schedule(k: ir.Kernel, tile: ir.Var, decode: list, body: list, num_programs: int, alternate: bool):
    """A `ConstTable` dealing the tiles of kernel `k` to `num_programs` programs, or None
    where the rounds of `persist` do as well.

    A tile's cost is the trip counts of its pipelined loops, plus one for its prologue and
    epilogue, from the Lets of `body` and the block vars `decode` binds from linear tile
    index `tile` (in a split kernel, of the partition whose loops run longest); it must be
    computable at compile time (static grid, no runtime dims or memory reads), else None.
    The tiles are dealt by `deal_longest_first`; the table is used only if its busiest
    program has less work than the busiest of the rounds (`round_loads`).

    Layout: ``counts[P]`` (tiles per program), then program p's tiles at
    ``P + p * stride + i`` (``stride`` = the most tiles a program gets)."""
    costs = _tile_costs(k, tile, decode, body)
    if costs is None or len(costs) <= num_programs or len(set(costs)) == 1:
        return None
    row = _static(k.grid[0]) if k.swizzle is None else 1
    dealt = deal_longest_first(costs, num_programs, row)
    busiest = max(sum(costs[t] for t in tiles) for tiles in dealt)
    if busiest >= max(round_loads(costs, num_programs, alternate)):
        return None
    stride = max(len(tiles) for tiles in dealt)
    values = [len(tiles) for tiles in dealt]
    for tiles in dealt:
        values += tiles + [0] * (stride - len(tiles))
    return ir.ConstTable("tile_schedule", tuple(values))


def deal_longest_first(costs: list, num_programs: int, row: int) -> list:
    """Each program's tiles (indices into `costs`, in the order it runs them).  Tiles are
    listed in windows of whole rows of `row` tiles, about one tile per program, longest
    first within a window, and each goes to the program with the least work so far:
    programs still work on neighbouring tiles at any time (shared K/V or operand panels
    stay in L2), and each window's short tiles fill in behind its long ones, where equal
    rounds leave a long tail (causal attention: 1.031x the mean for the busiest program of
    4x32x32 tiles on 132, 1.000x this way; bench/tile_balance.py)."""
    window = row * max(1, round(num_programs / row))
    order = []
    for start in range(0, len(costs), window):
        order += sorted(range(start, min(start + window, len(costs))), key=lambda t: -costs[t])
    loads = [(0, p) for p in range(num_programs)]
    dealt = [[] for _ in range(num_programs)]
    for t in order:
        load, p = heapq.heappop(loads)
        dealt[p].append(t)
        heapq.heappush(loads, (load + costs[t], p))
    return dealt


def round_loads(costs: list, num_programs: int, alternate: bool = True) -> list:
    """Each program's work when `persist`'s rounds deal the tiles (tile = round * P + pid,
    or P - 1 - pid in odd rounds when `alternate`)."""
    loads = [0] * num_programs
    for t, cost in enumerate(costs):
        round_, place = divmod(t, num_programs)
        loads[num_programs - 1 - place if alternate and round_ % 2 else place] += cost
    return loads


def _tile_costs(k: ir.Kernel, tile: ir.Var, decode: list, body: list):
    """Each tile's cost (see `balanced_schedule`), in launch order, or None.  All tiles at
    once: the interpreter's evaluator (the IR's integer semantics) on a tensor of tile ids."""
    import torch

    from tritile.errors import CompileError
    from tritile.interpreter.expressions import Evaluator

    grid = [_static(e) for e in k.grid]
    loops = [n for n in walk(body) if isinstance(n, ir.For) and n.pipelined_from > 0]
    if None in grid or not loops or any(isinstance(n, ir.Load) for loop in loops for n in walk(loop.stop)):
        return None
    tiles = 1
    for extent in grid:
        tiles *= extent
    split = next((s for s in body if isinstance(s, ir.ConsumerPartitions)), None)
    lets = [s for s in top_level(ir.Seq(decode + list(body))) if isinstance(s, ir.Let)]
    costs = None
    for part in range(split.count if split is not None else 1):
        env = {tile: torch.arange(tiles, dtype=torch.int64)}
        if split is not None:
            env[split.var] = part
        evaluator = Evaluator(env, None)
        for let in lets:  # Lets that read memory, or use unbound vars, stay unbound
            if any(isinstance(n, ir.Load) for n in walk(let.value)):
                continue
            try:
                env[let.var] = evaluator.eval(let.value)
            except CompileError:
                continue
        try:
            trips = sum(torch.as_tensor(evaluator.eval(n.pipeline_trips)).clamp(min=0) for n in loops) + 1
        except CompileError:
            return None
        trips = torch.broadcast_to(trips, (tiles,))
        costs = trips if costs is None else torch.maximum(costs, trips)
    return [int(c) for c in costs]




def _launch_order(tile: ir.Var, block_vars, grid, loc) -> list:
    """Lets binding the block vars of linear tile index `tile` in a plain launch's order
    (the first grid dim varies fastest)."""
    lets, rest = [], tile
    for n, (var, extent) in enumerate(zip(block_vars, grid)):
        last = n == len(grid) - 1
        lets.append(ir.Let(var, rest if last else ir.BinOp("%", rest, extent), loc=loc))
        rest = ir.BinOp("//", rest, extent)
    return lets


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
    # clamped to the grid, which no tile leaves: the range analysis (codegen/signs.py) cannot bound
    # offset // width by itself, and without it cannot prove the serpentine's index >= 0 - which
    # a TMA store's start must be (codegen/semantics.py: tma_may_store)
    along = let("along", ir.BinOp("min", ir.BinOp("//", offset, width), ir.BinOp("-", size_major, c(1))))
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
