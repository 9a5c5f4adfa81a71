"""Warp-specialized kernels: a TMA producer partition and the consumers (the kernel's warps).

Planned by lowering/warp_specialization.py (``func.attrs["warp_specialization"]``); see its
docstring for when a kernel qualifies.  `plan` re-checks the facts only codegen knows (every
pipelined loop got a TMA ring, every async copy is served by it) and returns False when they
do not hold, in which case the kernel is emitted the ordinary way (same values).

Generated structure::

    @gluon.jit
    def k(<params>, <descriptors>, <dims>):
        <block ids>
        <shared buffers the producer fills>           # shared by both partitions
        <per loop: full[S] (count: copies per group) and empty[S] (count 1) mbarriers>
        gl.warp_specialize([(k_consumer, args), (k_producer, args)], [warps], [registers])

    k_consumer: the kernel body as without warp specialization, except that the TMA copies
        of a commit group g are replaced, at the place of its last copy, by
        ``arrive(empty[g % S])`` when g >= S: pipeline injection put the copies where every
        gemm reading slot g % S (group g - S's data) has retired, which is exactly when
        the slot may be refilled.  Waits on groups stay ``wait(full[g % S], (g // S) & 1)``.
        A ring whose buffers are in use before its loop (a sibling loop's slots, #3039-style
        accesses) releases every group, g < S included, so the producer never runs ahead
        of the consumers into a slot they still use.
    k_producer: per pipelined loop, ``for g in range(0, n + span)``: wait until group
        g - S was released (``wait(empty[g % S], ((g // S) & 1) ^ 1)`` for g >= S; for a ring
        releasing every group, until g itself was, ``wait(empty[g % S], (g // S) & 1)``), then each
        copy of the steady-state body with the loop variable set so that its commit group is
        g: one ``expect(full[g % S], group bytes)`` and the TMA copies.  When a group can
        hold a copy outside [0, n) (a deferred-accumulation group g holds iteration g - 1's
        V), each copy expects its own bytes, predicated on its iteration lying in [0, n),
        and a copy predicated off arrives instead, so every group still completes.

Tile loads (``plan.tile_loads``, FlashAttention's Q): one slot per consumer partition with a
"loaded" and a "free" mbarrier.  Per tile t, ahead of the loops' groups, the producer waits
until the slot was freed in tile t - 1, expects the bytes and issues the TMA copy; the
consumer waits ``wait(loaded[slot], t & 1)`` where the copy stood and arrives on
``free[slot]`` after its last read of the buffer in the tile has retired (`_release_point`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tritile.codegen import signs
from tritile.ir import instructions as isel
from tritile.codegen.gluon import rings
from tritile.codegen.gluon.emitter import Emitter
from tritile.codegen.source_writer import paren, static_int
from tritile.ir import nodes as ir
from tritile.ir.transform import substitute_vars, top_level, touches, walk
from tritile.lowering import warp_specialization


@dataclass
class Partitions:
    """What the consumer rules and the assembly need to know."""

    plan: ir.WarpSpecialization
    rings: list  # the Ring of each pipelined loop, program order
    hoisted: list  # shared Buffers the producer writes (allocated before the fork)
    release: dict = field(default_factory=dict)  # id(last TMA copy of a group) -> (Ring, group Expr)
    # id(Ring) -> arrivals completing a "full" barrier phase: 1 (one expect per group) when
    # every copy of a group is real, else one per copy (an expect, or a plain arrival)
    full_arrivals: dict = field(default_factory=dict)
    # id(Ring) -> True when the consumers release every group's slot, not only those of
    # groups g >= S: the ring's buffers are in use before its loop (an earlier loop's slots,
    # or the consumers' own accesses), so even its first S groups must wait for the consumers
    # to reach them
    release_all: dict = field(default_factory=dict)
    # the kernel's ConsumerPartitions (lowering/consumer_partitions.py), or None: one consumer
    # partition per warpgroup, all running the consumer function with their own `part`
    split: ir.ConsumerPartitions = None
    # the consumers' tile loads (see the module docstring), id(copy) -> (loaded, free) barrier names
    tile_loads: dict = field(default_factory=dict)
    # id(statement) -> [(tile load, wait for every wgmma first)] to release after that statement
    release_after: dict = field(default_factory=dict)

    @property
    def consumers(self) -> int:
        return self.split.count if self.split is not None else 1


def plan(em: Emitter, func: ir.PrimFunc):
    """The partition plan for `func`, or None when it is emitted without warp specialization."""
    ws = func.attrs.get("warp_specialization")
    if ws is None or not em.target.has_tma:
        return None
    loops = [n for n in walk(func.kernel.body) if isinstance(n, ir.For) and n.pipelined_from > 0]
    ring_list = [em.ring_owner.get(id(loop)) for loop in loops]
    if not ring_list or any(r is None or not r.has_tma or r.lanes != 1 for r in ring_list):
        return None
    copies = [n for n in walk(func.kernel.body) if isinstance(n, ir.AsyncCopy)]
    if any(not rings.served_by_tma(em, c) for c in copies):
        return None
    hoisted = {}
    for c in copies:
        hoisted.setdefault(id(c.dst.buffer), c.dst.buffer)
    split = next((s for s in walk(func.kernel.body) if isinstance(s, ir.ConsumerPartitions)), None)
    if split is not None:  # every consumer partition uses the kernel's shared buffers
        for s in func.kernel.body.stmts:
            if isinstance(s, ir.Alloc):
                hoisted.setdefault(id(s.buffer), s.buffer)
    parts = Partitions(ws, ring_list, list(hoisted.values()), split=split)
    _plan_tile_loads(em, func, parts)
    for ring in ring_list:
        group_var = ir.Var("g")
        copies_of_group = _group_copies(ring, group_var)
        always_real = all(rings.lag(c.iteration, group_var) == 0 for c in copies_of_group)
        parts.full_arrivals[id(ring)] = 1 if always_real else len(copies_of_group)
    top = top_level(func.kernel.body)
    for ring in ring_list:
        parts.release_all[id(ring)] = _used_before(em, ring, top)
    # the last TMA copy of each commit group releases the slot its group refills
    last = {}
    for c in copies:
        ring = em.rings[id(c)]
        key = (id(ring), _group_key(em.copy_group[id(c)]))
        last[key] = c
    for c in last.values():
        parts.release[id(c)] = (em.rings[id(c)], em.copy_group[id(c)])
    # rings live for the whole kernel: allocated before the fork, never invalidated
    em.ring_before, em.ring_after = {}, {}
    em.hoisted = {id(b) for b in parts.hoisted}
    return parts


def _plan_tile_loads(em: Emitter, func: ir.PrimFunc, parts: Partitions):
    """The consumers' copies named in ``plan.tile_loads`` that the producer takes over: TMA
    tiles of one slot per consumer partition (indexed by the partition variable when the
    consumers are split), each with its release point in the consumers' tile."""
    if not parts.plan.tile_loads:
        return
    tile_loop = next((n for n in walk(func.kernel.body) if isinstance(n, ir.For) and n.var is em.tile_loop_var), None)
    scope = tile_loop.body if tile_loop is not None else (parts.split.body if parts.split else func.kernel.body)
    top = top_level(scope)
    for copy in top:
        if not (isinstance(copy, ir.Copy) and copy.dst.buffer.name in parts.plan.tile_loads
                and copy.src.buffer.scope == "global" and isel.uses_tma(copy, em.target)):
            continue
        if parts.split is not None and copy.dst.starts[0] is not parts.split.var:
            continue  # a buffer all partitions share: each keeps loading it itself
        buf = copy.dst.buffer
        parts.tile_loads[id(copy)] = (em.fresh(f"{em.name(buf)}_loaded"), em.fresh(f"{em.name(buf)}_free"))
        if not any(b is buf for b in parts.hoisted):
            parts.hoisted.append(buf)
        after, wait_first = _release_point(top, copy)
        parts.release_after.setdefault(id(after), []).append((copy, wait_first))


