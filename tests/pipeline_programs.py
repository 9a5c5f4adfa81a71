"""Hand-built tile IR for the pipeline pass tests: blocked GEMMs whose K dimension is split
over one or more sibling `T.Pipelined` loops sharing `A_shared` / `B_shared`.

`gemm_program(loops, ...)` returns a `Program`: the frontend-level `PrimFunc`, a factory of
fresh random arguments and the torch reference of the outputs.  Every knob the property test
draws (stage counts, trip counts - static or runtime-dynamic -, block-sparse guards, an outer
serial loop, a read of `A_shared` after the loops, a shared buffer used only outside the
pipelines) maps to one argument here.

`mbarrier_problems(source, args, dims)` (end of the file) replays the mbarrier protocol of a
generated Gluon module on the host: a wait that no issued TMA copy / arrival can complete is a
GPU hang, found on CPU.  Warp-specialized modules (producer / consumer partitions) are replayed
with their partitions running concurrently, which also checks the shared slots they hand over
for races.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from tritile.ir import nodes as ir
from tritile.ir.dtypes import bool_, float16, float32, int32

LOC = ir.SourceLoc("pipeline_programs.py", 1, 0, "for k in T.Pipelined(...)")


@dataclass
class LoopSpec:
    num_stages: int
    trips: int
    guarded: bool = False  # body is `if mask[k] != 0: copy; copy; gemm`
    guard_let: bool = False  # the guard's condition bound first: `take = mask[k] != 0; if take:`
    dynamic: bool = False  # trip count is a runtime `T.dynamic` value
    order: Optional[list] = None
    stage: Optional[list] = None
    bind_offset: bool = False  # `kk = k * BK` as a replayed scalar Let
    promote_every: int = 0  # after the gemm, `if (k + 1) % n == 0: total += C_local; C_local = 0` (FP8 promotion)
    # how the promotion is written: "branch" (the two statements above), "one" (one T.Parallel
    # adding and clearing: a guarded statement), "masked" (the condition also reads mask[k]),
    # "every_step" (the two statements without the `if`, promote_every 1 as FP8 GEMM writes it)
    promote_form: str = "branch"


@dataclass
class Program:
    func: ir.PrimFunc
    loops: list
    dims: dict = field(default_factory=dict)  # {Var: int} for execute()
    grid: tuple = (1, 1)
    tiles: tuple = (16, 16, 16)
    outer: int = 1
    read_after: bool = False
    staged_store: bool = False

    def __repr__(self) -> str:  # what a failing hypothesis example prints
        return (f"gemm_program({self.loops!r}, tiles={self.tiles}, grid={self.grid}, outer={self.outer}, "
                f"read_after={self.read_after}, staged_store={self.staged_store})")

    def dim_values(self) -> list:
        """The runtime dims in the kernel's launch order (`func.dynamic_vars`)."""
        return [self.dims[v] for v in self.func.dynamic_vars]

    def make_args(self, seed: int):
        gen = torch.Generator().manual_seed(seed)
        bm, bn, bk = self.tiles
        gx, gy = self.grid
        m, n = gy * bm, gx * bn
        k = max(1, sum(spec.trips for spec in self.loops)) * bk
        a = torch.randn(m, k, generator=gen).to(torch.float16)
        b = torch.randn(k, n, generator=gen).to(torch.float16)
        mask = (torch.rand(max(1, sum(spec.trips for spec in self.loops)), generator=gen) < 0.6).to(torch.int32)
        c = torch.randn(m, n, generator=gen)  # overwritten by the kernel
        d = torch.randn(m, gx * bk, generator=gen)
        return [a, b, mask, c, d]

    def reference(self, args):
        a, b, mask, _, _ = args
        bm, bn, bk = self.tiles
        gx, gy = self.grid
        c = torch.zeros(gy * bm, gx * bn)
        last_tile = None  # global k-tile index of the last executed iteration
        base = 0
        for spec in self.loops:
            for kt in range(spec.trips):
                if spec.guarded and mask[base + kt] == 0:
                    continue
                cols = slice((base + kt) * bk, (base + kt + 1) * bk)
                c += a[:, cols].float() @ b[cols, :].float()
                last_tile = base + kt
            base += spec.trips
        c *= self.outer
        d = torch.zeros(gy * bm, gx * bk)
        if last_tile is not None:
            tile = a[:, last_tile * bk:(last_tile + 1) * bk].float()
            d = tile.repeat(1, gx)
        return c, d


def _region(buf, starts, extents):
    return ir.Region(buf, tuple(s if isinstance(s, ir.Expr) else ir.Const(s) for s in starts), tuple(extents))


def _add(a, b):
    return ir.BinOp("+", a, b if isinstance(b, ir.Expr) else ir.Const(b))


def _mul(a, b):
    return ir.BinOp("*", a, b if isinstance(b, ir.Expr) else ir.Const(b))


def _accumulate(dst, src, clear_src: bool = False) -> ir.Parallel:
    """``for i, j in T.Parallel(...): dst[i, j] += src[i, j]`` over two fragments of one shape
    (then ``src[i, j] = 0`` with `clear_src`)."""
    i, j = ir.Var("i"), ir.Var("j")
    value = ir.BinOp("+", ir.Load(dst, (i, j), float32), ir.Load(src, (i, j), float32), float32)
    stores = [ir.Store(dst, (i, j), value)] + ([ir.Store(src, (i, j), ir.Const(0.0, float32))] if clear_src else [])
    return ir.Parallel((i, j), dst.shape, ir.Seq(stores), loc=LOC)


