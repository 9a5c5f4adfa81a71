"""mbarrier rings for TMA pipelines: which async statements belong to which pipelined loop.

Assumes pipeline_injection's output: one `Seq` per pipelined loop,
``[prologue time steps] For(t, D, n, pipelined_from=S) [epilogue time steps] [drains]``, where every
time step commits exactly one group per producer run, `AsyncCopy.iteration` /
`CommitGroup.iteration` are 0-based iteration indices (valid when ``0 <= i < n``, the loop's
`stop`), and iteration ``i`` lives in slot ``i % S``.  A loop consumer_loop_folding folded runs
``For(t, D, n + D, trips=n)`` with no epilogue after it, its copies under ``if i < n:`` (n is
then `For.pipeline_trips`).  Between two pipelined loops of one
Seq, statements before the first `AsyncCopy` of the gap are the previous loop's epilogue,
the rest the next loop's prologue.

A loop gets a TMA ring only when its body commits ONE group per time step (so the groups
committed are iterations 0, 1, 2, ... in order) and its steady-state copies are not under
a data-dependent guard; otherwise its copies use cp.async (always correct).  With one group
per step, `WaitGroup(k)` means "iteration (newest committed) - k has landed": the newest
committed group is the nearest `CommitGroup` before the wait in its section (prologue,
body, epilogue), or the nearest one after it minus one (the previous time step).  Waits on
iterations outside ``[0, n)`` (empty groups) are predicated off.

Every TMA copy of a ring is waited for before anything after the loop's `Seq` runs and
before its barriers are invalidated, as the interpreter holds the IR to (`check_drained`):
a barrier wait completes one group, so the drain after a loop whose section commits nothing
of its own (a one-stage loop, which has no epilogue steps, or a folded one) waits on the
newest group with copies that its last step committed, unless a wait of that step already
did.  A one-stage loop whose copies nothing reads (mutant 139, tests/test_mutated_programs.py)
waits for each group only before the next refills its tiles, so its last group is waited for
there alone: without it, its TMA loads still wrote the ring's bytes when the code after the
loop reused them (Triton places a TMA-store staging tile by liveness) or the CTA exited.

Guarantees (recorded on the `Emitter`):
* `rings[id(stmt)]` = the `Ring` of every AsyncCopy / CommitGroup / WaitGroup of a loop;
* `ring_owner[id(loop)]`, `ring_before[id(stmt)]` (allocate + init the ring's barriers before
  that statement) and `ring_after[id(stmt)]` (invalidate after it); for a loop directly in a
  persistent tile loop (lowering/persistent_tiles.py) that statement is the tile loop: each
  tile's groups use slots g % S as without persistence (so a slot is also the buffer version
  its copies fill), and `Ring.phase_bits`, the parity of each slot's uses by earlier tiles,
  updated after the tile's last async statement (`ring_advance`), continues the phases;
* `expect_bytes[id(copy)]` = bytes of the copy's whole commit group per lane (a list), for
  the group's first TMA copy, so the emitter issues the group's `mbarrier.expect`s, one per
  lane (0 bytes: a plain arrival), before its copies; `copy_lane[id(copy)]` = the lane whose
  barrier a TMA copy signals; a WaitGroup waits on every lane;
* lanes (opt-in, `TRITILE_TMA_LANES=1`): each destination buffer of a ring's TMA copies
  gets its own barrier allocation.  Triton's shared-memory barrier analysis (Membar) cannot
  tell two dynamically indexed barriers of one allocation apart, so it puts a CTA barrier
  (bar.sync) between every two mbarrier operations of one allocation; with one allocation
  per lane the expects of a group, then its copies, then its waits take one CTA barrier
  each (FlashAttention steady state: 5 -> 4 bar.sync per iteration, GEMM: 4 -> 3).
  Measured neutral on H100 (bench/NOTES.md, 2026-11-22), hence off by default; ignored in a
  warp-specialized kernel, whose producer signals one full barrier per slot.  The switch
  is read when a kernel is generated; the in-process compile cache is keyed by the IR alone;
* `copy_group[id(copy)]` = the iteration tag of the copy's commit group: every TMA copy of
  a group signals the group's barrier, even when the group mixes iterations (pipeline
  injection's deferred accumulation commits V of i - 1 with K of i); `Ring.span` = how
  many iterations older than its tag a group's copies can be, so a wait on group g is
  live while ``g < stop + span``;
* such a group's copies are guarded apart when the trip count is only known at run time
  (prologue and epilogue copies run while their own iteration is below it), so no single
  expect can cover the group: then `Ring.copies_per_group` = C, the barriers count C
  arrivals, every copy expects its own bytes, and the group's `CommitGroup` adds the missing
  arrivals (`commit_arrivals`): one per guarded copy whose guard is false, and one per copy
  pipeline injection dropped.  Every group of the ring then completes its barrier phase,
  even one with no copy at all (a trip count of 0);
* `wait_iteration[id(wait)]` = the iteration (an Expr) whose barrier a WaitGroup waits on,
  or None when no group with copies can be pending that an earlier wait has not completed;
* `cp_async` = True when some AsyncCopy will be lowered to cp.async (then commit/wait
  groups are real cp.async groups as well).
"""
from __future__ import annotations

