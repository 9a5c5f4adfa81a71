"""pipeline_injection: rewrite planned pipelined loops into prologue / steady state / epilogue
with explicit asynchronous copies, gemms and waits.

Assumes
-------
`pipeline_planning` (units + `PipelineSchedule`) and `buffer_versioning` (versioned buffers
indexed ``((var - start) // step) % S`` inside the loops that version them) ran.

Guarantees
----------
* Stages are normalised so the lowest is 0; ``D`` = max stage, ``n`` = trip count (an `Expr`
  when the bounds are dynamic, step > 0).  Time step ``t`` runs every unit of stage ``s`` for
  iteration ``i = t - s`` when ``0 <= i < n``, units in `orders` order:
    - prologue  t = 0 .. D-1, unrolled; units with i < 0 dropped, the rest guarded ``i < n``;
    - steady    ``For(kind="serial", pipelined_from=S)`` over t = D .. n-1, no guards;
    - epilogue  t = max(n, D) + e for e = 0 .. D-1, unrolled; stage-0 units (producers)
      dropped, the rest guarded ``t - s < n``.
  Every t in 0 .. n+D-1 runs exactly once, so any n (0, 1, < S, dynamic) is correct.
  The steady loop is `foldable` when every unit but the producers runs at stage D (every
  auto-planned loop but a deferred accumulation): its body is then also correct for
  t = n .. n+D-1 with each producer guarded ``iteration < n``, which is what the epilogue
  runs (consumer_loop_folding).
* Emission order within a time step: a user schedule (`order=` / `stage=`) is emitted in
  its `orders`.  An auto-planned schedule (TileLang's [0, .., 0, D] stages and program
  orders, kept as planned) is emitted stage by stage, program order within a stage:
    - D >= 2: *consumers first* (descending stage).  The steady state reads
      ``wait(copies t-D); gemm(t-D); WaitMMA(1); copies(t); commit``: the copies refill the
      slot the gemm of t-D-1 read, so only that gemm retires and one async gemm stays in
      flight across time steps, while the copies still land D-1 whole steps ahead of use.
    - D == 1: *producers first* (ascending stage): consumers-first would leave a copy no
      step of lead, and all producers form one commit group per step (one mbarrier phase).
  Units of different stages in one time step belong to different iterations, so either
  order keeps every same-iteration dependency.
* Deferred accumulation (auto-planned loops, stages [0, D]; under a runtime trip count only
  in CTAs of several warpgroups, see below):
  when the last consumer is an accumulating gemm G2 whose A operand is a fragment the loop
  computes (FlashAttention's ``O += P V`` after the softmax of ``S = Q K^T``), G2 and the
  units after the last write of its A operand (the ``O *= rescale``) move to stage D+1, the
  producers only they read (V) to stage D, and a time step is emitted as
  ``copies; early (up to the first gemm, QK^T of i); late (rescale + G2 of i-1); middle
  (softmax of i)``.  The tensor cores run G2(i-1) while the softmax of i computes; its
  `WaitMMA` lands before the write of G2's operand (the P cast).  Taken only when the
  early and late units touch disjoint buffers (their order within an iteration flips) and
  no late unit reads a slot a stage-0 copy of its step refills; needs ``S >= D + 2``
  versions no more than before (the late producers' slots stay D steps ahead).
  Under a runtime trip count (causal attention) the prologue and epilogue are guarded, which
  took a one-warpgroup CTA from 94 to 134 registers (causal 64x64 tiles: past the 128 that
  four CTAs per SM allow; 294 -> 269 TFLOP/s on an H100), while the split 128x128 kernel
  gained 1.07x (465 -> 497); CTAs of one warpgroup therefore defer only constant trip counts.
* Global->shared copies become `AsyncCopy(iteration=i, slot=version index)`; one
  `CommitGroup` per run of consecutive producers in a time step, emitted unconditionally
  (even when its producers are guarded off or dropped) so every time step commits the same
  number of groups.  A `WaitGroup(k)` precedes every unit that touches what a committed
  producer writes (its own iteration's data, or a slot an older copy still fills), k = the
  number of groups committed after the newest such group; it is skipped when an earlier wait
  of the same time step already covers it.
* In loops with D >= 1 gemms become `Gemm(is_async=True)`.  Before a unit that writes a
  region a possibly-pending async gemm reads, or touches its accumulator (another async gemm
  accumulating into it may chain), `WaitMMA(k)` retires the newest such gemm; k counts only
  the newer gemms that are certainly issued (slot conflicts come from the slot formulas: two
  accesses of a loop-versioned buffer hit the same slot iff their iterations are congruent
  mod S).  When that unit is conditional - a user `if` (or a guarded statement) whose
  condition, and the lets before it, read no buffer - the `WaitMMA` goes inside it instead
  (`_sink_wait`): only the steps whose condition holds retire the gemms, and the gemms stay
  possibly pending for the units after it (a later wait counts them as before; one that finds
  them already retired is a no-op).  FP8 GEMM's promotion every n k-steps then keeps a wgmma
  in flight across the other steps.  After the epilogue: `WaitMMA(0)` and `WaitGroup(0)` drain
  the loop.
* Everything a loop becomes (prologue, steady loop, epilogue, drains) is one `Seq`, so its
  commit groups and waits are never mistaken for a sibling loop's (codegen's barrier rings).
* With D == 0 (num_stages=1) the loop is one steady loop: async copies, a commit, a wait
  before the consumers, synchronous gemms, no versions.
The result is hazard-free under the interpreter's async model for every trip count.
"""
from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass

from tritile.ir import nodes as ir
from tritile.ir.dtypes import bool_
from tritile.ir.transform import Transformer, substitute_vars
from tritile.lowering.buffer_versioning import versioned_by
from tritile.lowering.consumer_partitions import several_warpgroups
from tritile.lowering.pipeline_planning import (
    accesses, is_producer, loop_depth, rebuild_unit, regions_may_overlap, split_unit,
)

# --------------------------------------------------------------------------------------
# small expression helpers
# --------------------------------------------------------------------------------------

_FOLD = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
         "%": operator.mod, "max": max, "min": min, "<": operator.lt, "<=": operator.le,
         ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne}


class _Folder(Transformer):
    """Folds integer constant arithmetic so prologue/epilogue indices read as numbers."""

    def visit_BinOp(self, e):
        if (e.op in _FOLD and isinstance(e.lhs, ir.Const) and isinstance(e.rhs, ir.Const)
                and isinstance(e.lhs.value, int) and isinstance(e.rhs.value, int)
                and not isinstance(e.lhs.value, bool) and not isinstance(e.rhs.value, bool)
                and not (e.op in ("//", "%") and e.rhs.value == 0)):
            return ir.Const(_FOLD[e.op](e.lhs.value, e.rhs.value), e.dtype)
        if e.op in ("+", "-") and isinstance(e.rhs, ir.Const) and e.rhs.value == 0:
            return e.lhs
        return e


def fold(node):
    return _Folder().transform(node)


def _sub(a, b: int):
    """``a - b`` for an int b, spelled ``a + |b|`` when b is negative."""
    return fold(ir.BinOp("-", a, ir.Const(b)) if b >= 0 else ir.BinOp("+", a, ir.Const(-b)))


def _lt(a, b):
    return fold(ir.BinOp("<", a, b, bool_))


def _trip_count(loop: ir.For) -> ir.Expr:
    diff = loop.stop if (isinstance(loop.start, ir.Const) and loop.start.value == 0) else \
        ir.BinOp("-", loop.stop, loop.start)
    if not (isinstance(loop.step, ir.Const) and loop.step.value == 1):
        diff = ir.BinOp("//", ir.BinOp("+", diff, ir.BinOp("-", loop.step, ir.Const(1))), loop.step)
    return fold(diff)


def _var_value(loop: ir.For, i: ir.Expr) -> ir.Expr:
    value = i if (isinstance(loop.step, ir.Const) and loop.step.value == 1) else ir.BinOp("*", i, loop.step)
    if not (isinstance(loop.start, ir.Const) and loop.start.value == 0):
        value = ir.BinOp("+", loop.start, value)
    return fold(value)


# --------------------------------------------------------------------------------------
# the loop as a template of units
# --------------------------------------------------------------------------------------


@dataclass
class _Unit:
    index: int
    stmt: ir.Stmt
    stage: int
    producer: bool
    run: int  # commit-group run (producers only)
    async_gemm: bool
    guarded: bool  # carries a block-sparse guard
    accesses: list


@dataclass
class _Inst:
    """An issued async gemm: unit and step (absolute, or relative to the current step)."""

    unit: _Unit
    step: int
    certain: bool


