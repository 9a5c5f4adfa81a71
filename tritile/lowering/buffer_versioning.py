"""buffer_versioning: give pipelined shared buffers one version per in-flight iteration.

Assumes
-------
`pipeline_planning` ran: pipelined loops carry a `PipelineSchedule` over normalised units
(and its dependency check already rejected bodies that read a shared tile and then overwrite
it in the same iteration, TileLang #2668).

Guarantees
----------
* A shared buffer X is *versioned by* a planned loop L of depth ``S_L = max_stage + 1 >= 2``
  when a producer (global->shared copy) of L writes X and a unit at a later stage reads it
  (`versioned_by`).  Buffers used only outside pipelines, or only by loops that do not
  version them, are untouched (seed 001).
* Each such X gets exactly ONE new `Buffer` ``(V, *X.shape)`` with ``origin=X`` and
  ``num_versions=V``, V the maximum depth over every loop versioning it, substituted
  everywhere in one `substitute_buffers` step, so nothing is expanded twice (seed 000,
  TileLang #2309).
* Inside a loop L that versions X, every access gets the leading index
  ``slot = ((var - start) // step) % S_L`` - L's OWN depth, not V - so sibling loops with
  different depths share the allocation safely.
* When X is also accessed outside its versioning loops (before, after, in serial or
  non-versioning loops), an int32 var ``<X>_slot`` (init 0) is allocated next to X, each
  versioning loop gets an extra unit ``<X>_slot[0] = slot`` at its readers' stage, under the
  producer's guard (so guarded-off iterations do not move it), scheduled last in its time
  step, and outside accesses are indexed with ``<X>_slot[0]``: a read after the loop sees the
  last executed iteration's data (TileLang #3039).
* A producer of X whose guard differs from the guard of a reader of X is a `CompileError`
  (the reader could see another iteration's data).
* On a target with wgmma, a loop L also versions (by ``S_L``) each *register-staged wgmma
  operand* (`staged_operands`, named in ``L.schedule.staged``): a shared buffer written whole
  by a fragment -> shared `T.copy` and read by gemms that run on wgmma, as B or as a
  transposed A (an untransposed A is a row buffer `consumer_partitions` splits by rows, which
  needs it unversioned), all of its accesses unguarded units of L in one stage, the write
  first, and whose extra versions fit the target's shared memory with every buffer allocated
  at once - the FlashAttention backward's dS^T, stored for dQ = dS K.  No value crosses
  iterations, so a version per step changes nothing but where: the next step's store no
  longer overwrites the tile an async wgmma may still read, and the wgmma's shared-memory
  descriptors follow the step's slot, so they are computed in the loop instead of held in
  registers across it (LLVM hoists a fixed address's descriptors out of the loop; ptxas held
  the backward's 32 of them, 64 uniform registers, in spilled registers: 268 bytes of spills
  at head dim 128, 88 once dS^T alternates, none of them in the loop).
"""
from __future__ import annotations

import dataclasses

from tritile.errors import CompileError
from tritile.ir import instructions as isel
from tritile.ir import nodes as ir
from tritile.ir.dtypes import int32
from tritile.ir.transform import Transformer, substitute_buffers, walk
from tritile.lowering.pipeline_planning import (
    UnitParts, accesses, is_producer, lets_needed, loop_depth, planned_loops, rebuild_unit, split_unit,
)
from tritile.lowering.shared_memory_budget import buffer_bytes


def versioned_by(loop: ir.For) -> list:
    """Shared buffers the planned `loop` versions: its producers' (in first-producer order),
    then its register-staged wgmma operands (``schedule.staged``)."""
    if loop.schedule is None or loop_depth(loop) < 2:
        return []
    units, stages = loop.body.stmts, loop.schedule.stages
    reads = [[a.buffer for a in accesses(u) if not a.write] for u in units]
    out = []
    for j, unit in enumerate(units):
        core = split_unit(unit).core
        if not is_producer(core):
            continue
        buf = core.dst.buffer
        if buf not in out and any(stages[k] > stages[j] and buf in reads[k] for k in range(len(units))):
            out.append(buf)
    for unit in units:
        core = split_unit(unit).core
        if isinstance(core, ir.Copy) and core.dst.buffer.name in loop.schedule.staged and core.dst.buffer not in out:
            out.append(core.dst.buffer)
    return out