def _promotion(spec: LoopSpec, k, kt, mask, total, partial) -> list:
    """`spec`'s promotion of the gemm's partial sum into `total` every `promote_every` steps."""
    clear = ir.Fill(ir.Region.full(partial), ir.Const(0.0, float32))
    if spec.promote_form == "every_step":
        return [_accumulate(total, partial), clear]
    due = ir.BinOp("==", ir.BinOp("%", _add(k, 1), ir.Const(spec.promote_every)), ir.Const(0), bool_)
    if spec.promote_form == "masked":
        due = ir.BinOp("or", due, ir.BinOp("<", ir.Load(mask, (kt,), int32), ir.Const(0), bool_), bool_)
    if spec.promote_form == "one":
        return [ir.If(due, ir.Seq([_accumulate(total, partial, clear_src=True)]), loc=LOC)]
    return [ir.If(due, ir.Seq([_accumulate(total, partial), clear]), loc=LOC)]


def gemm_program(loops, tiles=(16, 16, 16), grid=(1, 1), outer: int = 1, read_after: bool = False,
                 staged_store: bool = False) -> Program:
    """C = A @ B over the K tiles of `loops` (masked where guarded), times `outer`; with
    `read_after`, D[block] = the A tile of the last executed iteration (0 when none ran);
    with `staged_store`, C goes through a shared buffer used only outside the pipelines."""
    bm, bn, bk = tiles
    gx, gy = grid
    total = max(1, sum(spec.trips for spec in loops))
    A = ir.Buffer("A", (gy * bm, total * bk), float16, "global")
    B = ir.Buffer("B", (total * bk, gx * bn), float16, "global")
    mask = ir.Buffer("mask", (total,), int32, "global")
    C = ir.Buffer("C", (gy * bm, gx * bn), float32, "global")
    D = ir.Buffer("D", (gy * bm, gx * bk), float32, "global")
    bx, by = ir.Var("bx"), ir.Var("by")
    A_s = ir.Buffer("A_shared", (bm, bk), float16, "shared")
    B_s = ir.Buffer("B_shared", (bk, bn), float16, "shared")
    C_l = ir.Buffer("C_local", (bm, bn), float32, "fragment")
    body = [ir.Alloc(A_s), ir.Alloc(B_s), ir.Alloc(C_l), ir.Fill(ir.Region.full(C_l), ir.Const(0.0, float32))]
    total_l = ir.Buffer("total", (bm, bn), float32, "fragment")
    promotes = any(spec.promote_every for spec in loops)
    if promotes:
        body += [ir.Alloc(total_l), ir.Fill(ir.Region.full(total_l), ir.Const(0.0, float32))]
    if read_after:
        body.append(ir.Fill(ir.Region.full(A_s), ir.Const(0.0, float16)))
    dims, inner, base = {}, [], 0
    for idx, spec in enumerate(loops):
        k = ir.Var(f"k{idx}")
        stop = ir.Const(spec.trips)
        if spec.dynamic:
            stop = ir.Var(f"n{idx}")
            dims[stop] = spec.trips
        kt = _add(k, base)
        stmts = []
        if spec.bind_offset:
            kk = ir.Var(f"kk{idx}")
            stmts.append(ir.Let(kk, _mul(kt, bk)))
            col = kk
        else:
            col = _mul(kt, bk)
        stmts += [
            ir.Copy(_region(A, (_mul(by, bm), col), (bm, bk)), ir.Region.full(A_s), loc=LOC),
            ir.Copy(_region(B, (col, _mul(bx, bn)), (bk, bn)), ir.Region.full(B_s), loc=LOC),
            ir.Gemm(ir.Region.full(A_s), ir.Region.full(B_s), ir.Region.full(C_l), loc=LOC),
        ]
        if spec.promote_every:  # inside the block-sparse guard: a loop body of one `if` is distributed
            stmts += _promotion(spec, k, kt, mask, total_l, C_l)
        if spec.guarded:
            cond = ir.BinOp("!=", ir.Load(mask, (kt,), int32), ir.Const(0), bool_)
            if spec.guard_let:
                take = ir.Var(f"take{len(inner)}", bool_)
                stmts = [ir.Let(take, cond, loc=LOC), ir.If(take, ir.Seq(stmts), loc=LOC)]
            else:
                stmts = [ir.If(cond, ir.Seq(stmts), loc=LOC)]
        inner.append(ir.For(k, ir.Const(0), stop, ir.Seq(stmts), kind="pipelined", num_stages=spec.num_stages,
                            order=spec.order, stage=spec.stage, loc=LOC))
        base += spec.trips
    if outer > 1:
        body.append(ir.For(ir.Var("r"), ir.Const(0), ir.Const(outer), ir.Seq(inner), loc=LOC))
    else:
        body += inner
    if promotes:
        body.append(_accumulate(C_l, total_l))
    if staged_store:
        S_s = ir.Buffer("C_shared", (bm, bn), float32, "shared")
        body += [ir.Alloc(S_s), ir.Copy(ir.Region.full(C_l), ir.Region.full(S_s)),
                 ir.Copy(ir.Region.full(S_s), _region(C, (_mul(by, bm), _mul(bx, bn)), (bm, bn)))]
    else:
        body.append(ir.Copy(ir.Region.full(C_l), _region(C, (_mul(by, bm), _mul(bx, bn)), (bm, bn))))
    if read_after:
        body.append(ir.Copy(ir.Region.full(A_s), _region(D, (_mul(by, bm), _mul(bx, bk)), (bm, bk))))
    kernel = ir.Kernel((ir.Const(gx), ir.Const(gy)), (bx, by), 128, ir.Seq(body))
    # runtime trip counts are the kernel's dynamic scalars (launch arguments on CUDA)
    func = ir.PrimFunc("pipelined_gemm", [A, B, mask, C, D], kernel, out_idx=[3, 4], loc=LOC,
                       dynamic_vars=list(dims))
    return Program(func, list(loops), dims, grid, tiles, outer, read_after, staged_store)