import os

from tritile.ir import instructions as isel
from tritile.codegen.gluon.emitter import Emitter, Ring
from tritile.codegen.source_writer import paren, static_int
from tritile.ir import nodes as ir
from tritile.ir.printer import expr_str
from tritile.ir.transform import walk

_ASYNC = (ir.AsyncCopy, ir.CommitGroup, ir.WaitGroup)


def _is_pipelined(s) -> bool:
    return isinstance(s, ir.For) and s.pipelined_from > 0


def _members(stmts):
    """Async statements below `stmts` in program order, not entering other pipelined loops."""
    out = []
    stack = list(reversed(stmts))
    while stack:
        s = stack.pop()
        if isinstance(s, _ASYNC):
            out.append(s)
        elif isinstance(s, ir.Seq):
            stack.extend(reversed(s.stmts))
        elif isinstance(s, ir.If):
            stack.extend(reversed(s.then_body.stmts + (s.else_body.stmts if s.else_body else [])))
        elif isinstance(s, (ir.For, ir.While)) and not _is_pipelined(s):
            stack.extend(reversed(s.body.stmts))
    return out


def _contains_async(s) -> bool:
    return bool(_members([s])) or (_is_pipelined(s))


def plan(em: Emitter, body: ir.Seq):
    em.ring_before, em.ring_after = {}, {}
    tile_loop = next((n for n in walk(body) if isinstance(n, ir.For) and n.var is em.tile_loop_var), None)
    # rings of loops directly in a persistent tile loop's body (through nested Seqs only) live
    # across its tiles
    direct = _seqs_of(tile_loop.body) if tile_loop is not None else ()
    seqs = [n for n in walk(body) if isinstance(n, ir.Seq)]
    for seq in seqs:
        across = tile_loop if any(seq is d for d in direct) else None
        stmts = seq.stmts
        loops = [i for i, s in enumerate(stmts) if _is_pipelined(s)]
        for n, i in enumerate(loops):
            lo = 0
            if n > 0:
                gap = range(loops[n - 1] + 1, i)
                lo = next((j for j in gap if any(isinstance(m, ir.AsyncCopy) for m in _members([stmts[j]]))), i)
            hi = len(stmts)
            if n + 1 < len(loops):
                gap = range(i + 1, loops[n + 1])
                hi = next((j for j in gap if any(isinstance(m, ir.AsyncCopy) for m in _members([stmts[j]]))),
                          loops[n + 1])
            _make_ring(em, stmts, lo, i, hi, across)
    em.cp_async = any(isinstance(n, ir.AsyncCopy) and not served_by_tma(em, n) for n in walk(body))


def _seqs_of(seq: ir.Seq) -> list:
    """`seq` and the Seqs nested in it without an enclosing loop or branch."""
    out = [seq]
    for s in seq.stmts:
        if isinstance(s, ir.Seq):
            out.extend(_seqs_of(s))
    return out


def _every_group_has_tma(em: Emitter, members: list) -> bool:
    """Does every commit group of the ring's async statements `members` hold a TMA copy?  A group
    of cp.async copies alone (a tile whose start TMA cannot take, in a step the other tiles of
    its stage leave) would leave its slot's barrier unarmed while the consumers wait on it."""
    groups, current = [], []
    for m in members:
        if isinstance(m, ir.AsyncCopy):
            current.append(isel.uses_tma(m, em.target) and m.iteration is not None)
        elif isinstance(m, ir.CommitGroup):
            groups.append(current)
            current = []
    groups.append(current)
    copied = [group for group in groups if group]
    return bool(copied) and all(any(group) for group in copied)