def staged_operands(loop: ir.For, target, num_warps: int, uses: dict) -> tuple:
    """Names of the register-staged wgmma operands `loop` versions (module docstring); `uses`
    counts every access of each buffer in the kernel."""
    if loop.schedule is None or loop_depth(loop) < 2 or not getattr(target, "has_wgmma", False):
        return ()
    units, stages = loop.body.stmts, loop.schedule.stages
    names = []
    for j, unit in enumerate(units):
        parts = split_unit(unit)
        core, buf = parts.core, getattr(getattr(parts.core, "dst", None), "buffer", None)
        if not (isinstance(core, ir.Copy) and core.src.buffer.scope == "fragment" and buf.scope == "shared"
                and buf.num_versions == 1 and tuple(core.dst.extents) == tuple(buf.shape)):
            continue
        touching = [k for k, u in enumerate(units) if any(a.buffer is buf for a in accesses(u))]
        gemms = [n for k in touching for n in walk(units[k]) if isinstance(n, ir.Gemm)
                 and buf in (n.a.buffer, n.b.buffer)]
        if any(g.a.buffer is buf and not g.transpose_a for g in gemms):
            continue  # a row buffer, which consumer_partitions splits by rows (unversioned) instead
        if (touching[0] == j and len(touching) > 1 and _count_uses(loop.body).get(buf, 0) == uses.get(buf, 0)
                and len({stages[k] for k in touching}) == 1
                and all(split_unit(units[k]).guard is None for k in touching)
                and sum(a.buffer is buf and a.write for k in touching for a in accesses(units[k])) == 1
                and gemms and all(isel.gemm_engine(g, target, num_warps) == "wgmma" for g in gemms)):
            names.append(buf.name)
    return tuple(names)


def slot_expr(loop: ir.For) -> ir.Expr:
    """``((var - start) // step) % depth``, written without the identity parts."""
    offset = loop.var
    if not (isinstance(loop.start, ir.Const) and loop.start.value == 0):
        offset = ir.BinOp("-", offset, loop.start)
    if not (isinstance(loop.step, ir.Const) and loop.step.value == 1):
        offset = ir.BinOp("//", offset, loop.step)
    return ir.BinOp("%", offset, ir.Const(loop_depth(loop)))


def _check_guards(loop: ir.For, buf: ir.Buffer):
    units = loop.body.stmts
    producer_guards, reader_guards = [], []
    for unit in units:
        parts = split_unit(unit)
        if is_producer(parts.core) and parts.core.dst.buffer is buf:
            producer_guards.append(parts.guard)
        elif any(a.buffer is buf and not a.write for a in accesses(unit)):
            reader_guards.append(parts.guard)
    for guard in reader_guards:
        if any(guard != g for g in producer_guards):
            raise CompileError(f"T.Pipelined: {buf.name} is written by a guarded copy and read under a "
                               f"different guard; pipelining it would let the reader see another "
                               f"iteration's data. Use one `if` around the whole loop body", loop.loc)


def _slot_unit(loop: ir.For, buf: ir.Buffer, slot_var: ir.Buffer) -> tuple:
    """(unit, stage) recording the current version of `buf` in `slot_var`."""
    units, stages = loop.body.stmts, loop.schedule.stages
    producer = next(split_unit(u) for u in units
                    if is_producer(split_unit(u).core) and split_unit(u).core.dst.buffer is buf)
    stage = max(stages[k] for k, u in enumerate(units) if any(a.buffer is buf and not a.write for a in accesses(u)))
    store = ir.Store(slot_var, (ir.Const(0),), slot_expr(loop), loc=loop.loc)
    unit = rebuild_unit(UnitParts(lets_needed([producer.guard, store], producer.outer_lets), producer.guard,
                                  lets_needed(store, producer.inner_lets), store, producer.guard_loc))
    return unit, stage


def _count_uses(node) -> dict:
    counts = {}
    for n in walk(node):
        if isinstance(n, (ir.Region, ir.Load, ir.Store)):
            counts[n.buffer] = counts.get(n.buffer, 0) + 1
    return counts