# ---------------------------------------------------------------- mbarrier protocol replay
#
# `mbarrier_problems(source, args, dims)` executes a generated Gluon module (one thread of
# control; warp-specialized modules: see "warp-specialized replay" below) on the host with
# stand-ins for Gluon: tensors are opaque, only the `mask` tensor's values are read (block-sparse
# guards), TMA copies complete at once, and every mbarrier of every block is tracked (arrivals,
# transaction bytes, completed phases).  A copy issued by the one thread of control can only
# complete, so a `mbarrier.wait(bar, parity)` whose parity still matches the current phase once
# every copy issued before it has landed blocks forever: a hang on the GPU (whatever the
# timing).  Also reported: an invalidate with a phase half done (TMA in flight), a barrier index
# outside its ring, and TMA copies no wait stands for: a phase completed by copies that no
# `mbarrier.wait` has seen when its barrier is invalidated or the block exits (on the GPU those
# copies may still be writing bytes that the code after them reuses, or that the CTA leaves).
# `//` / `%` / shifts are evaluated with Triton's (C) semantics; integer scalars
# (`gl.to_tensor(n)`, `gl.maximum` / `gl.minimum` of ints) stay Python ints.

import ast as _ast


class MbarrierProblem(Exception):
    pass


class _Opaque:
    """Any tensor value: every operation gives another opaque value; never a branch condition."""

    def __getattr__(self, name):
        return _OPAQUE_FN

    def __call__(self, *args, **kwargs):
        return self

    def __getitem__(self, key):
        return self

    def __bool__(self):
        raise MbarrierProblem("a branch on a tensor value the replay does not model")

    def _op(self, *other):
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _op
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = __neg__ = __invert__ = _op
    __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = _op
    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _op
    __hash__ = object.__hash__


_OPAQUE = _Opaque()


def _OPAQUE_FN(*args, **kwargs):
    return _OPAQUE


class _MaskPtr:
    def __init__(self, values, offset=0):
        self.values, self.offset = values, offset

    def __add__(self, k):
        return _MaskPtr(self.values, self.offset + k) if isinstance(k, int) else _OPAQUE

    __radd__ = __add__


class _Scalar(int):
    """`gl.to_tensor(n)` of an int: the int (arithmetic gives plain ints), `.to(dtype)` too."""

    def to(self, *a, **k):
        return self


class _BarLayout:
    pass


class _Barrier:
    def __init__(self, name):
        self.name, self.count, self.arrived, self.tx, self.completed, self.valid = name, None, 0, 0, 0, False
        # one thread of control: did TMA copies land on the current phase, the last phase they
        # completed, the phases a returning wait has seen
        self.copied, self.landed, self.seen = False, 0, 0

    def _settle(self):
        if self.valid and self.arrived == self.count and self.tx == 0:
            self.completed, self.arrived = self.completed + 1, 0
            if self.copied:
                self.landed, self.copied = self.completed, False

    def unwaited(self, when: str):
        """Raise when a phase TMA copies completed is one no wait has seen."""
        if self.landed > self.seen:
            raise MbarrierProblem(f"TMA copies completing phase {self.landed} of {self.name} are waited for "
                                  f"by no mbarrier.wait {when}: they may still be in flight")


class _Ring:
    def __init__(self, stages, name, barrier=_Barrier):
        self.bars = [barrier(f"{name}[{i}]") for i in range(stages)]

    def index(self, i):
        return (self, i)


def _bar(ref):
    ring, i = ref
    if not isinstance(i, int) or not 0 <= i < len(ring.bars):
        raise MbarrierProblem(f"barrier index {i} outside a ring of {len(ring.bars)}")
    return ring.bars[i]


class _State:
    def __init__(self):
        self.rings, self.events, self.bars = 0, [], []


