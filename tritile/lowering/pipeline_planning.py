"""pipeline_planning: decide the stage and order of every statement of a `T.Pipelined` loop.

Assumes
-------
The frontend's IR: a pipelined loop is ``For(kind="pipelined")`` carrying TileLang's
`num_stages` and optional manual `order` / `stage` lists.

Guarantees
----------
* Every pipelined loop with ``num_stages >= 1`` or a manual `order`/`stage` gets a
  `PipelineSchedule` with one entry per top-level statement of its (normalised) body; a loop
  with ``num_stages == 0`` and no manual schedule is left untouched (a serial loop).
* The body is normalised into *units*, one per scheduled statement::

      unit := [Seq(Let*, ...)] [If(guard, Seq(Let*, ...))] core

  - Scalar `Let`s are *replayed*, not scheduled: each unit carries a copy of the `Let`s its
    core (or guard) uses, so that every statement recomputes its scalars for the iteration it
    runs for once pipeline injection shifts it to another time step.
  - A body that is a single `If` without else (block-sparse ``if mask[k]: copy; copy; gemm``)
    has its guard distributed onto each statement (TileLang's IfStmtBinding).
  - Top-level `Alloc`s without an initial value are hoisted in front of the loop (their
    contents are undefined at every iteration start anyway).
* Automatic rule (TileLang's): a global->shared `Copy` is a producer at stage 0, every other
  unit a consumer at stage ``S - 1``, where S is `num_stages`, capped by the loop's static
  maximum trip count (`ir.bounds.max_trip_count`) when it has one; orders follow program
  order.  Manual `order=`/`stage=` lists are honoured.
* Every schedule, automatic or manual, keeps the program's same-iteration dependencies: a
  statement that reads (or overwrites) a buffer another statement wrote or read earlier in
  program order runs after it (lower stage, or same stage and lower order).  A schedule that
  breaks one - a bad manual plan, or a body that reads a shared tile and then overwrites it
  (TileLang #2668) - is a `CompileError` quoting the loop's location; it is never lowered
  into wrong code.  So are two global->shared copies of one iteration into overlapping tiles:
  pipelined, both are in flight at once.
* A loop whose stages no shared memory holds (`stages - 1` copies of the tiles it loads
  already over the target's) is a `CompileError` at the loop, before pipeline injection
  unrolls its prologue (`check_stages_fit`).

The unit helpers (`split_unit`, `rebuild_unit`, `lets_needed`, `is_producer`, `accesses`, `loop_depth`) are
the vocabulary the later pipeline passes share.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from tritile.errors import CompileError
from tritile.ir import nodes as ir
from tritile.ir.bounds import let_bindings, max_trip_count
from tritile.ir.transform import Transformer, walk
from tritile.lowering.shared_memory_budget import buffer_bytes


# --------------------------------------------------------------------------------------
# units
# --------------------------------------------------------------------------------------


@dataclass
class UnitParts:
    """A scheduled statement taken apart: ``outer_lets; if guard: inner_lets; core``."""

    outer_lets: list
    guard: Optional[ir.Expr]
    inner_lets: list
    core: ir.Stmt
    guard_loc: Optional[ir.SourceLoc] = None


def split_unit(stmt: ir.Stmt) -> UnitParts:
    outer, guard, inner, guard_loc = [], None, [], None
    if isinstance(stmt, ir.Seq) and _lets_then_one(stmt.stmts):
        outer, stmt = list(stmt.stmts[:-1]), stmt.stmts[-1]
    if isinstance(stmt, ir.If) and stmt.else_body is None and _is_unit_guard(stmt):
        guard, guard_loc = stmt.cond, stmt.loc
        inner, stmt = list(stmt.then_body.stmts[:-1]), stmt.then_body.stmts[-1]
    return UnitParts(outer, guard, inner, stmt, guard_loc)


def _lets_then_one(stmts: list) -> bool:
    return bool(stmts) and all(isinstance(s, ir.Let) for s in stmts[:-1]) and not isinstance(stmts[-1], ir.Let)


def _is_unit_guard(stmt: ir.If) -> bool:
    return _lets_then_one(stmt.then_body.stmts)


def rebuild_unit(parts: UnitParts) -> ir.Stmt:
    stmt = parts.core
    if parts.guard is not None:
        stmt = ir.If(parts.guard, ir.Seq(list(parts.inner_lets) + [stmt]), loc=parts.guard_loc)
    if parts.outer_lets:
        stmt = ir.Seq(list(parts.outer_lets) + [stmt])
    return stmt


def is_producer(core: ir.Stmt) -> bool:
    """A global->shared tile copy: what pipelining turns into an async copy."""
    return (isinstance(core, ir.Copy) and core.src.buffer.scope == "global"
            and core.dst.buffer.scope == "shared")


def loop_depth(loop: ir.For) -> int:
    """Number of pipeline stages of a planned loop (its max stage + 1)."""
    return max(loop.schedule.stages, default=0) + 1


def planned_loops(node):
    """Pipelined loops that carry a schedule, below `node`."""
    return [n for n in walk(node) if isinstance(n, ir.For) and n.kind == "pipelined" and n.schedule is not None]


# --------------------------------------------------------------------------------------
# memory accesses
# --------------------------------------------------------------------------------------


@dataclass
class Access:
    """One buffer touched by a statement; `region` is None for element accesses (the whole
    buffer is assumed)."""

    buffer: ir.Buffer
    region: Optional[ir.Region]
    write: bool


def accesses(stmt) -> list:
    """Every buffer read or written below `stmt` (tile-op regions and element Load/Store)."""
    out = []
    for node in walk(stmt):
        out.extend(_direct_accesses(node))
    return out


def _direct_accesses(node) -> list:
    def rd(r):
        return Access(r.buffer, r, False)

    def wr(r):
        return Access(r.buffer, r, True)

    if isinstance(node, (ir.Copy, ir.AsyncCopy, ir.Cumsum)):
        return [rd(node.src), wr(node.dst)]
    if isinstance(node, ir.Gemm):
        return [rd(node.a), rd(node.b)] + ([] if node.clear_accum else [rd(node.c)]) + [wr(node.c)]
    if isinstance(node, ir.Fill):
        return [wr(node.dst)]
    if isinstance(node, ir.Reduce):
        return [rd(node.src)] + ([] if node.clear else [rd(node.dst)]) + [wr(node.dst)]
    if isinstance(node, ir.AtomicAdd):
        src = [rd(node.value)] if isinstance(node.value, ir.Region) else []
        return src + [rd(node.dst), wr(node.dst)]
    if isinstance(node, ir.Load):
        return [Access(node.buffer, None, False)]
    if isinstance(node, ir.Store):
        return [Access(node.buffer, None, True)]
    return []


def regions_may_overlap(a: Optional[ir.Region], b: Optional[ir.Region], skip_dims: int = 0) -> bool:
    """False only when both regions have constant starts that are provably disjoint in some
    dimension (the first `skip_dims` dimensions - a version index - are ignored)."""
    if a is None or b is None:
        return True
    for sa, ea, sb, eb in list(zip(a.starts, a.extents, b.starts, b.extents))[skip_dims:]:
        if isinstance(sa, ir.Const) and isinstance(sb, ir.Const):
            if sa.value + ea <= sb.value or sb.value + eb <= sa.value:
                return False
    return True


def conflicts(first: list, second: list) -> list:
    """Buffers on which two access lists conflict (same buffer, overlapping, one writes)."""
    out = []
    for x in first:
        for y in second:
            if x.buffer is y.buffer and (x.write or y.write) and regions_may_overlap(x.region, y.region):
                if x.buffer not in out:
                    out.append(x.buffer)
    return out


# --------------------------------------------------------------------------------------
# planning
# --------------------------------------------------------------------------------------


def _vars_in(node) -> set:
    return {id(n) for n in walk(node) if isinstance(n, ir.Var)}


def lets_needed(node, lets: list) -> list:
    """The `Let`s (in order) that `node` uses, directly or through other Lets."""
    needed = _vars_in(node)
    chosen = []
    for let in reversed(lets):
        if id(let.var) in needed:
            chosen.append(let)
            needed |= _vars_in(let.value)
    return list(reversed(chosen))


def _normalise_body(loop: ir.For):
    """(hoisted Allocs, units) of a pipelined loop's body."""
    hoisted, lets, plain = [], [], []

    def take(stmts, into_lets, into_plain):
        for s in stmts:
            if isinstance(s, ir.Alloc):
                if s.init is not None:
                    raise CompileError(f"T.Pipelined: {s.buffer.name} is allocated with an initial value "
                                       f"inside the pipelined loop; allocate it before the loop", s.loc or loop.loc)
                hoisted.append(s)
            elif isinstance(s, ir.Let):
                into_lets.append(s)
            else:
                into_plain.append((s, list(into_lets)))

    take(loop.body.stmts, lets, plain)
    if len(plain) == 1 and isinstance(plain[0][0], ir.If) and plain[0][0].else_body is None:
        guard_if, outer_visible = plain[0]
        inner_lets, inner_plain = [], []
        take(guard_if.then_body.stmts, inner_lets, inner_plain)
        units = []
        for core, inner_visible in inner_plain:
            parts = UnitParts(lets_needed([guard_if.cond, core], outer_visible), guard_if.cond,
                              lets_needed(core, inner_visible), core, guard_if.loc)
            units.append(rebuild_unit(parts))
        return hoisted, units
    return hoisted, [rebuild_unit(UnitParts(lets_needed(core, visible), None, [], core))
                     for core, visible in plain]