class _Indexer(Transformer):
    """Prepends the version index to every access of a versioned buffer and adds the slot
    bookkeeping units to the versioning loops."""

    def __init__(self, outside_slot: dict, slot_vars: dict):
        self.slot_of = dict(outside_slot)  # original buffer -> slot index in the current context
        self.slot_vars = slot_vars  # original buffer -> its `_slot` var buffer

    def transform(self, node):
        if not (isinstance(node, ir.For) and node.kind == "pipelined" and node.schedule is not None):
            return super().transform(node)
        versioned = versioned_by(node)
        saved = self.slot_of
        self.slot_of = {**saved, **{b: slot_expr(node) for b in versioned}}
        loop = super().transform(node)
        self.slot_of = saved
        units, stages, orders = list(loop.body.stmts), list(loop.schedule.stages), list(loop.schedule.orders)
        for buf in versioned:
            if buf in self.slot_vars:
                unit, stage = _slot_unit(loop, buf, self.slot_vars[buf])
                units.append(unit)
                stages.append(stage)
                orders.append(len(orders))
        return dataclasses.replace(loop, body=ir.Seq(units, loop.body.loc),
                                   schedule=ir.PipelineSchedule(stages, orders, loop.schedule.staged))

    def visit_Region(self, r):
        slot = self.slot_of.get(r.buffer)
        return r if slot is None else ir.Region(r.buffer, (slot,) + tuple(r.starts), (1,) + tuple(r.extents))

    def visit_Load(self, n):
        slot = self.slot_of.get(n.buffer)
        return n if slot is None else dataclasses.replace(n, indices=(slot,) + tuple(n.indices))

    def visit_Store(self, n):
        slot = self.slot_of.get(n.buffer)
        return n if slot is None else dataclasses.replace(n, indices=(slot,) + tuple(n.indices))

    def visit_Alloc(self, n):
        slot_var = self.slot_vars.get(n.buffer)
        return n if slot_var is None else [n, ir.Alloc(slot_var, ir.Const(0), loc=n.loc)]


class _StagedMarker(Transformer):
    """Records each planned loop's register-staged wgmma operands in its schedule, while their
    extra versions fit in `room` bytes of shared memory."""

    def __init__(self, target, num_warps: int, uses: dict, room: int):
        self.target, self.num_warps, self.uses, self.room = target, num_warps, uses, room

    def visit_For(self, loop):
        staged = []
        for name in staged_operands(loop, self.target, self.num_warps, self.uses):
            buf = next(b for b in self.uses if b.name == name and b.scope == "shared")
            extra = buffer_bytes(buf) * (loop_depth(loop) - 1)
            if extra <= self.room:
                staged.append(name)
                self.room -= extra
        if not staged:
            return loop
        return dataclasses.replace(loop, schedule=dataclasses.replace(loop.schedule, staged=tuple(staged)))


def _shared_room(func: ir.PrimFunc, target) -> int:
    """Bytes of shared memory the target has beyond every shared buffer with its producers'
    versions, all allocated at once (an upper bound of what `shared_memory_budget` counts:
    buffers whose lifetimes do not overlap share bytes there)."""
    depth = {}
    for loop in planned_loops(func.kernel.body):
        for buf in versioned_by(loop):
            depth[buf] = max(depth.get(buf, 1), loop_depth(loop))
    used = sum(buffer_bytes(n.buffer) * depth.get(n.buffer, 1) for n in walk(func.kernel.body)
               if isinstance(n, ir.Alloc) and n.buffer.scope == "shared" and n.buffer.view_of is None)
    return target.shared_memory_limit - used


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    if getattr(target, "has_wgmma", False):
        func = _StagedMarker(target, func.kernel.threads // 32, _count_uses(func.kernel.body),
                             _shared_room(func, target)).transform(func)
    loops = planned_loops(func.kernel.body)
    versions, inside = {}, {}
    for loop in loops:
        for buf in versioned_by(loop):
            if buf.num_versions > 1:
                raise CompileError(f"internal: {buf.name} is already versioned", loop.loc)
            _check_guards(loop, buf)
            versions[buf] = max(versions.get(buf, 1), loop_depth(loop))
            inside[buf] = inside.get(buf, 0) + _count_uses(loop.body).get(buf, 0)
    if not versions:
        return func
    total = _count_uses(func.kernel.body)
    slot_vars = {buf: ir.Buffer(f"{buf.name}_slot", (1,), int32, "var", loc=buf.loc)
                 for buf in versions if total.get(buf, 0) > inside[buf]}
    outside_slot = {buf: ir.Load(var, (ir.Const(0),), int32) for buf, var in slot_vars.items()}
    indexed = _Indexer(outside_slot, slot_vars).transform(func)
    mapping = {buf: ir.Buffer(buf.name, (v,) + tuple(buf.shape), buf.dtype, buf.scope, origin=buf,
                              num_versions=v, annotated_layout=buf.annotated_layout, loc=buf.loc)
               for buf, v in versions.items()}
    return substitute_buffers(indexed, mapping)