def _stand_ins(state):
    class GL:
        constexpr = int32 = int64 = float16 = float32 = bfloat16 = None

        def __getattr__(self, name):
            return _OPAQUE_FN

        @staticmethod
        def program_id(axis):
            return state.pid[axis]

        @staticmethod
        def static_range(*a):
            return range(*a)

        @staticmethod
        def to_tensor(a):  # a persistent kernel's running ring counters start as `gl.to_tensor(0)`
            return _Scalar(a) if isinstance(a, int) else _OPAQUE

        @staticmethod
        def maximum(a, b):
            return max(a, b) if isinstance(a, int) and isinstance(b, int) else _OPAQUE

        @staticmethod
        def minimum(a, b):
            return min(a, b) if isinstance(a, int) and isinstance(b, int) else _OPAQUE

        @staticmethod
        def load(ptr, *a, **k):
            if isinstance(ptr, _MaskPtr):
                return int(ptr.values[ptr.offset])
            return _OPAQUE

        @staticmethod
        def allocate_shared_memory(dtype, shape, layout, *a, _name=None):
            if isinstance(layout, _BarLayout):
                state.rings += 1
                ring = _Ring(shape[0], _name or f"ring{state.rings}")
                state.bars += ring.bars
                return ring
            return _OPAQUE

    class MBarrier:
        MBarrierLayout = _BarLayout

        @staticmethod
        def init(ref, count):
            b = _bar(ref)
            b.count, b.arrived, b.tx, b.completed, b.valid = count, 0, 0, 0, True
            b.copied, b.landed, b.seen = False, 0, 0

        @staticmethod
        def invalidate(ref):
            b = _bar(ref)
            if b.arrived or b.tx:
                raise MbarrierProblem(f"invalidate of {b.name} with a phase in flight "
                                      f"(arrivals {b.arrived}, tx bytes {b.tx})")
            b.unwaited("before its invalidate")
            b.valid = False

        @staticmethod
        def expect(ref, nbytes, pred=True):
            if pred:
                b = _bar(ref)
                state.events.append(f"expect {b.name} {nbytes}")
                b.tx += nbytes
                b.arrived += 1
                b._settle()

        @staticmethod
        def arrive(ref, pred=True, count=1):
            if pred:
                b = _bar(ref)
                b.arrived += count
                b._settle()

        @staticmethod
        def wait(ref, phase, pred=True, deps=None):
            if pred:
                b = _bar(ref)
                state.events.append(f"wait {b.name} parity {phase}")
                if not b.valid:
                    raise MbarrierProblem(f"wait on {b.name}, not initialised")
                if (b.completed & 1) == (phase & 1):
                    raise MbarrierProblem(
                        f"block {state.pid}: mbarrier.wait({b.name}, parity {phase}) never returns: "
                        f"{b.completed} phases completed, the current one has {b.arrived}/{b.count} "
                        f"arrivals and {b.tx} tx bytes outstanding; last events: {state.events[-6:]}")
                b.seen = b.completed

    class TMA:
        @staticmethod
        def async_copy_global_to_shared(desc, coords, ref, dst, pred=True):
            if pred:
                b = _bar(ref)
                state.events.append(f"copy {desc.name} -> {b.name} {desc.nbytes}")
                b.tx -= desc.nbytes
                b.copied = True
                b._settle()

        def __getattr__(self, name):
            return _OPAQUE_FN

    class Desc:
        def __init__(self, tensor, shape, strides, block, layout, padding=None):
            self.name = "desc"
            self.nbytes = tensor.element_size()
            for e in block:
                self.nbytes *= e

    class Gluon:
        @staticmethod
        def jit(fn):
            return fn

    return {"gluon": Gluon(), "gl": GL(), "cp": _OPAQUE, "mma_v2": _OPAQUE_FN, "fence_async_shared": _OPAQUE_FN,
            "mbarrier": MBarrier(), "tma": TMA(), "warpgroup_mma": _OPAQUE_FN, "warpgroup_mma_init": _OPAQUE_FN,
            "warpgroup_mma_wait": _mma_wait, "TensorDescriptor": Desc, "_cdiv": _cdiv, "_cmod": _cmod,
            "_cshl": _cshl, "_cshr": _cshr, "async_reduce_add": _OPAQUE_FN}


def _mma_wait(num_outstanding=0, deps=()):
    return _OPAQUE if len(deps) == 1 else tuple(_OPAQUE for _ in deps)


def _cdiv(a, b):  # Triton's integer `//`: truncates toward zero
    if isinstance(a, int) and isinstance(b, int):
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    return _OPAQUE


def _cmod(a, b):  # Triton's integer `%`: the sign of the dividend
    if isinstance(a, int) and isinstance(b, int):
        return a - b * _cdiv(a, b)
    return _OPAQUE


def _cshl(a, b):  # a shift by a negative or too large amount is undefined (a predicated-off value)
    return a << b if isinstance(a, int) and isinstance(b, int) and 0 <= b < 64 else _OPAQUE


def _cshr(a, b):
    return a >> b if isinstance(a, int) and isinstance(b, int) and 0 <= b < 64 else _OPAQUE


def _floor_helpers(ns):
    """The module's `_floordiv` / `_floormod` (tritile's floor `//` and `%`, written with Triton's
    truncating operators and tensor casts) on the host: Python's own operators on ints."""
    ns["_floordiv"] = lambda a, b: a // b if isinstance(a, int) and isinstance(b, int) else _OPAQUE
    ns["_floormod"] = lambda a, b: a % b if isinstance(a, int) and isinstance(b, int) else _OPAQUE


class _CSemantics(_ast.NodeTransformer):
    def visit_BinOp(self, node):
        self.generic_visit(node)
        fn = {_ast.FloorDiv: "_cdiv", _ast.Mod: "_cmod", _ast.LShift: "_cshl", _ast.RShift: "_cshr"}.get(type(node.op))
        if fn is None:
            return node
        return _ast.copy_location(_ast.Call(_ast.Name(fn, _ast.Load()), [node.left, node.right], []), node)


def _stand_in_args(names, kernel_args, ns) -> list:
    """The generated kernel's arguments on the host: the tensor named `mask` and the module's
    constant tables are read (mask values guard copies, a persistent tile schedule deals the
    tiles), other tensors are opaque, scalars and descriptors stay."""
    read = {"mask"} | {name for name, _ in ns.get("CONSTANT_TABLES", ())}
    return [_MaskPtr(a.flatten().tolist()) if n in read else (_OPAQUE if hasattr(a, "element_size") else a)
            for n, a in zip(list(names) + [None] * len(kernel_args), kernel_args)]


def _launch_args(ns, args, dims) -> list:
    """`tritile_launch`'s arguments after `launch`: the tensors, the module's constant tables
    (as the runtime passes them) and the dims."""
    return [*args, *(torch.tensor(values, dtype=torch.int32) for _, values in ns.get("CONSTANT_TABLES", ())), *dims]