def _describe(unit: ir.Stmt) -> str:
    core = split_unit(unit).core
    loc = getattr(core, "loc", None)
    return f"{type(core).__name__}" + (f" at line {loc.lineno}" if loc is not None else "")


def check_dependencies(loop: ir.For, units: list, stages: list, orders: list, manual: bool):
    """Raise CompileError when the schedule runs a statement before one it depends on within
    the same iteration, or two copies of one iteration into overlapping shared tiles."""
    acc = [accesses(u) for u in units]
    pairs = [(j, k, conflicts(acc[j], acc[k])) for j in range(len(units)) for k in range(j + 1, len(units))]
    for j, k, shared in pairs:
        if shared and (stages[k], orders[k]) <= (stages[j], orders[j]):
            names = ", ".join(b.name for b in shared)
            kind = "manual" if manual else f"num_stages={loop.num_stages}"
            raise CompileError(
                f"T.Pipelined schedule ({kind}: stage={stages}, order={orders}) breaks a dependency: "
                f"statement {k} ({_describe(units[k])}) must run after statement {j} "
                f"({_describe(units[j])}) because both access {names}, but it is scheduled at "
                f"stage {stages[k]} order {orders[k]} vs stage {stages[j]} order {orders[j]}"
                + ("" if manual else "; a body that reads a shared tile and later overwrites it in the "
                   "same iteration cannot be pipelined (use num_stages=0/1 or separate buffers)"),
                loop.loc)
    producers = [is_producer(split_unit(u).core) for u in units]
    for j, k, shared in pairs:
        if shared and producers[j] and producers[k]:
            # async copies land in any order: the later would not reliably overwrite the earlier
            # (a mutated GEMM loading B's tile into A_shared too; the interpreter's hazard check
            # caught it)
            raise CompileError(
                f"T.Pipelined: statements {j} ({_describe(units[j])}) and {k} ({_describe(units[k])}) both "
                f"copy into {', '.join(b.name for b in shared)} in one iteration; pipelined, they are "
                f"asynchronous copies that land in any order (use separate buffers, or num_stages=0)", loop.loc)