def _release_point(top: list, copy: ir.Copy) -> tuple:
    """(statement, wait_first): the tile load's buffer is free after `statement` - the wait
    that retires the last wgmma reading it, or the last statement reading it when no wgmma
    does - or, when that cannot be told at the top level, after the tile's last statement
    once every wgmma has been waited for."""
    buf = copy.dst.buffer
    reads = [i for i, s in enumerate(top) if s is not copy and touches(s, buf)]
    if not reads:
        return copy, False
    last = top[reads[-1]]
    async_gemms = [n for n in walk(last) if isinstance(n, ir.Gemm) and n.is_async]
    if not async_gemms:
        return last, False
    if last is async_gemms[0]:  # one async gemm: retired by the first wait leaving fewer in flight than issued since
        issued_after = 0
        for s in top[reads[-1] + 1:]:
            if isinstance(s, ir.WaitMMA) and issued_after >= s.pending:
                return s, False
            if isinstance(s, ir.Gemm):
                issued_after += s.is_async
            elif any(isinstance(n, (ir.Gemm, ir.WaitMMA)) for n in walk(s)):
                break
    return top[-1], True


def emit_tile_load_wait(em: Emitter, copy: ir.Copy):
    """The consumer's side of a tile load: wait until the producer's copy for this tile landed."""
    loaded, _ = em.partitions.tile_loads[id(copy)]
    phase = f"{em.name(em.tile_loop_var)} & 1" if em.tile_loop_var is not None else "0"
    em.emit(f"mbarrier.wait({loaded}.index({_slot(em, copy)}), {phase})")