def mbarrier_problems(source: str, args, dims=(), schedules=None) -> list:
    """Replay generated module `source` launched with CPU tensors `args` (the kernel's params,
    in order; the one named `mask` is read) and runtime `dims`: the list of mbarrier problems.
    A warp-specialized module's partitions run concurrently (see "warp-specialized replay"
    below), under each of `schedules` (default `SCHEDULES`); passing `schedules` replays a
    module without partitions that way too (its kernel body as the one partition)."""
    tree = _ast.parse(source)
    tree.body = [s for s in tree.body if not isinstance(s, (_ast.Import, _ast.ImportFrom))]
    tree = _ast.fix_missing_locations(_Names().visit(_CSemantics().visit(tree)))
    if schedules is not None or "gl.warp_specialize(" in source:
        return _replay_partitions(tree, args, dims, schedules or SCHEDULES)
    state = _State()
    ns = _stand_ins(state)
    exec(compile(tree, "<generated gluon>", "exec"), ns)
    _floor_helpers(ns)
    launch = ns["tritile_launch"]
    names = launch.__code__.co_varnames[1:launch.__code__.co_argcount]
    problems = []

    class Compiled:
        def __getitem__(self, grid):
            def run(*kernel_args):
                kernel_args = _stand_in_args(names, kernel_args, ns)
                for z in range(grid[2]):
                    for y in range(grid[1]):
                        for x in range(grid[0]):
                            state.pid, state.events, state.bars = (x, y, z), [], []
                            try:
                                kernel(*kernel_args)
                                for b in state.bars:
                                    if b.valid:
                                        b.unwaited("before the block exits")
                            except MbarrierProblem as err:
                                problems.append(str(err))
            return run

    kernel = None
    for node in tree.body:  # the kernel is the last @gluon.jit function before the launcher
        if isinstance(node, _ast.FunctionDef) and node.name not in ("tritile_launch", "_add_combine"):
            kernel = ns[node.name]
    launch(_launcher(ns, Compiled()), *_launch_args(ns, args, dims))
    return problems


def _launcher(ns, compiled):
    """The generated `tritile_launch`'s `launch(grid, tensors, tma_operands, dims)` (the protocol
    of `tritile.runtime.launcher`) over a replay's `compiled[grid](*kernel_args)`, with the
    module's own (stand-in) TensorDescriptor."""
    def launch(grid, tensors, tma_operands, dims):
        descriptors = [ns["TensorDescriptor"](tensor, shape, strides, block, layout)
                       for (tensor, shape, strides), (block, layout) in zip(tma_operands, ns["TMA_DESCRIPTORS"])]
        compiled[grid](*tensors, *descriptors, *dims)
    return launch


# ---------------------------------------------------------------- warp-specialized replay
#
# A warp-specialized module forks its kernel into partitions (`gl.warp_specialize([(fn, args),
# ...], warps, regs)`): consumers and a TMA producer that run concurrently and hand the slots of
# the shared rings over through mbarriers (the producer waits on an `*_empty` barrier, expects
# and copies into a slot signalling its full barrier; a consumer waits on the full barrier,
# reads the slot and arrives on the empty one).  The replay runs every partition as a coroutine:
# each statement `mbarrier.wait(...)` of the module is rewritten into `yield mbarrier.wait(...)`,
# the stand-in returns (barrier, parity) and a scheduler resumes the partition once that wait
# may return - the barrier's current (incomplete) phase has the other parity, which is what
# `mbarrier.try_wait.parity` tests on the GPU.  Partitions only interleave at waits; between two
# waits a partition runs alone, which loses nothing: its other barrier operations (expect,
# arrive, copy) never block.  Found:
#
# * deadlocks - no partition can run (each is finished or waits on a phase of its parity that
#   is current) and no copy is in flight: whatever the timing, the GPU hangs there;
# * an arrival overflowing a phase (more arrivals than the barrier's pending count), a wait on
#   an uninitialised barrier, a barrier index outside its ring, an invalidate mid-phase;
# * shared-memory races, with vector clocks: each partition keeps a clock (how far it knows
#   every other partition's progress); an arrive / expect / TMA copy releases the issuer's clock
#   into the barrier's phase, a wait that returns acquires everything released into the
#   barrier's completed phases.  Every TMA copy is an event of its own (copies land
#   asynchronously and in any order), joined into its barrier's phase when it lands.  Shared
#   buffer slots (`X_shared.index(k)`) record their last write (TMA copy or `.store`) and the
#   reads since (`.load`, `warpgroup_mma` operands - an async wgmma reads until the
#   `warpgroup_mma_wait` that retires it -, TMA-store sources until `tma.store_wait`).  A read
#   the writer's event is not ordered before, or a write that some earlier read or write is not
#   ordered before, is a race whatever the schedule: e.g. a producer refilling a slot whose
#   empty-barrier wait does not cover the consumer's release of that slot, or a wait whose
#   parity aliases an older phase (the barrier ran two phases ahead) so that it returns before
#   the copy it stands for has landed;
# * TMA copies no partition ever waits for (still in flight when the program exits).
#
# The order in which ready partitions run (and, for lazy schedules, when copies land) is a
# `schedule`: "producer-first" always resumes the last ready partition (the producer runs as far
# ahead as its empty barriers let it) and lands every copy at once; "consumers-first" resumes the
# first ready one and lands copies only when no partition can run; "random-N" picks a random
# ready partition or in-flight copy at each step (seed N).  Deadlocks of a correct-parity
# protocol and races found by the clocks do not depend on the schedule; several schedules cover
# protocols whose waits alias phases.

import inspect as _inspect
import random as _random
import sys as _sys

_GENERATED = "<generated gluon>"
SCHEDULES = ("producer-first", "consumers-first", "random-1")


def _line() -> int:
    """The line of the generated module being executed (its innermost frame)."""
    frame = _sys._getframe(1)
    while frame is not None and frame.f_code.co_filename != _GENERATED:
        frame = frame.f_back
    return frame.f_lineno if frame is not None else 0


class _Clock(dict):
    """A vector clock: {component: count}; a partition's component counts its releases, a TMA
    copy's component (1 once landed) is its own."""

    def join(self, other):
        for key, value in other.items():
            if value > self.get(key, 0):
                self[key] = value
        return self

    def knows(self, event) -> bool:
        return self.get(event[0], 0) >= event[1]


