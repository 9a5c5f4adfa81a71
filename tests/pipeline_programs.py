"""Hand-built tile IR for the pipeline pass tests: blocked GEMMs whose K dimension is split
over one or more sibling `T.Pipelined` loops sharing `A_shared` / `B_shared`.

`gemm_program(loops, ...)` returns a `Program`: the frontend-level `PrimFunc`, a factory of
fresh random arguments and the torch reference of the outputs.  Every knob the property test
draws (stage counts, trip counts - static or runtime-dynamic -, block-sparse guards, an outer
serial loop, a read of `A_shared` after the loops, a shared buffer used only outside the
pipelines) maps to one argument here.

`mbarrier_problems(source, args, dims)` (end of the file) replays the mbarrier protocol of a
generated Gluon module on the host: a wait that no issued TMA copy / arrival can complete is a
GPU hang, found on CPU.
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
    dynamic: bool = False  # trip count is a runtime `T.dynamic` value
    order: Optional[list] = None
    stage: Optional[list] = None
    bind_offset: bool = False  # `kk = k * BK` as a replayed scalar Let


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
        if spec.guarded:
            cond = ir.BinOp("!=", ir.Load(mask, (kt,), int32), ir.Const(0), bool_)
            stmts = [ir.If(cond, ir.Seq(stmts), loc=LOC)]
        inner.append(ir.For(k, ir.Const(0), stop, ir.Seq(stmts), kind="pipelined", num_stages=spec.num_stages,
                            order=spec.order, stage=spec.stage, loc=LOC))
        base += spec.trips
    if outer > 1:
        body.append(ir.For(ir.Var("r"), ir.Const(0), ir.Const(outer), ir.Seq(inner), loc=LOC))
    else:
        body += inner
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
# `mbarrier_problems(source, args, dims)` executes a generated Gluon module (non warp-specialized)
# on the host with stand-ins for Gluon: tensors are opaque, only the `mask` tensor's values are
# read (block-sparse guards), TMA copies complete at once, and every mbarrier of every block is
# tracked (arrivals, transaction bytes, completed phases).  A copy issued by the one thread of
# control can only complete, so a `mbarrier.wait(bar, parity)` whose parity still matches the
# current phase once every copy issued before it has landed blocks forever: a hang on the GPU
# (whatever the timing).  Also reported: an invalidate with a phase half done (TMA in flight),
# a barrier index outside its ring, and `//` / `%` are evaluated with Triton's (C) semantics.

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


class _BarLayout:
    pass


class _Barrier:
    def __init__(self, name):
        self.name, self.count, self.arrived, self.tx, self.completed, self.valid = name, None, 0, 0, 0, False

    def _settle(self):
        if self.valid and self.arrived == self.count and self.tx == 0:
            self.completed, self.arrived = self.completed + 1, 0


class _Ring:
    def __init__(self, stages, name):
        self.bars = [_Barrier(f"{name}[{i}]") for i in range(stages)]

    def index(self, i):
        return (self, i)


def _bar(ref):
    ring, i = ref
    if not isinstance(i, int) or not 0 <= i < len(ring.bars):
        raise MbarrierProblem(f"barrier index {i} outside a ring of {len(ring.bars)}")
    return ring.bars[i]


class _State:
    def __init__(self):
        self.rings, self.events = 0, []


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
        def allocate_shared_memory(dtype, shape, layout, *a):
            if isinstance(layout, _BarLayout):
                state.rings += 1
                return _Ring(shape[0], f"ring{state.rings}")
            return _OPAQUE

    class MBarrier:
        MBarrierLayout = _BarLayout

        @staticmethod
        def init(ref, count):
            b = _bar(ref)
            b.count, b.arrived, b.tx, b.completed, b.valid = count, 0, 0, 0, True

        @staticmethod
        def invalidate(ref):
            b = _bar(ref)
            if b.arrived or b.tx:
                raise MbarrierProblem(f"invalidate of {b.name} with a phase in flight "
                                      f"(arrivals {b.arrived}, tx bytes {b.tx})")
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

    class TMA:
        @staticmethod
        def async_copy_global_to_shared(desc, coords, ref, dst, pred=True):
            if pred:
                b = _bar(ref)
                state.events.append(f"copy {desc.name} -> {b.name} {desc.nbytes}")
                b.tx -= desc.nbytes
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
            "warpgroup_mma_wait": _mma_wait, "TensorDescriptor": Desc, "_cdiv": _cdiv, "_cmod": _cmod}


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


class _CSemantics(_ast.NodeTransformer):
    def visit_BinOp(self, node):
        self.generic_visit(node)
        fn = {_ast.FloorDiv: "_cdiv", _ast.Mod: "_cmod"}.get(type(node.op))
        if fn is None:
            return node
        return _ast.copy_location(_ast.Call(_ast.Name(fn, _ast.Load()), [node.left, node.right], []), node)


def mbarrier_problems(source: str, args, dims=()) -> list:
    """Replay generated module `source` launched with CPU tensors `args` (the kernel's params,
    in order; the one named `mask` is read) and runtime `dims`: the list of mbarrier problems."""
    if "gl.warp_specialize(" in source:
        raise NotImplementedError("warp-specialized kernels (producer/consumer partitions) are not replayed")
    state = _State()
    tree = _ast.parse(source)
    tree.body = [s for s in tree.body if not isinstance(s, (_ast.Import, _ast.ImportFrom))]
    tree = _ast.fix_missing_locations(_CSemantics().visit(tree))
    ns = _stand_ins(state)
    exec(compile(tree, "<generated gluon>", "exec"), ns)
    launch = ns["tritile_launch"]
    names = launch.__code__.co_varnames[1:launch.__code__.co_argcount]
    problems = []

    class Compiled:
        def __getitem__(self, grid):
            def run(*kernel_args):
                kernel_args = [_MaskPtr(a.flatten().tolist()) if n == "mask" else
                               (_OPAQUE if hasattr(a, "element_size") else a)
                               for n, a in zip(list(names) + [None] * len(kernel_args), kernel_args)]
                for z in range(grid[2]):
                    for y in range(grid[1]):
                        for x in range(grid[0]):
                            state.pid, state.events = (x, y, z), []
                            try:
                                kernel(*kernel_args)
                            except MbarrierProblem as err:
                                problems.append(str(err))
            return run

    kernel = None
    for node in tree.body:  # the kernel is the last @gluon.jit function before the launcher
        if isinstance(node, _ast.FunctionDef) and node.name not in ("tritile_launch", "_add_combine"):
            kernel = ns[node.name]
    launch(Compiled(), *args, *dims)
    return problems