def _make_ring(em: Emitter, stmts, lo: int, at: int, hi: int, tile_loop=None):
    loop = stmts[at]
    sections = [_members(stmts[lo:at]), _members(loop.body.stmts), _members(stmts[at + 1:hi])]
    members = [m for section in sections for m in section]
    if not members:
        return
    ring = Ring(em.fresh(f"{loop.var.name}_bars"), loop, loop.pipelined_from)
    for m in members:
        em.rings[id(m)] = ring
    em.ring_owner[id(loop)] = ring
    one_group_per_step = sum(isinstance(m, ir.CommitGroup) for m in sections[1]) == 1
    # a guard anywhere around a step's copies (also under the Lets that bind its condition:
    # `take = mask[k]; if take:`) may skip a TMA load its barrier waits for: cp.async instead.
    # A folded loop's guards (lowering/consumer_loop_folding.py) skip only the copies of
    # iterations past the end, whose groups no wait waits for
    unguarded = not any(isinstance(n, ir.If) for s in loop.body.stmts if _members([s]) and not is_fold_guard(loop, s)
                        for n in walk(s))
    ring.has_tma = one_group_per_step and unguarded and _every_group_has_tma(em, members)
    span = _group_span(loop, sections[1])
    ring.has_tma = ring.has_tma and span is not None
    if not ring.has_tma:
        return
    ring.span = span
    first = next(j for j in range(lo, hi) if _contains_async(stmts[j]))
    last = max(j for j in range(lo, hi) if _contains_async(stmts[j]))
    if tile_loop is not None:
        # every tile commits its groups 0 .. stop + span - 1 (its own trip count) to slots
        # g % S, the slots its buffer versions use; a slot's phase continues from the
        # earlier tiles' uses of it, whose parities `phase_bits` keeps (bit s: slot s),
        # updated after this tile's last async statement
        ring.phase_bits = ir.Var(f"{ring.name}_phase_bits", ir.int32)
        trips = loop.pipeline_trips
        ring.groups_per_tile = ir.BinOp("+", trips, ir.Const(span)) if span else trips
        em.ring_advance.setdefault(id(stmts[last]), []).append(ring)
        em.tile_rings.append(ring)
        first = last = None
    before = tile_loop if first is None else stmts[first]
    after = tile_loop if last is None else stmts[last]
    em.ring_before.setdefault(id(before), []).append(ring)
    em.ring_after.setdefault(id(after), []).append(ring)
    _resolve_waits(em, sections[0])
    _resolve_waits(em, sections[1])
    _resolve_waits(em, sections[2], ring)
    tma_copies = [m for m in members if isinstance(m, ir.AsyncCopy) and served_by_tma(em, m)]
    if span and static_int(loop.pipeline_trips) is None and "warp_specialization" not in em.func.attrs:
        # (a producer partition does this accounting itself: warp_specialize.full_arrivals)
        ring.copies_per_group = sum(isinstance(m, ir.AsyncCopy) for m in sections[1])
    # a producer partition signals one full barrier per slot, and a copy signalling alone
    # has no lane of its own: lanes are for whole groups issued by the kernel's own warps
    split = _lanes_enabled() and "warp_specialization" not in em.func.attrs and not ring.copies_per_group
    lanes = {}
    for c in tma_copies:
        em.copy_lane[id(c)] = lanes.setdefault(c.dst.buffer if split else None, len(lanes))
    ring.lanes = len(lanes)

    def expect(group):
        if ring.copies_per_group:
            for c in group:
                em.expect_bytes[id(c)] = [tile_bytes(c)]
            return
        nbytes = [0] * ring.lanes
        for c in group:
            nbytes[em.copy_lane[id(c)]] += tile_bytes(c)
        em.expect_bytes[id(group[0])] = nbytes

    guards = {}
    for section in (stmts[lo:at], loop.body.stmts, stmts[at + 1:hi]):
        guards.update(_copy_guards(section))
    group = []
    for m in members:
        if isinstance(m, ir.AsyncCopy) and served_by_tma(em, m):
            group.append(m)
        elif isinstance(m, ir.CommitGroup):
            if group:
                expect(group)
            for c in group:
                em.copy_group[id(c)] = m.iteration
            if ring.copies_per_group:
                em.commit_arrivals[id(m)] = ([guards[id(c)] for c in group if id(c) in guards],
                                             ring.copies_per_group - len(group))
            group = []
    if group:
        expect(group)