class _WSBarrier(_Barrier):
    """A `_Barrier` that also carries the clocks released into its current phase (`pending`)
    and into all its completed phases (`released`: what a returning wait acquires)."""

    def __init__(self, name):
        super().__init__(name)
        self.pending, self.released = _Clock(), _Clock()

    def _settle(self):
        if self.valid and self.arrived == self.count and self.tx == 0:
            self.completed, self.arrived = self.completed + 1, 0
            self.released.join(self.pending)
            self.pending = _Clock()

    def describe(self) -> str:
        return (f"{self.completed} phases completed, the current one has {self.arrived}/{self.count} "
                f"arrivals and {self.tx} tx bytes outstanding")


class _Partition:
    """One partition of `gl.warp_specialize` (or the kernel body): a coroutine and its clock."""

    def __init__(self, name, clock):
        self.name, self.clock = name, _Clock(clock)
        self.clock[name] = self.clock.get(name, 0) + 1
        self.gen, self.waiting, self.done, self.copies = None, None, False, 0
        self.mma_reads, self.store_reads = [], []  # groups [(view, what, line)] read asynchronously

    def tick(self):  # after a release: later events are not covered by it
        self.clock[self.name] += 1

    def where(self) -> int:
        frame = self.gen.gi_frame if self.gen is not None else None
        return frame.f_lineno if frame is not None else 0


class _Copy:
    """A TMA copy in flight: lands its bytes and its event on its barrier's current phase."""

    def __init__(self, bar, nbytes, clock, dst, line):
        self.bar, self.nbytes, self.clock, self.dst, self.line = bar, nbytes, clock, dst, line

    def land(self):
        if not self.bar.valid:
            raise MbarrierProblem(f"TMA copy into {self.dst} (line {self.line}) lands on {self.bar.name}, "
                                  f"not initialised")
        self.bar.tx -= self.nbytes
        self.bar.pending.join(self.clock)
        self.bar._settle()


class _Cell:
    """Race bookkeeping of one shared slot (or a whole buffer): its last write and the reads since."""

    def __init__(self):
        self.write, self.reads = None, {}  # (event, who, what, line); {partition: (count, what, line)}


class _SharedBuffer:
    def __init__(self, name, shape):
        self.name, self.shape, self.cells = name, shape, {}

    def cell(self, index) -> _Cell:
        return self.cells.setdefault(index, _Cell())


class _Smem(_Opaque):
    """A shared buffer (`index` None) or one slot of it: loads, stores and the async operations
    taking it are recorded; views (permute, slice, ...) stand for the same slot."""

    def __init__(self, state, buf, index=None):
        self.state, self.buf, self.idx = state, buf, index
        self.name = buf.name if index is None else f"{buf.name}[{index}]"

    def index(self, i):
        if self.idx is not None:
            return self  # a sub-slot: conservatively, the whole slot
        if not isinstance(i, int):
            return _OPAQUE
        return _Smem(self.state, self.buf, i)  # a slot outside the buffer is an error once accessed

    def _view(self, *a, **k):
        return self

    permute = slice = reshape = _reinterpret = trans = _view

    def load(self, *a, **k):
        self.state.read(self, "load")
        return _OPAQUE

    def store(self, value, *a, **k):
        self.state.write(self, "store")

    def overlaps(self, other) -> bool:
        return self.buf is other.buf and (self.idx is None or other.idx is None or self.idx == other.idx)

    def cells(self) -> list:  # own cell first, then the cells it overlaps
        if self.idx is not None and not 0 <= self.idx < self.buf.shape[0]:
            raise MbarrierProblem(f"{self.name} accessed (line {_line()}) outside its {self.buf.shape[0]} slots")
        if self.idx is None:
            return [self.buf.cell(None)] + [c for i, c in self.buf.cells.items() if i is not None]
        return [self.buf.cell(self.idx), self.buf.cell(None)]