def capped_stages(loop: ir.For, stages: int, bindings: dict = None) -> int:
    """`stages` capped by `loop`'s largest trip count (`ir.bounds.max_trip_count`; one at least)
    where it has one: a loop of at most n iterations gains nothing from more than n stages (the
    extra prologue steps are all guarded off).  Triton's LLVM lowering asserted on such
    prologues (causal attention whose key loop is shorter than its stages), and its pipeliner
    spent minutes on `num_stages=4096` over four iterations (a mutated attention backward)."""
    trips = max_trip_count(loop, bindings)
    return stages if trips is None else min(stages, max(trips, 1))


def check_stages_fit(loop: ir.For, stages: int, shared_limit: Optional[int]) -> None:
    """A CompileError at `loop` where `stages` - 1 copies of the shared tiles its body loads
    from global memory (the loads a pipeline keeps ahead) already exceed `shared_limit` bytes:
    `num_stages=4096` over a runtime trip count took the passes two minutes to reach the shared
    memory budget's error, and Triton's pipeliner longer (a mutated GEMM and attention backward)."""
    if shared_limit is None or stages <= 1:
        return
    loaded = {id(n.dst.buffer): n.dst.buffer for n in walk(loop.body)
              if isinstance(n, ir.Copy) and n.dst.buffer.scope == "shared" and n.src.buffer.scope == "global"}
    sizes = {buf.name: buffer_bytes(buf) for buf in loaded.values()}
    if (stages - 1) * sum(sizes.values()) > shared_limit:
        tiles = ", ".join(f"{name} {size} B" for name, size in sizes.items())
        raise CompileError(f"T.Pipelined with {stages} stages: {stages - 1} copies of the shared tiles it loads "
                           f"({tiles}) need {(stages - 1) * sum(sizes.values())} bytes, more than the "
                           f"{shared_limit} bytes of shared memory available; use smaller tiles or fewer stages",
                           loop.loc)