def _sink_wait(parts, wait: ir.WaitMMA):
    """`parts` (a split unit) with `wait` moved into its conditional part, or None when it
    has none or reads a buffer before it.  The wait then runs only when the unit's body
    does: into both branches of a user `if` whose condition (and the lets and guard around
    it) reads no buffer, else first thing inside the unit's guard when the guard and the
    lets before it read none.  FP8 GEMM's every-n-steps promotion (`if (k + 1) % n == 0:
    total += partial`) then retires its wgmmas only in the steps that promote, and the
    tensor cores keep one wgmma in flight across the other steps."""
    def reads(nodes):
        return any(accesses(n) for n in nodes)

    core, guard = parts.core, [] if parts.guard is None else [parts.guard]
    if isinstance(core, ir.If) and not reads(parts.outer_lets + guard + parts.inner_lets + [core.cond]):
        return dataclasses.replace(parts, core=dataclasses.replace(
            core, then_body=ir.Seq([wait] + core.then_body.stmts),
            else_body=None if core.else_body is None else ir.Seq([wait] + core.else_body.stmts)))
    if guard and not reads(parts.outer_lets + guard):
        return dataclasses.replace(parts, inner_lets=[wait] + parts.inner_lets)
    return None


class _Pipeline:
    def __init__(self, loop: ir.For, defer_runtime_trips: bool):
        self.loop = loop
        sched = loop.schedule
        low = min(sched.stages, default=0)
        self.depth = loop_depth(loop)  # S: the slot modulus used by buffer_versioning
        self.versioned = set(versioned_by(loop))
        stages = [s - low for s in sched.stages]
        self.D = max(stages, default=0)
        self.n = _trip_count(loop)
        deferred = None
        if loop.order is None and loop.stage is None and (isinstance(self.n, ir.Const) or defer_runtime_trips):
            deferred = _deferred_accumulation(loop.body.stmts, stages, self.D, self.depth)
        if deferred is not None:  # auto-planned two-gemm chain, see "Deferred accumulation"
            stages, emit = deferred
            self.D = max(stages)
        elif loop.order is not None or loop.stage is not None:
            emit = sorted(range(len(stages)), key=lambda j: sched.orders[j])
        elif self.D >= 2:  # auto-planned, see "Emission order" above
            emit = sorted(range(len(stages)), key=lambda j: (-stages[j], sched.orders[j]))
        else:
            emit = sorted(range(len(stages)), key=lambda j: (stages[j], sched.orders[j]))
        self.units, self.template, run, in_run = [], [], 0, False
        by_index = {}
        for j in emit:
            stmt = loop.body.stmts[j]
            core = split_unit(stmt).core
            producer = is_producer(core)
            if in_run and not producer:
                self.template.append(("commit", run - 1))
            if producer and not in_run:
                run += 1
            in_run = producer
            unit = _Unit(j, stmt, stages[j], producer, run - 1, self.D >= 1 and isinstance(core, ir.Gemm),
                         split_unit(stmt).guard is not None, accesses(stmt))
            by_index[j] = unit
            self.template.append(("unit", unit))
        if in_run:
            self.template.append(("commit", run - 1))
        self.R = run
        self.run_stage = [min(u.stage for u in by_index.values() if u.producer and u.run == r) for r in range(run)]
        self.units = [by_index[j] for j in emit]

    # ---------------------------------------------------------------- conflicts
    def _same_place(self, buf, ra, ua, step_a, rb, ub, step_b) -> bool:
        if buf in self.versioned:
            if ((step_a - ua.stage) - (step_b - ub.stage)) % self.depth:
                return False
            return regions_may_overlap(ra, rb, skip_dims=1)
        return regions_may_overlap(ra, rb)

    def _producer_conflict(self, q: _Unit, dq: int, u: _Unit, du: int) -> bool:
        """Does unit u (at step du) touch what producer q (at step dq) writes?"""
        dst = split_unit(q.stmt).core.dst
        return any(a.buffer is dst.buffer and self._same_place(a.buffer, a.region, u, du, dst, q, dq)
                   for a in u.accesses)

    def _mma_conflict(self, g: _Inst, u: _Unit, du: int) -> bool:
        core = split_unit(g.unit.stmt).core
        mine = split_unit(u.stmt).core if u.async_gemm else None
        for a in u.accesses:
            for operand in (core.a, core.b):
                if a.write and a.buffer is operand.buffer and \
                        self._same_place(a.buffer, a.region, u, du, operand, g.unit, g.step):
                    return True
            if a.buffer is core.c.buffer and regions_may_overlap(a.region, core.c):
                if mine is not None and a.region == mine.c:
                    continue  # async gemms chain on one accumulator
                return True
        return False

    # ---------------------------------------------------------------- waits
    def _group_wait(self, u: _Unit, runs_before: int, first_step: int = None):
        """(k, iteration tag offset or None) for the WaitGroup unit u needs, or None.
        `first_step`: steps before it (relative) never ran (prologue)."""
        best = None
        for q in self.units:
            if not q.producer:
                continue
            for dq in range(-(self.depth + 1), 1):
                if dq == 0 and q.run >= runs_before:
                    continue
                if first_step is not None and (dq < first_step or dq - q.stage < first_step):
                    continue
                if not self._producer_conflict(q, dq, u, 0):
                    continue
                after = -dq * self.R + runs_before - (q.run + 1)
                if best is None or after < best[0]:
                    best = (after, q, dq)
        if best is None:
            return None
        after, q, dq = best
        tag = None
        if dq - q.stage == -u.stage and self._tag_unique(dq, q.run, runs_before):
            tag = dq - self.run_stage[q.run]
        return after, tag

    def _tag_unique(self, dq: int, run: int, runs_before: int) -> bool:
        """No group committed after (dq, run) carries the same iteration tag."""
        for r in range(self.R):
            d = dq - self.run_stage[run] + self.run_stage[r]
            newer = (d, r) > (dq, run)
            committed = d < 0 or (d == 0 and r < runs_before)
            if newer and committed:
                return False
        return True

    def _emit_step(self, t: ir.Expr, present, guard, pending: list, step: int, first_step=None,
                   certain=True) -> list:
        """Statements of one time step.  `pending` (async gemms possibly in flight, oldest first)
        is updated in place; `step` numbers this time step for slot arithmetic."""
        out, runs_before, covered = [], 0, None
        for kind, item in self.template:
            if kind == "commit":
                out.append(ir.CommitGroup(iteration=_sub(t, self.run_stage[item]), loc=self.loop.loc))
                runs_before += 1
                covered = None if covered is None else covered + 1
                continue
            u = item
            if not present(u):
                continue
            need = self._group_wait(u, runs_before, None if first_step is None else first_step - step)
            if need is not None and (covered is None or need[0] < covered):
                k, tag = need
                out.append(ir.WaitGroup(k, None if tag is None else _sub(t, -tag),
                                        loc=self.loop.loc))
                covered = k
            hits = [i for i, g in enumerate(pending) if self._mma_conflict(g, u, step)]
            branch_wait = None
            if hits:
                newer = pending[hits[-1] + 1:]
                wait = ir.WaitMMA(sum(g.certain for g in newer), loc=self.loop.loc)
                if u.producer or u.async_gemm or _sink_wait(split_unit(u.stmt), wait) is None:
                    out.append(wait)
                    pending[:] = newer
                else:  # waits only where the unit's body runs: the gemms stay possibly pending
                    branch_wait = wait
            out.append(self._instance(u, t, guard(u), branch_wait))
            if u.async_gemm:
                pending.append(_Inst(u, step, certain and not u.guarded))
        return out

    def _instance(self, u: _Unit, t: ir.Expr, guard, branch_wait: ir.WaitMMA = None) -> ir.Stmt:
        i = _sub(t, u.stage)
        stmt = fold(substitute_vars(u.stmt, {self.loop.var: _var_value(self.loop, i)}))
        parts = split_unit(stmt)
        if branch_wait is not None:
            parts = _sink_wait(parts, branch_wait)
        core = parts.core
        if u.producer:
            slot = core.dst.starts[0] if core.dst.buffer in self.versioned else None
            core = ir.AsyncCopy(core.src, core.dst, iteration=i, slot=slot, loc=core.loc)
        elif u.async_gemm:
            core = dataclasses.replace(core, is_async=True)
        stmt = rebuild_unit(dataclasses.replace(parts, core=core))
        return stmt if guard is None else ir.If(guard, ir.Seq([stmt]), loc=getattr(core, "loc", None))

    # ---------------------------------------------------------------- the rewrite
    def lower(self) -> list:
        D, n, const_n = self.D, self.n, isinstance(self.n, ir.Const)
        out, pending = [], []
        for tau in range(D):  # prologue
            out += self._emit_step(
                ir.Const(tau),
                present=lambda u, tau=tau: tau - u.stage >= 0 and (not const_n or tau - u.stage < n.value),
                guard=lambda u, tau=tau: None if const_n else _lt(ir.Const(tau - u.stage), n),
                pending=pending, step=tau, first_step=0, certain=False)
        if not (const_n and n.value <= D):  # steady state
            t = ir.Var(f"{self.loop.var.name}_t", self.loop.var.dtype)
            history = [_Inst(u, d, not u.guarded and u.stage - d <= D)
                       for d in range(-(self.depth + 1), 0) for u in self.units if u.async_gemm]
            body = self._emit_step(t, present=lambda u: True, guard=lambda u: None, pending=history, step=0)
            foldable = D >= 1 and all(u.producer or u.stage == D for u in self.units)
            out.append(ir.For(t, ir.Const(D), n, ir.Seq(body), kind="serial",
                              pipelined_from=self.depth, foldable=foldable, loc=self.loop.loc))
        base = ir.Const(max(n.value, D)) if const_n else ir.BinOp("max", n, ir.Const(D))
        pending = [_Inst(u, d, False) for d in range(-(self.depth + 1), 0) for u in self.units if u.async_gemm]
        for e in range(D):  # epilogue
            t = fold(ir.BinOp("+", base, ir.Const(e)))
            out += self._emit_step(
                t,
                present=lambda u, t=t: u.stage > 0 and not (const_n and t.value - u.stage >= n.value),
                guard=lambda u, t=t: None if const_n else _lt(_sub(t, u.stage), n),
                pending=pending, step=e, certain=False)
        if any(u.async_gemm for u in self.units):
            out.append(ir.WaitMMA(0, loc=self.loop.loc))
        if any(u.producer for u in self.units):
            out.append(ir.WaitGroup(0, loc=self.loop.loc))
        return out