class _WSState(_State):
    """The replay of one block under one schedule: partitions, copies in flight, problems."""

    def __init__(self, schedule, pid):
        super().__init__()
        self.schedule, self.pid, self.in_flight, self.issued, self.races = schedule, pid, [], [], {}
        self.rng = _random.Random(f"{schedule}{pid}")
        self.current = self.main = _Partition("kernel", {})
        self.partitions = [self.main]

    # -- shared memory races
    def race(self, key, message):
        self.races.setdefault(key, message)

    def read(self, view, what, later=None):
        """`current` reads `view` now (`later`: an async group list that retires it later)."""
        me, line = self.current, _line()
        for cell in view.cells():
            w = cell.write
            if w is not None and not me.clock.knows(w[0]):
                self.race(("read", line, w[3]), f"{me.name} reads {view.name} ({what}, line {line}) unordered "
                          f"after {w[1]}'s write of it ({w[2]}, line {w[3]}): no mbarrier wait orders them")
        if later is None:
            view.buf.cell(view.idx).reads[me.name] = (me.clock[me.name], what, line)
        else:
            later.append((view, what, line))

    def retire(self, partition, groups, keep):
        """Async reads of `partition` complete: all its `groups` but the last `keep`."""
        keep = keep if isinstance(keep, int) else 0
        done, groups[:] = groups[:max(0, len(groups) - keep)], groups[max(0, len(groups) - keep):]
        for group in done:
            for view, what, line in group:
                view.buf.cell(view.idx).reads[partition.name] = (partition.clock[partition.name], what, line)

    def write(self, view, what, event=None):
        """`current` writes `view` (a TMA copy: `event` is the copy's own, landing later)."""
        me, line = self.current, _line()
        event = event or (me.name, me.clock[me.name])
        for cell in view.cells():
            w = cell.write
            if w is not None and not me.clock.knows(w[0]):
                self.race(("write-write", line, w[3]), f"{me.name} overwrites {view.name} ({what}, line {line}) "
                          f"unordered after {w[1]}'s write of it ({w[2]}, line {w[3]})")
            for who, (count, rwhat, rline) in cell.reads.items():
                if not me.clock.knows((who, count)):
                    self.race(("write-read", line, rline), f"{me.name} overwrites {view.name} ({what}, line {line}) "
                              f"before {who}'s read of it ({rwhat}, line {rline}) is released to it: the slot "
                              f"is refilled while still in use")
        for p in self.partitions:
            for group in p.mma_reads + p.store_reads:
                for other, rwhat, rline in group:
                    if other.overlaps(view):
                        self.race(("write-pending", line, rline), f"{me.name} overwrites {view.name} ({what}, line "
                                  f"{line}) while {p.name}'s async {rwhat} (line {rline}) still reads it")
        cell = view.buf.cell(view.idx)
        cell.write, cell.reads = (event, me.name, what, line), {}

    # -- barriers
    def arrive(self, bar, count, what):
        me = self.current
        if not bar.valid:
            raise MbarrierProblem(f"{me.name}: {what} on {bar.name} (line {_line()}), not initialised")
        if bar.arrived + count > bar.count:
            raise MbarrierProblem(f"{me.name}: {what} on {bar.name} (line {_line()}) overflows its phase: "
                                  f"{bar.arrived} + {count} arrivals for a count of {bar.count}")
        bar.arrived += count
        bar.pending.join(me.clock)
        me.tick()
        bar._settle()

    def copy(self, desc, bar, dst):
        me, line = self.current, _line()
        me.copies += 1
        event = (f"{me.name}:copy{me.copies}", 1)
        name = dst.name if isinstance(dst, _Smem) else "shared memory"
        if isinstance(dst, _Smem):
            self.write(dst, f"TMA copy signalling {bar.name}", event)
        clock = _Clock(me.clock)
        clock[event[0]] = 1
        me.tick()
        copy = _Copy(bar, desc.nbytes, clock, name, line)
        self.issued.append((event, me.name, name, line))
        if self.schedule == "producer-first":
            copy.land()
        else:
            self.in_flight.append(copy)

    # -- the scheduler
    def ready(self, p) -> bool:
        return not p.done and (p.waiting is None or (p.waiting[0].completed & 1) != p.waiting[1])

    def resume(self, p):
        if p.waiting is not None:
            p.clock.join(p.waiting[0].released)
            p.waiting = None
        self.current = p
        try:
            p.waiting = next(p.gen)
        except StopIteration:
            self.finish(p)

    def finish(self, p):
        p.done = True
        self.retire(p, p.mma_reads, 0)
        self.retire(p, p.store_reads, 0)

    def run(self, partitions):
        """Run `partitions` (started coroutines) until all finish; a deadlock raises."""
        while True:
            ready = [p for p in partitions if self.ready(p)]
            if not ready and not self.in_flight:
                blocked = [p for p in partitions if not p.done]
                if not blocked:
                    return
                raise MbarrierProblem("deadlock: " + "; ".join(
                    f"{p.name} waits (line {p.where()}) on {p.waiting[0].name} parity {p.waiting[1]}: "
                    f"{p.waiting[0].describe()}" for p in blocked) +
                    (f"; finished: {', '.join(p.name for p in partitions if p.done)}"
                     if any(p.done for p in partitions) else ""))
            if self.schedule.startswith("random"):
                pick = self.rng.choice(ready + self.in_flight)
            elif ready:
                pick = ready[-1] if self.schedule == "producer-first" else ready[0]
            else:  # "consumers-first": copies land only when no partition can run
                pick = self.in_flight[0]
            if isinstance(pick, _Copy):
                self.in_flight.remove(pick)
                pick.land()
            else:
                self.resume(pick)

    def fork(self, partitions):
        """`gl.warp_specialize`: start every partition from the kernel's clock, run, join."""
        main = self.current
        started = []
        for i, (fn, fn_args) in enumerate(partitions):
            p = _Partition(f"{fn.__name__}/{i}", main.clock)
            self.partitions.append(p)
            self.current = p
            out = fn(*fn_args)
            if _inspect.isgenerator(out):
                p.gen = out
            else:
                self.finish(p)
            started.append(p)
        self.run(started)
        self.current = main
        for p in started:
            main.clock.join(p.clock)
        main.tick()
        for event, who, dst, line in self.issued:
            if not main.clock.knows(event):
                self.race(("unwaited", line), f"{who}'s TMA copy into {dst} (line {line}) is waited for by no "
                          f"partition: still in flight when the program exits")
        while self.in_flight:
            self.in_flight.pop(0).land()