def is_fold_guard(loop: ir.For, s) -> bool:
    """Is `s` a folded steady-state loop's guard ``if i < n:`` around copies of iteration i?"""
    if loop.trips is None or not isinstance(s, ir.If) or s.else_body is not None or \
            not (isinstance(s.cond, ir.BinOp) and s.cond.op == "<") or expr_str(s.cond.rhs) != expr_str(loop.trips):
        return False
    it = expr_str(s.cond.lhs)
    return all(isinstance(c, ir.AsyncCopy) and expr_str(c.iteration) == it for c in s.then_body.stmts)


def steady_copies(loop: ir.For) -> list:
    """The async copies of a steady-state body, also those under a folded loop's guards."""
    out = []
    for s in loop.body.stmts:
        if isinstance(s, ir.AsyncCopy):
            out.append(s)
        elif is_fold_guard(loop, s):
            out.extend(s.then_body.stmts)
    return out


def _copy_guards(stmts: list, conds: tuple = ()) -> dict:
    """id(AsyncCopy) -> the condition under which it runs, for copies under `If`s in `stmts`
    (not entering loops: a pipelined loop's steady-state copies are unguarded)."""
    out = {}
    for s in stmts:
        if isinstance(s, ir.AsyncCopy) and conds:
            cond = conds[0]
            for c in conds[1:]:
                cond = ir.BinOp("and", cond, c, ir.bool_)
            out[id(s)] = cond
        elif isinstance(s, ir.Seq):
            out.update(_copy_guards(s.stmts, conds))
        elif isinstance(s, ir.If):
            out.update(_copy_guards(s.then_body.stmts, conds + (s.cond,)))
            if s.else_body is not None:
                out.update(_copy_guards(s.else_body.stmts, conds + (ir.UnaryOp("not", s.cond, ir.bool_),)))
    return out


def _lanes_enabled() -> bool:
    return os.environ.get("TRITILE_TMA_LANES", "0").strip() not in ("", "0")


def codegen_options() -> tuple:
    """The environment switches that change generated code without changing the IR: part of
    the compile cache key."""
    return (("tma_lanes", _lanes_enabled()),)


def lag(e, var):
    """k for an iteration expression ``var - k`` (``var`` alone: 0), else None."""
    if e is var:
        return 0
    if isinstance(e, ir.BinOp) and e.lhs is var and isinstance(e.rhs, ir.Const) and e.op in ("-", "+"):
        return e.rhs.value if e.op == "-" else -e.rhs.value
    return None


def _group_span(loop, body: list):
    """How many iterations older than its commit group's tag a steady-state copy can be (a
    deferred-accumulation loop commits V of i - 1 with K of i), or None when not static."""
    span, copies = 0, []
    for m in body:
        if isinstance(m, ir.AsyncCopy):
            copies.append(m)
        elif isinstance(m, ir.CommitGroup):
            for c in copies:
                lags = lag(c.iteration, loop.var), lag(m.iteration, loop.var)
                if None in lags or lags[0] < lags[1]:
                    return None
                span = max(span, lags[0] - lags[1])
            copies = []
    return span


def _resolve_waits(em: Emitter, section: list, after: Ring = None):
    """`wait_iteration` of the waits of one section; `after`: the ring of the loop the section
    follows (its epilogue and drains), whose waits before any commit of the section's own
    follow the loop's last step."""
    commits = [(j, m) for j, m in enumerate(section) if isinstance(m, ir.CommitGroup) and m.iteration is not None]
    waited = None if after is None else _waited_at_last_step(em, after.loop)
    for j, m in enumerate(section):
        if not isinstance(m, ir.WaitGroup):
            continue
        older = [c for i, c in commits if i < j]
        newer = [c for i, c in commits if i > j]
        if older:
            newest = older[-1].iteration
        elif newer:
            newest = _minus(newer[0].iteration, 1)
        elif after is not None:
            em.wait_iteration[id(m)], waited = _drain(after, m.pending, waited)
            continue
        else:
            em.wait_iteration[id(m)] = None
            continue
        em.wait_iteration[id(m)] = m.iteration if m.iteration is not None else _minus(newest, m.pending)