def plan_loop(loop: ir.For, bindings: dict = None, shared_limit: Optional[int] = None):
    """The planned loop, preceded by the Allocs hoisted out of its body; `bindings`: the
    function's `Let` values (`ir.bounds.let_bindings`), which may bound its trip count;
    `shared_limit`: the target's shared memory, which its stages must leave room in
    (`check_stages_fit`)."""
    manual = loop.order is not None or loop.stage is not None
    if loop.kind != "pipelined" or loop.schedule is not None or (loop.num_stages < 1 and not manual):
        return loop
    hoisted, units = _normalise_body(loop)
    n = len(units)
    for name, given in (("order", loop.order), ("stage", loop.stage)):
        if given is not None and len(given) != n:
            raise CompileError(f"T.Pipelined {name}= has {len(given)} entries but the loop body has {n} "
                               f"scheduled statements (scalar bindings are not counted)", loop.loc)
    if loop.stage is not None:
        stages = [int(s) for s in loop.stage]
        if any(s < 0 for s in stages):
            raise CompileError(f"T.Pipelined stage= entries must be >= 0, got {stages}", loop.loc)
    else:
        last = max(capped_stages(loop, loop.num_stages, bindings), 1) - 1
        stages = [0 if is_producer(split_unit(u).core) else last for u in units]
    check_stages_fit(loop, max(stages) + 1, shared_limit)
    orders = [int(o) for o in loop.order] if loop.order is not None else list(range(n))
    if sorted(orders) != list(range(n)):
        raise CompileError(f"T.Pipelined order= must be a permutation of 0..{n - 1}, got {orders}", loop.loc)
    check_dependencies(loop, units, stages, orders, manual)
    planned = dataclasses.replace(loop, body=ir.Seq(units, loop.body.loc),
                                  schedule=ir.PipelineSchedule(stages, orders))
    return hoisted + [planned] if hoisted else planned


class _Planner(Transformer):
    def __init__(self, bindings: dict, shared_limit: Optional[int]):
        self.bindings, self.shared_limit = bindings, shared_limit

    def visit_For(self, loop):
        return plan_loop(loop, self.bindings, self.shared_limit)


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    return _Planner(let_bindings(func), getattr(target, "shared_memory_limit", None)).transform(func)