def _ws_stand_ins(state):
    """`_stand_ins` with partitions, shared-buffer slots and the barrier clocks of `state`."""
    ns = _stand_ins(state)

    class GL(type(ns["gl"])):
        @staticmethod
        def program_id(axis):
            return state.pid[axis]

        @staticmethod
        def allocate_shared_memory(dtype, shape, layout, *a, _name=None):
            if isinstance(layout, _BarLayout):
                state.rings += 1
                return _Ring(shape[0], _name or f"ring{state.rings}", _WSBarrier)
            return _Smem(state, _SharedBuffer(_name or "smem", list(shape)))

        @staticmethod
        def warp_specialize(partitions, *a, **k):
            if not isinstance(partitions, (list, tuple)) or not all(isinstance(p, tuple) for p in partitions):
                raise NotImplementedError("gl.warp_specialize: only the [(fn, args), ...] form is replayed")
            state.fork(partitions)

    one_partition = type(ns["mbarrier"])

    class MBarrier(one_partition):  # init and invalidate as with one partition, plus clocks
        @staticmethod
        def init(ref, count):
            one_partition.init(ref, count)
            b = _bar(ref)
            b.pending, b.released = _Clock(), _Clock()

        @staticmethod
        def expect(ref, nbytes, pred=True):
            if pred:
                b = _bar(ref)
                b.tx += nbytes
                state.arrive(b, 1, "expect")

        @staticmethod
        def arrive(ref, pred=True, count=1):
            if pred:
                state.arrive(_bar(ref), count, "arrive")

        @staticmethod
        def wait(ref, phase, pred=True, deps=None):
            if not pred:
                return None
            b = _bar(ref)
            if not b.valid:
                raise MbarrierProblem(f"{state.current.name}: wait on {b.name} (line {_line()}), not initialised")
            if not isinstance(phase, int):
                raise MbarrierProblem(f"wait on {b.name} (line {_line()}) with a parity the replay does not model")
            return b, phase & 1

    class TMA:
        @staticmethod
        def async_copy_global_to_shared(desc, coords, ref, dst, pred=True):
            if pred:
                state.copy(desc, _bar(ref), dst)

        @staticmethod
        def async_copy_shared_to_global(desc, coords, src):
            if isinstance(src, _Smem):
                group = []
                state.read(src, "TMA store", group)
                state.current.store_reads.append(group)

        @staticmethod
        def store_wait(pendings=0):
            state.retire(state.current, state.current.store_reads, pendings)

        def __getattr__(self, name):
            return _OPAQUE_FN

    def warpgroup_mma(a, b, acc, *args, is_async=False, **kwargs):
        group = []
        for operand in (a, b):
            if isinstance(operand, _Smem):
                state.read(operand, "warpgroup_mma", group)
        state.current.mma_reads.append(group)
        if not is_async:  # retired at once (with the groups issued before it)
            state.retire(state.current, state.current.mma_reads, 0)
        return _OPAQUE

    def warpgroup_mma_wait(num_outstanding=0, deps=()):
        state.retire(state.current, state.current.mma_reads, num_outstanding)
        return _mma_wait(num_outstanding, deps)

    # a TMA reduce (codegen/gluon/tma_reduce.py) reads its staging tile as a TMA store does
    ns.update(gl=GL(), mbarrier=MBarrier(), tma=TMA(), warpgroup_mma=warpgroup_mma,
              warpgroup_mma_wait=warpgroup_mma_wait, async_reduce_add=TMA.async_copy_shared_to_global)
    return ns


class _Coroutines(_ast.NodeTransformer):
    """`mbarrier.wait(...)` statements -> `yield mbarrier.wait(...)`: a function that waits
    becomes a coroutine, suspended at each wait (the stand-in yields (barrier, parity))."""

    def __init__(self):
        self.waits = 0

    def visit_Expr(self, node):
        call = node.value
        if (isinstance(call, _ast.Call) and isinstance(call.func, _ast.Attribute) and call.func.attr == "wait"
                and isinstance(call.func.value, _ast.Name) and call.func.value.id == "mbarrier"):
            self.waits += 1
            return _ast.copy_location(_ast.Expr(_ast.Yield(call)), node)
        return self.generic_visit(node)


class _Names(_ast.NodeTransformer):
    """`X = gl.allocate_shared_memory(...)` passes `_name="X"`: problems name rings and slots."""

    def visit_Assign(self, node):
        call = node.value
        if (len(node.targets) == 1 and isinstance(node.targets[0], _ast.Name) and isinstance(call, _ast.Call)
                and isinstance(call.func, _ast.Attribute) and call.func.attr == "allocate_shared_memory"):
            call.keywords.append(_ast.keyword("_name", _ast.Constant(node.targets[0].id)))
        return node


def _replay_partitions(tree, args, dims, schedules) -> list:
    """`mbarrier_problems` of a parsed module, partitions (if any) run as coroutines."""
    waits = sum(isinstance(n, _ast.Attribute) and n.attr == "wait" and isinstance(n.value, _ast.Name)
                and n.value.id == "mbarrier" for n in _ast.walk(tree))
    coroutines = _Coroutines()
    tree = _ast.fix_missing_locations(coroutines.visit(tree))
    if coroutines.waits != waits:
        raise NotImplementedError("an mbarrier.wait that is not a statement")
    code = compile(tree, _GENERATED, "exec")
    problems = {}
    for schedule in schedules:
        holder = {}
        ns = _ws_stand_ins(_StateProxy(holder))
        exec(code, ns)
        _floor_helpers(ns)
        launch = ns["tritile_launch"]
        names = launch.__code__.co_varnames[1:launch.__code__.co_argcount]
        kernel = next(ns[n.name] for n in reversed(tree.body) if isinstance(n, _ast.FunctionDef)
                      and n.name != "tritile_launch")

        class Compiled:
            def __getitem__(self, grid):
                def run(*kernel_args):
                    kernel_args = _stand_in_args(names, kernel_args, ns)
                    for pid in [(x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0])]:
                        state = holder["state"] = _WSState(schedule, pid)
                        try:
                            out = kernel(*kernel_args)
                            if _inspect.isgenerator(out):  # the kernel body itself waits
                                state.main.gen = out
                                state.run([state.main])
                        except MbarrierProblem as err:
                            problems.setdefault(str(err), f"block {pid}, {schedule} schedule: {err}")
                        for message in state.races.values():
                            problems.setdefault(message, f"block {pid}, {schedule} schedule: {message}")
                return run

        launch(_launcher(ns, Compiled()), *_launch_args(ns, args, dims))
    return list(problems.values())


class _StateProxy:
    """The stand-ins are made once per schedule; each block gets a fresh `_WSState` behind this."""

    def __init__(self, holder):
        object.__setattr__(self, "_holder", holder)

    def __getattr__(self, name):
        return getattr(self._holder["state"], name)

    def __setattr__(self, name, value):
        setattr(self._holder["state"], name, value)