def emit_tile_load_releases(em: Emitter, stmt):
    """After `stmt`: free the slots of the tile loads whose last read it retires."""
    for copy, wait_first in em.partitions.release_after.get(id(stmt), ()):
        if wait_first and (em.inflight or em.tokens):
            em.wait_mma(0, sorted(em.inflight | em.tokens, key=em.name))
        _, free = em.partitions.tile_loads[id(copy)]
        em.emit(f"mbarrier.arrive({free}.index({_slot(em, copy)}))")


def _slot(em: Emitter, copy: ir.Copy) -> str:
    return em.expr(copy.dst.starts[0]).text if em.partitions.split is not None else "0"


def _emit_producer_tile_load(em: Emitter, copy: ir.Copy, parts: Partitions, tile_var):
    """Per tile, the producer's copy into each consumer partition's slot, once the slot is free."""
    loaded, free = parts.tile_loads[id(copy)]
    em.emit(f"# producer of the per-tile load of {em.name(copy.dst.buffer)}")
    for slot in range(parts.consumers):
        c = substitute_vars(copy, {parts.split.var: ir.Const(slot)}) if parts.split is not None else copy
        if tile_var is not None:  # the slot's previous contents (tile t - 1) were read
            t = em.name(tile_var)
            em.emit(f"mbarrier.wait({free}.index({slot}), ({t} & 1) ^ 1, pred={t} > 0)")
        em.emit(f"mbarrier.expect({loaded}.index({slot}), {rings.tile_bytes(c)})")
        desc, coords, block = em.descriptor(c.src, em.buffer_layout(c.dst.buffer))
        em.emit(f"tma.async_copy_global_to_shared({desc}, [{coords}], {loaded}.index({slot}), "
                f"{em.tma_shared_view(c.dst, c.loc, block)})")


def _used_before(em: Emitter, ring, top: list) -> bool:
    """Does a statement before `ring`'s first copy touch its buffers or issue other copies?"""
    members = [n for s in top for n in walk(s) if isinstance(n, ir.AsyncCopy) and em.rings.get(id(n)) is ring]
    buffers = {id(c.dst.buffer) for c in members}
    for s in top:
        if any(n is members[0] for n in walk(s)):
            return False
        if isinstance(s, ir.Alloc):
            continue
        for n in walk(s):
            if isinstance(n, ir.AsyncCopy) or (isinstance(getattr(n, "buffer", None), ir.Buffer)
                                               and id(n.buffer) in buffers):
                return True
    return False


def _group_key(group):
    """Groups are equal when their tag expressions print alike (prologue tags are constants,
    steady-state tags the loop variable): distinct statements never share a tag text."""
    from tritile.ir.printer import expr_str

    return expr_str(group)


