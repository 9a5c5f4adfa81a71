"""Explicit warp specialization (`T.ws` sections synchronised through `T.alloc_barrier`
mbarriers) serialized into one ordinary program.

TileLang programs may split a block's warp groups by hand: a producer section issuing
`T.tma_copy`s and a consumer section running the gemm, handing tiles back and forth through
`T.barrier_arrive` / `T.barrier_wait`.  When the sections, executed one after another in
program order, satisfy every wait, that order is a correct schedule of the program: the
barriers only delay a warp group until another one's earlier statements ran, which program
order already guarantees.  This pass proves that and then drops the hand-made schedule, so
the automatic passes (pipelining, warp specialization, persistent tiles) and both backends
compile the plain program.

Assumes: the frontend's IR; a `T.tma_copy` is already a plain `Copy` (its barrier only
signalled completion, and serial execution completes it at once).
Checks (a `CompileError` at the statement otherwise): the barrier operations run in program
order at compile time - the interpreter's mbarrier model (`interpreter/barriers.py`: an
arrival counts the threads of the enclosing `T.ws` groups, else the kernel's) - complete a
phase exactly at its arrive count and every wait finds the phase of its parity completed.
This needs the loops around barrier operations to have compile-time bounds and barrier
indices and parities computed from loop counters, constants and `Let`s of those (they are,
whenever the sizes are `T.const` or Python ints); barrier operations may not sit under an
`if` or a `while` (whether they run is known only at run time).
Guarantees: no `AllocBarrier`, `BarrierArrive`, `BarrierWait` or `WarpGroups` remains; each
`T.ws` body is spliced in place and runs on all of the kernel's threads (the block keeps its
`threads`, so a gemm the consumer group ran alone is shared by every warp group); a
`T.Pipelined` loop keeps its `num_stages` (with 0, as the hand-made schedules write, it stays
a serial loop).  Programs without these statements are returned unchanged.
"""
from __future__ import annotations

from dataclasses import replace

from tritile.errors import CompileError
from tritile.ir import nodes as ir
from tritile.ir.transform import Transformer, walk

_BARRIER_OPS = (ir.AllocBarrier, ir.BarrierArrive, ir.BarrierWait)
_EXPLICIT = (*_BARRIER_OPS, ir.WarpGroups)

# compile-time simulation steps (barrier statements executed) before giving up: loops of
# millions of iterations around barrier operations are not what hand-made schedules write
_MAX_STEPS = 1 << 20


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    if not any(isinstance(n, _EXPLICIT) for n in walk(func.kernel.body)):
        return func
    _ProgramOrder(func.kernel).run()
    return replace(func, kernel=replace(func.kernel, body=_Splice().transform(func.kernel.body)))


class _Splice(Transformer):
    """Drops the barriers and splices each `T.ws` body into its enclosing sequence."""

    def _drop(self, s):
        return None

    visit_AllocBarrier = visit_BarrierArrive = visit_BarrierWait = _drop

    def visit_WarpGroups(self, s: ir.WarpGroups):
        return list(s.body.stmts)


class _ProgramOrder:
    """Runs a kernel's barrier operations (and the loops, `T.ws` sections and `Let`s around
    them) in program order at compile time, on the interpreter's mbarrier model."""

    def __init__(self, kernel: ir.Kernel):
        # imported here: the interpreter's mbarrier model and integer semantics are the
        # definition this pass checks against (as persistent_tiles evaluates tile costs)
        from tritile.interpreter.barriers import Barriers
        from tritile.interpreter.expressions import Evaluator

        self.kernel = kernel
        self.threads = kernel.threads
        self.barriers = Barriers()
        self.env = {}
        self.loops = []  # the Vars of the loops being run, outermost first
        self.evaluator = Evaluator(self.env, None)
        self.steps = 0
        self._has_barrier_ops = {}  # id(statement) -> does it contain barrier operations

    def has_barrier_ops(self, s) -> bool:
        if id(s) not in self._has_barrier_ops:
            self._has_barrier_ops[id(s)] = any(isinstance(n, _BARRIER_OPS) for n in walk(s))
        return self._has_barrier_ops[id(s)]

    def run(self):
        self.exec(self.kernel.body)

    def value(self, e: ir.Expr, what: str, stmt) -> int:
        """`e` at compile time, or a CompileError at `stmt` saying why it is not known."""
        self.evaluator.stmt = stmt
        try:
            return int(self.evaluator.scalar(e))
        except CompileError:
            unknown = sorted({n.name for n in walk(e) if isinstance(n, ir.Var) and n not in self.env})
            why = f"it depends on {', '.join(unknown)}, known only at run time" if unknown else "it reads memory"
            raise CompileError(f"explicit warp specialization: {what} must be known at compile time, since tritile "
                               f"checks the barrier protocol before serializing the warp groups ({why})",
                               stmt.loc) from None

    def exec(self, s):
        if isinstance(s, ir.Seq):
            for t in s.stmts:
                self.exec(t)
        elif isinstance(s, ir.Let):
            self._let(s)
        elif not self.has_barrier_ops(s):
            return
        elif isinstance(s, ir.WarpGroups):
            outer, self.threads = self.threads, s.threads
            self.exec(s.body)
            self.threads = outer
        elif isinstance(s, ir.AllocBarrier):
            self.barriers.allocate(s.buffer, s.arrive_counts)
        elif isinstance(s, (ir.BarrierArrive, ir.BarrierWait)):
            self._barrier_op(s)
        elif isinstance(s, ir.For):
            self._for(s)
        else:
            kind = {ir.If: "an if", ir.While: "a while loop"}.get(type(s), type(s).__name__)
            raise CompileError(f"explicit warp specialization: barrier operations inside {kind} are not supported "
                               f"(tritile checks the barrier protocol at compile time and serializes the warp "
                               f"groups; whether they run is known only at run time)", s.loc)

    def _let(self, s: ir.Let):
        self.evaluator.stmt = s
        try:
            self.env[s.var] = self.evaluator.scalar(s.value)
        except CompileError:  # a runtime value: only an error if a barrier operation needs it
            self.env.pop(s.var, None)

    def _for(self, s: ir.For):
        start = self.value(s.start, "the start of a loop around barrier operations", s)
        stop = self.value(s.stop, "the bound of a loop around barrier operations", s)
        step = self.value(s.step, "the step of a loop around barrier operations", s)
        self.loops.append(s.var)
        for counter in range(start, stop, step):
            self.env[s.var] = counter
            self.exec(s.body)
        self.loops.pop()
        self.env.pop(s.var, None)

    def _barrier_op(self, s):
        self.steps += 1
        if self.steps > _MAX_STEPS:
            raise CompileError(f"explicit warp specialization: more than {_MAX_STEPS} barrier operations to check "
                               f"at compile time", s.loc)
        name = "T.barrier_arrive" if isinstance(s, ir.BarrierArrive) else "T.barrier_wait"
        index = self.value(s.index, f"the barrier index of {name}", s)
        try:
            if isinstance(s, ir.BarrierArrive):
                self.barriers.arrive(s.buffer, index, self.threads)
            else:
                self.barriers.wait(s.buffer, index, self.value(s.parity, "the parity of T.barrier_wait", s))
        except ValueError as err:
            at = f" (at {', '.join(f'{v.name} = {self.env[v]}' for v in self.loops)})" if self.loops else ""
            raise CompileError(f"explicit warp specialization: {err}{at}", s.loc) from None