def _waited_at_last_step(em: Emitter, loop: ir.For):
    """The newest group the unconditional waits of `loop`'s last step wait for, as its offset
    (iterations before that step, t = stop - 1; None: none that the ring knows)."""
    lags = [lag(em.wait_iteration.get(id(s)), loop.var) for s in loop.body.stmts if isinstance(s, ir.WaitGroup)]
    lags = [k for k in lags if k is not None]
    return min(lags, default=None)


def _drain(ring: Ring, pending: int, waited):
    """(the group a drain of `pending` after `ring`'s loop waits on, or None when a wait of
    the loop's last step or an earlier drain already waited for it; the offset of the newest
    group waited for after it)."""
    loop = ring.loop
    commit = next(m for m in _members(loop.body.stmts) if isinstance(m, ir.CommitGroup))
    # groups past the trip count (a folded loop's last D steps) have no copies to wait for:
    # group g has copies while g - span < trips
    past_end = (loop.start.value if loop.trips is not None else 0) - ring.span
    target = max(lag(commit.iteration, loop.var) + pending, past_end)
    if waited is not None and target >= waited:
        return None, waited
    return _minus(loop.stop, 1 + target), target


def _minus(e, k: int):
    if k == 0:
        return e
    if isinstance(e, ir.Const) and isinstance(e.value, int):
        return ir.Const(e.value - k, e.dtype)
    return ir.BinOp("-", e, ir.Const(k), e.dtype)


def served_by_tma(em, copy) -> bool:
    ring = em.rings.get(id(copy))
    return ring is not None and ring.has_tma and isel.uses_tma(copy, em.target) and copy.iteration is not None


def tile_bytes(copy) -> int:
    n = 1
    for e in copy.dst.tile_shape:
        n *= e
    return n * copy.dst.buffer.dtype.itemsize


def lane_name(ring: Ring, lane: int) -> str:
    """The barrier allocation of one lane of `ring`."""
    return ring.name if lane == 0 else f"{ring.name}_{lane}"


def emit_alloc(em: Emitter, ring: Ring):
    for lane in range(ring.lanes):
        name = lane_name(ring, lane)
        em.emit(f"{name} = gl.allocate_shared_memory(gl.int64, [{ring.stages}, 1], mbarrier.MBarrierLayout())")
        em.emit(f"for _stage in gl.static_range({ring.stages}):")
        em.emit(f"    mbarrier.init({name}.index(_stage), count={ring.copies_per_group or 1})")


def emit_advance(em: Emitter, ring: Ring):
    """After a tile's last async statement of `ring`: flip the phase bit of every slot the
    tile used an odd number of times (a warp-specialized consumer first releases the slots
    its last groups hold)."""
    if em.partitions is not None:
        from tritile.codegen.gluon import warp_specialize

        warp_specialize.emit_tile_releases(em, ring)
    bits = em.name(ring.phase_bits)
    em.emit(f"{bits} = {bits} ^ {paren(tile_phase_flips(em, ring))}")


def tile_phase_flips(em: Emitter, ring: Ring) -> str:
    """The slots a tile's groups 0 .. N - 1 use an odd number of times, as a bit mask: slot
    s holds groups s, s + S, ..., ceil((N - s) / S) of them."""
    stages, count = ring.stages, static_int(ring.groups_per_tile)
    if count is not None:
        return str(sum((((max(count, 0) - s + stages - 1) // stages) & 1) << s for s in range(stages)))
    n = f"gl.maximum({em.expr(ring.groups_per_tile).text}, 0)"
    return " | ".join(f"((({n} + {stages - 1 - s}) // {stages}) & 1) << {s}" for s in range(stages))


def tile_phase(em: Emitter, ring: Ring, group_text: str) -> str:
    """The phase parity of a tile's commit group `group_text` in a ring living across tiles."""
    bits, stages = em.name(ring.phase_bits), ring.stages
    if group_text.isdigit():
        g = int(group_text)
        return f"({g // stages} ^ ({bits} >> {g % stages})) & 1"
    g = paren(group_text)
    return f"(({g} // {stages}) ^ ({bits} >> ({g} % {stages}))) & 1"


def emit_invalidate(em: Emitter, ring: Ring):
    em.emit(f"for _stage in gl.static_range({ring.stages}):")
    for lane in range(ring.lanes):
        em.emit(f"    mbarrier.invalidate({lane_name(ring, lane)}.index(_stage))")