def empty_name(ring) -> str:
    return f"{ring.name}_empty"


def emit_release(em: Emitter, copy: ir.AsyncCopy):
    """The consumer's side of a TMA copy: release its group's slot (last copy only)."""
    entry = em.partitions.release.get(id(copy))
    if entry is None:
        return
    ring, group = entry
    stages, every = ring.stages, em.partitions.release_all[id(ring)]
    # the groups the producer fills: a step past them releases nothing - an epilogue step past
    # a persistent tile's last group (its copies all guarded off under a runtime trip count),
    # where the extra arrival would complete a phase of the next tile's slot, or a folded
    # loop's step past the end (lowering/consumer_loop_folding.py)
    filled = ring.groups_per_tile  # None outside persistent tiles
    if filled is None and ring.loop.trips is not None:
        filled = ir.BinOp("+", ring.loop.trips, ir.Const(ring.span)) if ring.span else ring.loop.trips
    if ring.loop.release_ahead and not every and filled is not None:
        # the step's gemms retired before its copies: release the slot it read, that of the
        # group after this one (lowering/release_ahead.py); the same releases a step earlier
        first = static_int(group)  # a prologue's group: < S - 1, so still none to release
        group = ir.BinOp("+", group, ir.Const(1)) if first is None else ir.Const(first + 1)
    g, count = static_int(group), (static_int(filled) if filled is not None else None)
    if g is not None and (not (every or g >= stages) or (count is not None and g >= count)):
        return
    text = paren(em.expr(group).text)
    conditions = [] if every or g is not None else [f"{text} >= {stages}"]
    if filled is not None and (g is None or count is None):
        conditions.append(f"{text} < {paren(em.expr(filled).text)}")
    pred = " & ".join(map(paren, conditions)) if len(conditions) > 1 else "".join(conditions)
    slot = g % stages if g is not None else f"{text} % {stages}"
    em.emit(f"mbarrier.arrive({empty_name(ring)}.index({slot}){f', pred={pred}' if pred else ''})")


def emit_tile_releases(em: Emitter, ring):
    """At the end of a persistent tile's use of `ring` (after its drains: every wgmma reading
    the ring has retired): release the slots of the tile's last groups, which no later copy
    of this tile releases (the copy of group g releases group g - S), so that the producer
    can refill them with the next tile's first groups while this tile's epilogue runs."""
    if em.inflight or em.tokens:
        em.wait_mma(0, sorted(em.inflight | em.tokens, key=em.name))
    groups, count = paren(em.expr(ring.groups_per_tile).text), static_int(ring.groups_per_tile)
    first = max(count - ring.stages, 0) if count is not None else f"gl.maximum({groups} - {ring.stages}, 0)"
    g = em.tmp("g")
    em.emit(f"for {g} in range({first}, {groups}):")
    em.emit(f"    mbarrier.arrive({empty_name(ring)}.index({g} % {ring.stages}))")


def emit_producer(em: Emitter, func: ir.PrimFunc, parts: Partitions) -> list:
    """The producer partition's body lines (indented for a function body).  In a persistent
    kernel the producer walks the same tiles as the consumers, keeping the same phase bits
    per ring (rings.tile_phase) and the most groups a tile has committed so far (a slot
    some earlier tile used must be released before it is refilled), so it fills the next
    tile's first slots as soon as the consumers release them."""
    saved, em.lines = em.lines, []
    tile_loop = next((n for n in walk(func.kernel.body) if isinstance(n, ir.For) and n.var is em.tile_loop_var), None)
    scope, seen = func.kernel.body, {}
    if tile_loop is not None:
        for ring in parts.rings:
            seen[id(ring)] = em.define(ir.Var(f"{ring.name}_groups_seen"))
            em.emit(f"{em.define(ring.phase_bits)} = gl.to_tensor(0)")
            em.emit(f"{seen[id(ring)]} = gl.to_tensor(0)")
        em.emit(f"for {em.define(tile_loop.var)} in range(0, {em.expr(tile_loop.stop).text}):")
        em.depth += 1
        scope = tile_loop.body
    for s in _needed_lets(scope, parts):
        em.emit(f"{em.name(s.var)} = {em.expr(s.value).text}")
    for copy in _tile_load_copies(scope, parts):
        _emit_producer_tile_load(em, copy, parts, tile_loop.var if tile_loop is not None else None)
    for ring in parts.rings:
        _emit_producer_loop(em, ring, parts, seen.get(id(ring)))
        if tile_loop is not None:
            bits, groups = em.name(ring.phase_bits), paren(em.expr(ring.groups_per_tile).text)
            em.emit(f"{bits} = {bits} ^ {paren(rings.tile_phase_flips(em, ring))}")
            em.emit(f"{seen[id(ring)]} = gl.maximum({seen[id(ring)]}, {groups})")
    if tile_loop is not None:
        em.depth -= 1
    lines, em.lines = em.lines, saved
    return lines