def _deferred_accumulation(stmts: list, stages: list, D: int, depth: int):
    """(stages, emission order) that defers a loop's accumulating register-operand gemm by
    one iteration, or None when the loop is not that shape.  See "Deferred accumulation"."""
    if D < 1 or depth < D + 1 or any(s not in (0, D) for s in stages):
        return None
    cores = [split_unit(s).core for s in stmts]
    acc = [accesses(s) for s in stmts]
    producers = [j for j, c in enumerate(cores) if is_producer(c)]
    if any(stages[j] != 0 for j in producers):
        return None
    consumers = [j for j in range(len(stmts)) if j not in producers]
    gemms = [j for j in consumers if isinstance(cores[j], ir.Gemm)]
    if len(gemms) < 2 or gemms[-1] != consumers[-1]:
        return None
    first, last = gemms[0], cores[gemms[-1]]
    if last.a.buffer.scope != "fragment" or last.clear_accum:
        return None
    writers = [j for j in consumers if j < gemms[-1] and any(a.write and a.buffer is last.a.buffer for a in acc[j])]
    if not writers or first > writers[-1]:
        return None
    early = [j for j in consumers if j <= first]
    middle = [j for j in consumers if first < j <= writers[-1]]
    late = [j for j in consumers if j > writers[-1]]

    def touches(j, buf, write_only=False):
        return any(a.buffer is buf and (a.write or not write_only) for a in acc[j])

    def dependent(x, y):
        return any(touches(y, a.buffer, write_only=not a.write) for a in acc[x])

    if any(dependent(e, l) for e in early for l in late):
        return None
    late_producers = []
    for p in producers:
        readers = [j for j in consumers if touches(j, cores[p].dst.buffer)]
        if readers and all(j in late for j in readers):
            late_producers.append(p)
        elif any(j in late for j in readers):
            return None  # a late unit would read a slot its own step already refilled
    new_stages = list(stages)
    for j in late:
        new_stages[j] = D + 1
    for p in late_producers:
        new_stages[p] = D
    emit = [p for p in producers if p not in late_producers] + late_producers + early + late + middle
    return new_stages, emit


class _Injector(Transformer):
    def __init__(self, defer_runtime_trips: bool):
        self.defer_runtime_trips = defer_runtime_trips

    def visit_For(self, loop):
        if loop.kind != "pipelined" or loop.schedule is None:
            return loop
        # one Seq per pipelined loop: code generators rely on it to tell which commit groups
        # and waits belong to which loop's barrier ring (a loop with no steady-state For,
        # e.g. a trip count of 0, still owns its empty groups and drains)
        return ir.Seq(_Pipeline(loop, self.defer_runtime_trips).lower(), loc=loop.loc)


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    return _Injector(several_warpgroups(func.kernel)).transform(func)