def _emit_producer_loop(em: Emitter, ring, parts: Partitions, groups_seen: str = None):
    loop, stages = ring.loop, ring.stages
    group_var = ir.Var("g")
    g = em.define(group_var)
    signs.of(em).assume_nonnegative(group_var)  # counts 0 .. count - 1
    copies = _group_copies(ring, group_var)
    stop = em.expr(loop.pipeline_trips).text
    count = f"{paren(stop)} + {ring.span}" if ring.span else stop
    full, empty = ring.name, empty_name(ring)
    bar = f"{full}.index({g} % {stages})"
    em.emit(f"# producer of loop {loop.var.name}: {len(copies)} TMA copies per commit group, {stages} slots")
    em.emit(f"for {g} in range(0, {count}):")
    em.depth += 1
    if ring.phase_bits is not None:  # a slot's uses continue from the earlier tiles'
        refill = f"({g} >= {stages}) | ({groups_seen} > {g} % {stages})"
        em.emit(f"mbarrier.wait({empty}.index({g} % {stages}), ({rings.tile_phase(em, ring, g)}) ^ 1, pred={refill})")
    elif parts.release_all[id(ring)]:  # the consumers' n-th release of a slot is group n * S + slot
        em.emit(f"mbarrier.wait({empty}.index({g} % {stages}), ({g} // {stages}) & 1)")
    else:  # the n-th release of a slot frees it for group (n + 1) * S + slot
        em.emit(f"mbarrier.wait({empty}.index({g} % {stages}), (({g} // {stages}) & 1) ^ 1, pred={g} >= {stages})")
    if parts.full_arrivals[id(ring)] == 1:  # every copy is real: one expect for the group
        em.emit(f"mbarrier.expect({bar}, {sum(rings.tile_bytes(c) for c in copies)})")
    for copy in copies:
        signs.of(em).assume_nonnegative(copy.iteration)  # the copy runs only for iterations >= 0
        desc, coords, block = em.descriptor(copy.src, em.buffer_layout(copy.dst.buffer), copy.iteration,
                                            loop.pipeline_trips)
        dst = em.tma_shared_view(copy.dst, copy.loc, block)
        if parts.full_arrivals[id(ring)] == 1:
            em.emit(f"tma.async_copy_global_to_shared({desc}, [{coords}], {bar}, {dst})")
            continue
        it = paren(em.expr(copy.iteration).text)
        valid, invalid = f"({it} >= 0) & ({it} < {paren(stop)})", f"({it} < 0) | ({it} >= {paren(stop)})"
        em.emit(f"mbarrier.expect({bar}, {rings.tile_bytes(copy)}, pred={valid})")
        em.emit(f"mbarrier.arrive({bar}, pred={invalid})")
        em.emit(f"tma.async_copy_global_to_shared({desc}, [{coords}], {bar}, {dst}, pred={valid})")
    em.depth -= 1


def _group_copies(ring, group_var: ir.Var) -> list:
    """The steady-state copies of `ring`'s loop, with the loop variable set to the time step
    whose commit group is `group_var`."""
    body = ring.loop.body.stmts
    commit = next(s for s in body if isinstance(s, ir.CommitGroup))
    lag = rings.lag(commit.iteration, ring.loop.var)
    step = ir.BinOp("+", group_var, ir.Const(lag)) if lag else group_var
    return [substitute_vars(s, {ring.loop.var: step}) for s in rings.steady_copies(ring.loop)]


def _needed_lets(scope: ir.Seq, parts: Partitions) -> list:
    """Top-level Lets of `scope` (the kernel body, or a persistent kernel's tile loop body)
    the producer's loop bounds and coordinates use (transitively)."""
    lets = [s for s in top_level(scope) if isinstance(s, ir.Let)]
    wanted = set()
    for ring in parts.rings:
        exprs = [ring.loop.pipeline_trips] + [e for c in rings.steady_copies(ring.loop)
                                              for e in (*c.src.starts, c.iteration)]
        wanted |= {id(v) for e in exprs if isinstance(e, ir.Expr) for v in walk(e) if isinstance(v, ir.Var)}
    for copy in _tile_load_copies(scope, parts):
        wanted |= {id(v) for e in copy.src.starts if isinstance(e, ir.Expr) for v in walk(e) if isinstance(v, ir.Var)}
    out = []
    for s in reversed(lets):
        if id(s.var) in wanted:
            out.append(s)
            wanted |= {id(v) for v in walk(s.value) if isinstance(v, ir.Var)}
    return list(reversed(out))


def _tile_load_copies(scope: ir.Seq, parts: Partitions) -> list:
    return [s for s in top_level(scope) if id(s) in parts.tile_loads]


def emit_fork(em: Emitter, parts: Partitions, consumer: str, producer: str, args: list):
    """The kernel's lines after the block ids: shared allocations, barriers, the fork."""
    for buf in parts.hoisted:
        for line in em.shared_alloc(buf):
            em.emit(line)
    for ring in parts.rings:
        count = parts.full_arrivals[id(ring)]
        for name in (ring.name, empty_name(ring)):
            em.emit(f"{name} = gl.allocate_shared_memory(gl.int64, [{ring.stages}, 1], mbarrier.MBarrierLayout())")
        em.emit(f"for _stage in gl.static_range({ring.stages}):")
        em.emit(f"    mbarrier.init({ring.name}.index(_stage), count={count})")
        em.emit(f"    mbarrier.init({empty_name(ring)}.index(_stage), count={parts.consumers})")
    for loaded, free in parts.tile_loads.values():
        for name in (loaded, free):
            em.emit(f"{name} = gl.allocate_shared_memory(gl.int64, [{parts.consumers}, 1], mbarrier.MBarrierLayout())")
            em.emit(f"for _slot in gl.static_range({parts.consumers}):")
            em.emit(f"    mbarrier.init({name}.index(_slot), count=1)")
    arg_text = ", ".join(args)
    consumers = [f"({consumer}, ({arg_text}{'' if parts.split is None else f', {p}'},))" for p in range(parts.consumers)]
    # the first consumer is the default partition (the kernel's num_warps); the others
    # are workers of as many warps, given the registers the producer gives up
    warps = [em.num_warps] * (parts.consumers - 1) + [parts.plan.producer_warps]
    registers = ([warp_specialization.consumer_registers(parts.consumers, parts.plan.producer_registers)]
                 * (parts.consumers - 1) + [parts.plan.producer_registers])
    em.emit(f"gl.warp_specialize([{', '.join(consumers)}, ({producer}, ({arg_text},))], {warps}, {registers})")


def partition_args(em: Emitter, func: ir.PrimFunc, parts: Partitions, kernel_args: list) -> list:
    """What every partition receives: the kernel's arguments, block ids, the shared buffers
    and the barriers (the consumers also their partition index, `consumer_args`)."""
    names = list(kernel_args) + [em.name(v) for v in func.kernel.block_vars]
    names += [em.name(b) for b in parts.hoisted]
    for ring in parts.rings:
        names += [ring.name, empty_name(ring)]
    for loaded, free in parts.tile_loads.values():
        names += [loaded, free]
    return names


def consumer_args(em: Emitter, parts: Partitions, args: list) -> list:
    return args + ([em.name(parts.split.var)] if parts.split is not None else [])
