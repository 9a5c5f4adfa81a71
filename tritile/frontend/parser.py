"""The AST walker: one kernel function's Python source -> a tile-IR `PrimFunc`.

Assumes the function is written in TileLang's style (lazy `@T.prim_func` with annotated
parameters, or the eager body with `A: T.Tensor(...)` / `T.empty` / `return C`).

Evaluation model
----------------
* Python values (ints, floats, dtypes, tuples, closure/global objects) are compile-time
  constants and fold; `T.*` calls dispatch to `tritile.frontend.builtins` by identity.
* Runtime scalars are IR `Expr`s.  A name bound to a runtime value is a `Let`, an
  immutable SSA binding.  Before a runtime loop / `while` / `if` body is parsed, every
  scalar name that the body assigns and that is already bound outside it is promoted to a
  "var"-scope buffer (`Alloc` + `Store`/`Load`), so loop-carried and branch-merged values
  stay correct.  Names first bound inside such a body are local to it.
* Each `with T.Kernel` block is one kernel; `T.alloc_global` outside them a workspace.  A
  function of several kernels, or with workspaces, is a `PrimFunc` of one-kernel `parts`
  (see `tritile.ir.nodes.PrimFunc`).
* `for ... in range(...)` / `T.serial` / `T.unroll` / `T.Pipelined` become `For` loops
  (range is a serial loop, never unrolled by the frontend); `T.Parallel` becomes
  `Parallel`; iterating a Python list/tuple unrolls at compile time.  An `if` on a
  compile-time value keeps only the taken branch.
* Every statement and error carries the user's `SourceLoc`; user mistakes are
  `CompileError`s, never bare tracebacks.  Python's `print` is one: it would run once, at
  trace time (`T.print` prints at run time).  `@T.macro`s inline at each call, nested at most
  `MACRO_DEPTH` deep (a macro that calls itself without a compile-time end stops there).
* The module globals the trace read (kernel and macros) are recorded with their values in
  the returned `PrimFunc`'s ``attrs["globals_read"]`` (`source.GlobalReads.guards`).
"""
from __future__ import annotations

import ast
import builtins as py_builtins
import contextlib
import inspect
import sys

import tritile.language as T
from tritile.errors import CompileError
from tritile.frontend import access as acc
from tritile.frontend import builtins as tile_ops
from tritile.frontend import grid_sync, per_thread, persistent, random, reducers, thread_ranges, views, warp_groups
from tritile.frontend import exprs
from tritile.frontend.source import MISSING, FunctionSource, GlobalReads
from tritile.ir import nodes as ir
from tritile.ir.bounds import upper_bound
from tritile.ir.dtypes import DType, as_dtype
from tritile.ir.transform import Transformer

_HANDLERS = {**tile_ops.HANDLERS, **warp_groups.HANDLERS, **persistent.HANDLERS,
             **grid_sync.HANDLERS}  # T.<name> -> its handler

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
           ast.Pow: "**", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<",
           ast.RShift: ">>"}
_CMPOPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_UNARY = {ast.USub: "-", ast.UAdd: "+", ast.Not: "not", ast.Invert: "~"}
_PY_COMPARE = {ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b,
               ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
# what a runtime scalar parameter may be: the types a Triton kernel argument takes
SCALAR_PARAM_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                       "float16", "bfloat16", "float32", "float64")
MACRO_DEPTH = 32  # nested macro inlinings (about 17 Python frames each with a loop and an if)


class _ProbeDone(Exception):
    """Raised in probe mode when the parser reaches `with T.Kernel`."""


class _Binding:
    """A name's value plus the frame that owns it."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class _RefBinding(_Binding):
    """A macro parameter annotated `T.Ref`, bound to the caller's buffer element: assigning the name
    stores to that element."""

    __slots__ = ()


class _LaneBinding(_Binding):
    """A `T.alloc_var` declared inside T.Parallel: each lane's own scalar of `dtype`, a per-lane SSA
    value (None until the lane assigns it); assignments cast to `dtype`."""

    __slots__ = ("dtype",)

    def __init__(self, value, dtype):
        super().__init__(value)
        self.dtype = dtype


class _Frame(dict):
    """A scope's names; `lane` says what it is inside T.Parallel: "body" (the loop's body, an inlined
    macro's), "if" (a branch of a runtime `if` in the lane), "loop" (a loop in the lane), None
    outside T.Parallel.  A scalar bound in a lane frame is per-lane (see `Parser._lane_local`)."""

    __slots__ = ("lane",)

    def __init__(self, items=(), lane=None):
        super().__init__(items)
        self.lane = lane


class Parser:
    def __init__(self, consts: dict = None, probe: bool = False):
        self.consts = dict(consts or {})
        self.probe = probe
        self.const_symbols = {}  # probe mode: T.const name -> placeholder Var
        self.frames = [{}]  # name -> _Binding; a new frame per runtime loop / if body
        self.blocks = [[]]  # statement lists being filled
        self.sources = []  # FunctionSource stack (the kernel, then inlined macros)
        self.params = []  # (python name, Buffer or None until annotated)
        self.outputs = []
        self.returned = None
        self.kernels = []  # the `with T.Kernel` blocks, in launch order
        self.workspaces = []  # T.alloc_global buffers
        self.views = []  # global views (frontend/views.py)
        self.in_kernel = False
        self.swizzle = None
        self.name_hint = None
        self.buffer_names = set()
        self.tf32_buffers = set()  # names of on-chip buffers allocated as T.tfloat32
        self.parallel_depth = 0  # T.Parallel loops around the statement being parsed
        self.kernel_threads = None  # threads of the `with T.Kernel` being parsed
        self.thread_set = None  # the threads of the `if tx < ...` branch being parsed (thread_ranges.py)
        self.per_thread = None  # the kernel's per_thread.PerThread when its body is per-thread code
        self.kernel_block_vars = ()  # its block indices
        self.kernel_block_depth = 0  # len(self.blocks) in its body's own level
        self.serial_loop_depth = 0  # runtime serial / unrolled / pipelined loops and `while`s around the statement
        self.rng = None  # the kernel's T.rng_init stream (frontend/random.py)
        self.rng_parallel = []  # random.ParallelDraws of the T.Parallel loops around the statement
        self.let_values = {}  # id(Var) -> value of each Let emitted (for `upper_bound`)
        self.global_reads = GlobalReads()
        self.pass_configs = {}  # T.annotate_pass_configs
        self.reducers = {}  # T.alloc_reducer fragments -> their op (frontend/reducers.py)
        self.compile_flags = None  # T.annotate_compile_flags

    # ---------------------------------------------------------------- helpers for handlers
    @property
    def source(self) -> FunctionSource:
        return self.sources[-1]

    def emit(self, stmt):
        self.blocks[-1].append(stmt)

    def require_kernel(self, what, loc):
        if not self.in_kernel:
            raise CompileError(f"{what} must be used inside `with T.Kernel(...)`", loc)

    def require_outside_kernel(self, what, loc):
        if self.in_kernel:
            raise CompileError(f"{what} cannot be used inside `with T.Kernel(...)`", loc)

    def unique_name(self, base: str) -> str:
        name, n = base, 1
        while name in self.buffer_names:
            name, n = f"{base}_{n}", n + 1
        self.buffer_names.add(name)
        return name

    def new_buffer(self, shape, dtype, scope, loc) -> ir.Buffer:
        return ir.Buffer(self.unique_name(self.name_hint or scope), tuple(shape), dtype, scope, loc=loc)

    def const_value(self, name, loc):
        if name in self.consts:
            value = self.consts[name]
            if not isinstance(value, int) or isinstance(value, bool):
                raise CompileError(f"T.const {name!r} must be an int, got {value!r}", loc)
            return value
        if self.probe:
            return self.const_symbols.setdefault(name, ir.Var(name))
        raise CompileError(f"T.const {name!r} has no value: pass a tensor whose shape gives it, or "
                           f"{name}=... to .compile()", loc)

    def declare_workspace(self, shape, dtype, loc):
        buf = ir.Buffer(self.unique_name(self.name_hint or "workspace"), tuple(shape), dtype, "global", loc=loc)
        self.workspaces.append(buf)
        return buf

    def declare_output(self, shape, dtype, loc):
        buf = ir.Buffer(self.unique_name(self.name_hint or "out"), tuple(shape), dtype, "global", loc=loc)
        self.outputs.append(buf)
        return buf

    def scalar(self, value, loc):
        """A runtime Expr or a Python number (buffer reads become Loads)."""
        if isinstance(value, acc.BufferAccess):
            return acc.load(value)
        if isinstance(value, ir.Buffer):
            if value.scope == "var":
                return ir.Load(value, (ir.Const(0),), value.dtype)
            raise CompileError(f"{value.name} is a {value.scope} buffer of shape {list(value.shape)}, not a "
                               f"scalar; index it (e.g. {value.name}[i, j])", loc)
        if isinstance(value, (ir.Expr,) + exprs.PYTHON_SCALARS):
            return value
        if isinstance(value, _THREAD_VALUES):
            raise CompileError(thread_ranges._MISUSE, loc)
        raise CompileError(f"expected a scalar value, got {type(value).__name__} {value!r}", loc)

    # ---------------------------------------------------------------- entry
    def parse(self, fn, caller_locals: dict = None) -> ir.PrimFunc:
        src = FunctionSource(fn, caller_locals, self.global_reads)
        self.sources.append(src)
        tree = src.tree
        self._bind_signature(fn, tree)
        try:
            self.statements(tree.body)
        except _ProbeDone:
            pass
        return self._finish(src, tree)

    def _bind_signature(self, fn, tree):
        signature = inspect.signature(fn)
        args = tree.args
        if args.vararg or args.kwarg:
            raise CompileError("kernel functions cannot take *args / **kwargs", self.source.loc(tree))
        for arg in args.posonlyargs + args.args + args.kwonlyargs:
            name, loc = arg.arg, self.source.loc(arg)
            if name not in signature.parameters:
                raise CompileError(f"the source found for {fn.__qualname__} does not match the function "
                                   f"(parameter {name!r})", loc)
            if arg.annotation is not None:
                spec = fn.__annotations__.get(name)  # evaluated by Python where the def ran
                if spec is None or isinstance(spec, str):
                    spec = self.eval(arg.annotation)
                if isinstance(spec, T.Tensor):
                    self._declare_param(name, spec, loc)
                    continue
                if isinstance(spec, DType) and name not in self.consts:
                    self._declare_scalar_param(name, spec, loc)
                    continue
                if spec is T.ptr:  # `A: T.ptr`: a tensor parameter that T.match_buffer types in the body
                    self.params.append([name, None])
                    self._bind(name, tile_ops.PointerParam(name))
                    continue
            if name in self.consts:
                self._bind(name, self.consts[name])
            elif signature.parameters[name].default is not inspect.Parameter.empty:
                self._bind(name, signature.parameters[name].default)
            else:  # an eager-style tensor parameter, annotated in the body
                self.params.append([name, None])

    def _declare_param(self, name, spec: "T.Tensor", loc):
        if spec.scope != "global":
            raise CompileError(f"tensor {name}: {type(spec).__name__} (scope {spec.scope!r}) annotates @T.macro "
                               f"parameters; a kernel's tensor parameter is a T.Tensor", loc)
        shape = tuple(exprs.cast(s, "int32", loc) if isinstance(s, ir.Expr) else s for s in spec.shape)
        for s in shape:
            if not isinstance(s, ir.Expr) and (not isinstance(s, int) or isinstance(s, bool) or s < 0):
                raise CompileError(f"tensor {name}: dimensions must be ints or T.dynamic/T.const symbols, got "
                                   f"{s!r}", loc)
        strides = _declared_strides(name, spec, shape, loc) if isinstance(spec, T.StridedTensor) else None
        self.buffer_names.add(name)
        buf = ir.Buffer(name, shape, spec.dtype, "global", loc=loc, strides=strides)
        for entry in self.params:
            if entry[0] == name:
                if entry[1] is not None:
                    raise CompileError(f"tensor parameter {name} is annotated twice", loc)
                entry[1] = buf
                break
        else:
            self.params.append([name, buf])
        self._bind(name, buf)

    def _declare_scalar_param(self, name, dtype: DType, loc):
        """`name: T.int32` (a signature annotation, or an eager body's `name: T.int32`): a
        runtime scalar argument of the kernel, a Var of that dtype."""
        if dtype.name not in SCALAR_PARAM_DTYPES:
            raise CompileError(f"scalar parameter {name}: {dtype} is not a scalar parameter type; use one of "
                               f"{', '.join(SCALAR_PARAM_DTYPES)}", loc)
        var = ir.Var(name, as_dtype(dtype))
        for entry in self.params:
            if entry[0] == name:
                if entry[1] is not None:
                    raise CompileError(f"parameter {name} is annotated twice", loc)
                entry[1] = var
                break
        else:
            self.params.append([name, var])
        self._bind(name, var)

    def _finish(self, src, tree) -> ir.PrimFunc:
        loc = src.loc(tree)
        missing = [name for name, buf in self.params if buf is None]
        if missing and not self.probe:
            raise CompileError(f"parameter {missing[0]} has no tensor annotation; add "
                               f"`{missing[0]}: T.Tensor((...), dtype)` to the signature or the body", loc)
        params = [buf for _, buf in self.params if isinstance(buf, ir.Buffer)]
        scalar_params = [(position, var) for position, (_, var) in enumerate(self.params) if isinstance(var, ir.Var)]
        out_start = len(params)
        params += self.outputs
        if self.returned is not None:
            out_idx = [out_start + self.outputs.index(b) for b in self.returned]
        else:
            out_idx = list(range(out_start, len(params)))
        attrs = {"globals_read": self.global_reads.guards(), "pass_configs": dict(self.pass_configs),
                 "compile_flags": self.compile_flags}
        if self.probe:
            return ir.PrimFunc(src.name, params, None, out_idx=out_idx, attrs=attrs, loc=loc,
                               scalar_params=scalar_params)
        host = self.blocks[0]
        if host and self.kernels:  # they would be lost: the runtime launches kernels and nothing else
            raise CompileError("statements outside `with T.Kernel(...)` (TileLang's host code) are not supported; "
                               "move them into a kernel", host[0].loc)
        if len(self.kernels) <= 1 and not self.workspaces and not self.views:
            # no kernel: TileLang builds such a function (host code only) too; compiling it is the error
            func = ir.PrimFunc(src.name, params, self.kernels[0] if self.kernels else None, out_idx=out_idx,
                               attrs=attrs, loc=loc, scalar_params=scalar_params)
            if self.kernels:
                _bind_dynamic_dims(func, self.kernels)
            return func
        # a program of several kernels, workspaces or global views: each kernel its own one-kernel
        # function taking the call's tensors, then the workspaces, then the views
        func = ir.PrimFunc(src.name, params, None, out_idx=out_idx, attrs=attrs, loc=loc,
                           scalar_params=scalar_params, workspaces=list(self.workspaces), views=list(self.views))
        _bind_dynamic_dims(func, self.kernels)
        func.parts = [ir.PrimFunc(f"{src.name}_{i}", params + self.workspaces + self.views, kernel,
                                  dynamic_vars=list(func.dynamic_vars), dim_bindings=dict(func.dim_bindings),
                                  stride_bindings=dict(func.stride_bindings),
                                  attrs=dict(attrs), loc=kernel.loc, scalar_params=scalar_params)
                      for i, kernel in enumerate(self.kernels)]
        return func

    # ---------------------------------------------------------------- names and frames
    def _find(self, name):
        for frame in reversed(self.frames):
            if name in frame:
                return frame
        return None

    def _bind(self, name, value):
        self.frames[-1][name] = _Binding(value)

    def lookup(self, name, loc):
        frame = self._find(name)
        if frame is not None:
            binding = frame[name]
            if isinstance(binding, _LaneBinding) and binding.value is None:
                raise CompileError(f"{name!r} is read before it is assigned: a T.alloc_var inside T.Parallel is "
                                   f"each lane's own scalar, and this lane has not given it a value yet (assign it: "
                                   f"`{name} = value`; T.fill / T.clear of it are not supported)", loc)
            return binding.value
        value = self.source.lookup(name)
        if value is MISSING:
            raise CompileError(f"unknown name {name!r}", loc)
        return value

    def assign_name(self, name, value, loc, dtype: DType = None):
        frame = self._find(name)
        current = frame[name].value if frame is not None else None
        if frame is not None and isinstance(frame[name], _RefBinding):  # a T.Ref parameter: write through
            if dtype is not None:
                value = exprs.cast(self.scalar(value, loc), dtype, loc)
            self.emit(ir.Store(current.buffer, acc.element_indices(current),
                               exprs.cast(self.scalar(value, loc), current.buffer.dtype, loc), loc=loc))
            return
        if isinstance(value, tile_ops.LaneVar):  # `v = T.alloc_var(dtype)` inside T.Parallel: a new name
            init = value.init
            if isinstance(init, ir.Expr) and not isinstance(init, (ir.Var, ir.Const)):
                init = self._let(name, init, loc)
            self.frames[-1][name] = _LaneBinding(init, value.dtype)
            return
        if isinstance(current, ir.Buffer) and current.scope == "var" and not isinstance(value, ir.Buffer):
            self.emit(ir.Store(current, (ir.Const(0),), exprs.cast(self.scalar(value, loc), current.dtype, loc),
                               loc=loc))
            return
        if frame is not None and self._lane_local(frame, name):
            self._assign_lane(name, frame, value, loc, dtype)
            return
        if frame is not None and frame is not self.frames[-1]:
            raise CompileError(f"{name!r} is bound outside this loop/if to {type(current).__name__}; it cannot be "
                               f"rebound inside runtime control flow", loc)
        if (isinstance(value, acc.BufferAccess) and value.is_point) or (isinstance(value, ir.Buffer)
                                                                        and value.scope == "var"
                                                                        and self._is_named(value)):
            value = self.scalar(value, loc)  # a snapshot of the element
        # (a fresh `T.alloc_var` names the variable itself: `T.clear(v)`, `T.fill(v, x)` write it)
        # (a sliced subscript stays one: `X = A_shared[:M, :K]` names that region, TileLang's alias)
        if dtype is not None:
            value = exprs.cast(self.scalar(value, loc), dtype, loc)
        if isinstance(value, ir.Expr) and not isinstance(value, (ir.Var, ir.Const)) and self.in_kernel:
            value = self._let(name, value, loc)
        self._bind(name, value)

    def _let(self, name, value: ir.Expr, loc) -> ir.Var:
        var = ir.Var(name, value.dtype)
        self.emit(ir.Let(var, value, loc=loc))
        self.let_values[id(var)] = value
        return var

    @staticmethod
    def _lane_local(frame, name) -> bool:
        """Whether `name` (bound in `frame`) is a per-lane scalar: a scalar (or a T.alloc_var not yet
        assigned) bound inside T.Parallel.  Each lane has its own; assigning it rebinds the name
        (SSA), under a lane `if` merged after the branches (`_merge_lane_branches`)."""
        if getattr(frame, "lane", None) is None:
            return False
        binding = frame[name]
        if isinstance(binding, _RefBinding):
            return False
        return isinstance(binding, _LaneBinding) or isinstance(binding.value, (ir.Expr,) + exprs.PYTHON_SCALARS)

    def _assign_lane(self, name, frame, value, loc, dtype):
        """`name = value` of a per-lane scalar bound in `frame`: a new SSA value of the name in the
        current frame (a lane `if` branch's frame shadows the name until the branches merge)."""
        binding = frame[name]
        k = next(k for k in range(len(self.frames) - 1, -1, -1) if self.frames[k] is frame)
        if any(getattr(f, "lane", None) != "if" for f in self.frames[k + 1:]):
            raise CompileError(f"{name!r} is a per-lane scalar of the enclosing T.Parallel, reassigned inside a "
                               f"loop in the lane: a loop-carried per-lane value is not supported; keep it in a "
                               f"fragment element instead (acc[i] = acc[i] + ...)", loc)
        if isinstance(value, acc.BufferAccess) and value.is_point or isinstance(value, ir.Buffer) \
                and value.scope == "var":
            value = self.scalar(value, loc)
        if not isinstance(value, (ir.Expr,) + exprs.PYTHON_SCALARS):
            raise CompileError(f"{name!r} is a per-lane scalar inside T.Parallel; it cannot be rebound to "
                               f"{_type_name(value)}", loc)
        if dtype is not None:
            value = exprs.cast(value, dtype, loc)
        if isinstance(binding, _LaneBinding):
            value = exprs.cast(value, binding.dtype, loc)
        if isinstance(value, ir.Expr) and not isinstance(value, (ir.Var, ir.Const)):
            value = self._let(name, value, loc)
        self.frames[-1][name] = _LaneBinding(value, binding.dtype) if isinstance(binding, _LaneBinding) \
            else _Binding(value)

    def _merge_lane_branches(self, frames) -> list:
        """The per-lane scalars a runtime `if` inside T.Parallel assigns (its branches' final
        `frames`, then and else): (name, binding class, dtype, then value, else value) of each, a
        branch that did not assign it giving the value before the `if`; a name first bound in both
        branches too.  `stmt_If` binds each to `T.if_then_else(cond, then value, else value)`."""
        merges = []
        names = list(dict.fromkeys(n for f in frames for n in f))
        for name in names:
            outer = self._find(name)
            if outer is not None and self._lane_local(outer, name):
                before = outer[name]
                kind = type(before) if isinstance(before, _LaneBinding) else _Binding
                dtype = before.dtype if isinstance(before, _LaneBinding) else None
                values = [f[name].value if name in f else before.value for f in frames]
                if len(frames) == 1:
                    values.append(before.value)
            elif outer is None and len(frames) == 2 and all(name in f for f in frames):
                bindings = [f[name] for f in frames]
                if not all(isinstance(b, _LaneBinding) or (type(b) is _Binding and isinstance(
                        b.value, (ir.Expr,) + exprs.PYTHON_SCALARS)) for b in bindings):
                    continue
                dtypes = {b.dtype for b in bindings if isinstance(b, _LaneBinding)}
                kind, dtype = (_LaneBinding, dtypes.pop()) if len(dtypes) == 1 and all(
                    isinstance(b, _LaneBinding) for b in bindings) else (_Binding, None)
                values = [b.value for b in bindings]
            else:
                continue
            then_value, else_value = values
            if then_value is else_value:
                continue
            merges.append((name, kind, dtype, then_value, else_value))
        return merges

    def _is_named(self, buf: ir.Buffer) -> bool:
        """Whether a name is bound to `buf` (`y = x` of a var `x` is a snapshot of its value)."""
        return any(binding.value is buf for frame in self.frames for binding in frame.values())

    def _promote_assigned(self, body, loc):
        """Turn scalars that `body` reassigns into var buffers (see the module docstring)."""
        for name in _assigned_names(body):
            frame = self._find(name)
            if frame is None or self._lane_local(frame, name):  # per-lane scalars stay SSA values
                continue
            value = frame[name].value
            if not isinstance(value, (ir.Expr,) + exprs.PYTHON_SCALARS):
                continue
            init = value if isinstance(value, ir.Expr) else exprs.make_const(value, exprs.python_dtype(value))
            buf = ir.Buffer(self.unique_name(name), (1,), init.dtype, "var", loc=loc)
            self.emit(ir.Alloc(buf, init, loc=loc))
            frame[name] = _Binding(buf)

    def _scoped_block(self, body, bindings: dict = None, lane: str = None, frame_out: list = None) -> ir.Seq:
        """`body` parsed into its own Seq, in a new scope that starts with `bindings` (name -> value).
        Inside T.Parallel the scope is a lane frame (`_Frame`): `lane` ("body" / "if"), else "loop";
        `frame_out` receives the scope's final names."""
        if lane is None and self.parallel_depth:
            lane = "loop"
        frame = _Frame(((name, _Binding(value)) for name, value in (bindings or {}).items()), lane)
        self.frames.append(frame)
        self.blocks.append([])
        try:
            self.statements(body)
        finally:
            self.frames.pop()
            stmts = self.blocks.pop()
        if frame_out is not None:
            frame_out.append(frame)
        return ir.Seq(stmts)

    # ---------------------------------------------------------------- statements
    def statements(self, body):
        for node in body:
            self.statement(node)

    def statement(self, node):
        method = getattr(self, "stmt_" + type(node).__name__, None)
        if method is None:
            raise CompileError(f"unsupported Python syntax in a kernel: {type(node).__name__} statement",
                               self.source.loc(node))
        method(node)

    def stmt_Pass(self, node):
        pass

    def stmt_Expr(self, node):
        if isinstance(node.value, ast.Constant):  # docstrings and bare constants
            return
        value = self.eval(node.value)
        if isinstance(value, (tile_ops.LoopSpec, tile_ops.KernelSpec, persistent.PersistentSpec)):
            raise CompileError("this T construct must be used as a `for` iterator or a `with` context",
                               self.source.loc(node))

    def stmt_Assign(self, node):
        loc = self.source.loc(node)
        hint = node.targets[0].id if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) else None
        self.name_hint = hint
        try:
            value = self.eval(node.value)
        finally:
            self.name_hint = None
        for target in node.targets:
            self.assign(target, value, loc)

    def assign(self, target, value, loc, dtype=None):
        if isinstance(target, ast.Name):
            self.assign_name(target.id, value, loc, dtype)
        elif isinstance(target, (ast.Tuple, ast.List)):
            if not isinstance(value, (tuple, list)) or len(value) != len(target.elts):
                raise CompileError(f"cannot unpack {value!r} into {len(target.elts)} names", loc)
            for t, v in zip(target.elts, value):
                self.assign(t, v, loc)
        elif isinstance(target, ast.Subscript):
            obj = self.eval(target.value)
            if isinstance(obj, ir.Buffer):
                where = acc.BufferAccess(obj, self._index(target.slice), loc)
                indices = acc.element_indices(where)
                if dtype is not None:
                    value = exprs.cast(self.scalar(value, loc), dtype, loc)
                self.emit(ir.Store(obj, indices, exprs.cast(self.scalar(value, loc), obj.dtype, loc), loc=loc))
            elif isinstance(obj, (list, dict)) and not self.in_kernel:
                obj[self._index_value(target.slice)] = value
            else:
                what = repr(obj) if isinstance(obj, tile_ops.PointerParam) else type(obj).__name__
                raise CompileError(f"cannot assign to an element of {what}", loc)
        else:
            raise CompileError(f"unsupported assignment target {type(target).__name__}", loc)

    def stmt_AugAssign(self, node):
        loc = self.source.loc(node)
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise CompileError(f"unsupported operator {type(node.op).__name__}", loc)
        current = self.eval(node.target)
        rhs = self.eval(node.value)
        if isinstance(current, ir.Buffer) and current.scope != "var":
            raise CompileError(f"cannot apply {op}= to the whole buffer {current.name}; use a T.Parallel loop",
                               loc)
        value = self._binary(op, current, rhs, loc)
        self.assign(node.target, value, loc)

    def stmt_AnnAssign(self, node):
        loc = self.source.loc(node)
        annotation = self.eval(node.annotation)
        if isinstance(annotation, T.Tensor):
            if node.value is not None or not isinstance(node.target, ast.Name):
                raise CompileError("a T.Tensor annotation declares a tensor parameter: write `A: T.Tensor(...)` "
                                   "without a value", loc)
            name = node.target.id
            if self.in_kernel or not any(entry[0] == name for entry in self.params):
                raise CompileError(f"{name!r} is not a parameter of the kernel function; only parameters can be "
                                   f"annotated with T.Tensor", loc)
            self._declare_param(name, annotation, loc)
            return
        if node.value is None:
            if isinstance(annotation, DType) and isinstance(node.target, ast.Name) and not self.in_kernel \
                    and any(entry[0] == node.target.id and entry[1] is None for entry in self.params):
                self._declare_scalar_param(node.target.id, annotation, loc)
            return
        self.name_hint = node.target.id if isinstance(node.target, ast.Name) else None
        try:
            value = self.eval(node.value)
        finally:
            self.name_hint = None
        dtype = annotation if isinstance(annotation, DType) else None
        if isinstance(annotation, str):
            try:
                dtype = as_dtype(annotation)
            except TypeError:
                dtype = None
        self.assign(node.target, value, loc, dtype)

    def stmt_Return(self, node):
        loc = self.source.loc(node)
        if self.in_kernel:
            raise CompileError("`return` inside `with T.Kernel` is not supported", loc)
        if node.value is None:
            return
        value = self.eval(node.value)
        values = list(value) if isinstance(value, (tuple, list)) else [value]
        for v in values:
            if not (isinstance(v, ir.Buffer) and any(v is o for o in self.outputs)):
                raise CompileError(f"a kernel can only return tensors created with T.empty, got {v!r}", loc)
        self.returned = values

    def stmt_Assert(self, node):
        loc = self.source.loc(node)
        test = self.eval(node.test)
        if isinstance(test, (ir.Expr, acc.BufferAccess)):
            raise CompileError("assert on runtime values is not supported", loc)
        if not test:
            msg = self.eval(node.msg) if node.msg is not None else "assertion failed"
            raise CompileError(str(msg), loc)

    def stmt_With(self, node):
        loc = self.source.loc(node)
        if len(node.items) != 1:
            raise CompileError("use one `with T.Kernel(...)` per with-statement", loc)
        item = node.items[0]
        spec = self.eval(item.context_expr)
        if isinstance(spec, warp_groups.WarpGroupSpec):
            self._warp_groups(spec, node, loc)
            return
        if not isinstance(spec, tile_ops.KernelSpec):
            raise CompileError("the only supported with-statement is `with T.Kernel(...) as ...`", loc)
        if self.probe:
            raise _ProbeDone()
        target = item.optional_vars
        if target is None:
            names = ["bx", "by", "bz"][:len(spec.grid)]
        elif isinstance(target, ast.Name):
            names = [target.id] if len(spec.grid) == 1 else [f"{target.id}_{i}" for i in "xyz"[:len(spec.grid)]]
        elif isinstance(target, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Name) for e in target.elts):
            names = [e.id for e in target.elts]
            if len(names) != len(spec.grid):
                raise CompileError(f"T.Kernel has {len(spec.grid)} grid dimensions but binds {len(names)} names",
                                   loc)
        else:
            raise CompileError("bind the block indices to names: `as bx` or `as (bx, by)`", loc)
        block_vars = tuple(ir.Var(n) for n in names)
        if target is not None:
            if isinstance(target, ast.Name):
                self._bind(target.id, block_vars[0] if len(block_vars) == 1 else block_vars)
            else:
                for n, v in zip(names, block_vars):
                    self._bind(n, v)
        self.in_kernel = True
        self.kernel_threads = spec.threads
        self.per_thread = per_thread.detect(node.body, spec.dims or (spec.threads,), loc)
        self.kernel_block_vars = block_vars
        self.rng = None
        self.swizzle = None
        self.blocks.append([])
        self.kernel_block_depth = len(self.blocks)
        try:
            self.statements(node.body)
            if self.per_thread is not None:  # per-thread code as tile statements (frontend/per_thread.py)
                self.blocks[-1] = per_thread.lower(self.per_thread, self.blocks[-1], self.unique_name)
        finally:
            body = self.blocks.pop()
            self.in_kernel = False
            self.per_thread = None
        # T.sync_grid() splits the block into consecutive kernels (frontend/grid_sync.py)
        self.kernels.extend(grid_sync.split(ir.Kernel(spec.grid, block_vars, spec.threads, ir.Seq(body),
                                                      swizzle=self.swizzle, loc=loc)))

    def _warp_groups(self, spec, node, loc):
        """`with T.ws(*groups):` - the body as an `ir.WarpGroups` block."""
        if node.items[0].optional_vars is not None:
            raise CompileError("`with T.ws(...)` binds no name", loc)
        if self.parallel_depth:
            raise CompileError("`with T.ws(...)` inside T.Parallel is not supported", loc)
        self.blocks.append([])
        try:
            self.statements(node.body)
        finally:
            body = self.blocks.pop()
        self.emit(ir.WarpGroups(spec.groups, ir.Seq(body), loc=loc))

    def stmt_If(self, node):
        loc = self.source.loc(node)
        cond = self.eval(node.test)
        if isinstance(cond, (acc.BufferAccess, ir.Buffer)):
            cond = self.scalar(cond, loc)
        if isinstance(cond, thread_ranges.ThreadSet):
            thread_ranges.emit_branches(self, cond, node, loc)
            return
        if isinstance(cond, thread_ranges.ThreadExpr):
            raise CompileError(thread_ranges._MISUSE, loc)
        if not isinstance(cond, ir.Expr):
            self.statements(node.body if cond else node.orelse)
            return
        self.require_kernel("a runtime `if`", loc)
        self._promote_assigned(node.body + node.orelse, loc)
        if self.parallel_depth:  # branches of a lane: per-lane scalars they assign merge after them
            frames = []
            then_body = self._scoped_block(node.body, lane="if", frame_out=frames)
            else_body = self._scoped_block(node.orelse, lane="if", frame_out=frames) if node.orelse else None
            merges = self._merge_lane_branches(frames)
            cond = exprs.truth(cond)
            if merges and not isinstance(cond, (ir.Var, ir.Const)):  # the branches may write what it reads
                cond = self._let("cond", cond, loc)
            self.emit(ir.If(cond, then_body, else_body, loc=loc))
            for name, kind, dtype, then_value, else_value in merges:
                if then_value is None or else_value is None:  # unassigned on one path: undefined there
                    value = else_value if then_value is None else then_value
                else:
                    value = exprs.select(cond, then_value, else_value, loc)
                    if dtype is not None:
                        value = exprs.cast(value, dtype, loc)
                if isinstance(value, ir.Expr) and not isinstance(value, (ir.Var, ir.Const)):
                    value = self._let(name, value, loc)
                self.frames[-1][name] = kind(value, dtype) if kind is _LaneBinding else kind(value)
            return
        then_body = self._scoped_block(node.body)
        else_body = self._scoped_block(node.orelse) if node.orelse else None
        self.emit(ir.If(exprs.truth(cond), then_body, else_body, loc=loc))

    def stmt_While(self, node):
        loc = self.source.loc(node)
        self.require_kernel("a `while` loop", loc)
        if node.orelse:
            raise CompileError("while/else is not supported", loc)
        self._promote_assigned(node.body, loc)
        cond = self.scalar(self.eval(node.test), loc)
        if not isinstance(cond, ir.Expr):
            raise CompileError("a `while` condition must depend on runtime values (a constant one never ends "
                               "or never runs)", loc)
        with self._serial_loop():
            body = self._scoped_block(node.body)
        self.emit(ir.While(exprs.truth(cond), body, loc=loc))

    @contextlib.contextmanager
    def _serial_loop(self):
        """Parse a runtime loop's body: `serial_loop_depth` counts it (T.rng_rand refuses draws there)."""
        self.serial_loop_depth += 1
        try:
            yield
        finally:
            self.serial_loop_depth -= 1

    def stmt_For(self, node):
        loc = self.source.loc(node)
        if node.orelse:
            raise CompileError("for/else is not supported", loc)
        spec = self._loop_spec(node.iter, loc)
        if isinstance(spec, persistent.PersistentSpec):
            self._promote_assigned(node.body, loc)
            with self._serial_loop():
                persistent.emit_loop(self, spec, _target_names(node.target, loc),
                                     lambda bindings: self._scoped_block(node.body, bindings), loc)
            return
        if not isinstance(spec, tile_ops.LoopSpec):  # a Python sequence: unroll at compile time
            if isinstance(spec, (ir.Expr, ir.Buffer, acc.BufferAccess)) or not hasattr(spec, "__iter__"):
                raise CompileError("a kernel `for` must iterate over range(...), T.serial, T.unroll, "
                                   "T.Pipelined, T.Parallel or a compile-time sequence", loc)
            for value in spec:
                self.assign(node.target, value, loc)
                self.statements(node.body)
            return
        self.require_kernel("a kernel loop", loc)
        names = _target_names(node.target, loc)
        self._promote_assigned(node.body, loc)
        if spec.kind == "parallel":
            if len(names) != len(spec.extents):
                raise CompileError(f"T.Parallel has {len(spec.extents)} extents but the loop binds {len(names)} "
                                   f"names", loc)
            self._parallel(names, spec.extents, node.body, loc, start=spec.start)
            return
        if len(names) != 1:
            raise CompileError("this loop binds exactly one loop variable", loc)
        var = ir.Var(names[0])
        start, stop, step = (exprs.cast(v, "int32", loc) for v in (spec.start, spec.stop, spec.step))
        with self._serial_loop():
            body = self._scoped_block(node.body, {names[0]: var})
        self.emit(ir.For(var, start, stop, body, kind=spec.kind, step=step, num_stages=spec.num_stages,
                         order=spec.order, stage=spec.stage, loc=loc))

    def _parallel(self, names, extents, body, loc, start=0):
        """`for names in T.Parallel(*extents)`.  A tile has static extents, so an extent known
        only at run time runs on a static one with the lanes past it masked off: on its upper
        bound when it has one (``T.min(valid_len, 512)``: 512), else in chunks of the kernel's
        threads (rounded up to a power of two) by a serial loop around the `T.Parallel` - the
        last such extent; the others in chunks of one lane.  A static extent of 0 (or less) runs
        the body for no lane, as `range(0)` would: it is parsed, and dropped."""
        unbounded = [i for i, e in enumerate(extents) if isinstance(e, ir.Expr)
                     and upper_bound(e, self.let_values) is None]
        lane_vars = tuple(ir.Var(n) for n in names)
        static, indices, guards, chunk_loops = [], [], [], []
        for axis, (name, extent, lane) in enumerate(zip(names, extents, lane_vars)):
            if not isinstance(extent, ir.Expr):
                static.append(extent)
                indices.append(lane)
                continue
            if axis in unbounded:
                size = 1 << max(self.kernel_threads - 1, 0).bit_length() if axis == unbounded[-1] else 1
                chunk = ir.Var(f"{name}_chunk")
                chunk_loops.append((chunk, exprs.binary("//", exprs.binary("+", extent, size - 1, loc), size, loc)))
                index = exprs.binary("+", exprs.binary("*", chunk, size, loc), lane, loc)
            else:
                size, index = max(upper_bound(extent, self.let_values), 1), lane
            static.append(size)
            indices.append(index)
            guards.append(exprs.binary("<", index, extent, loc))
        if not (isinstance(start, int) and start <= 0):  # T.parallel(start, stop): lanes from start on
            guards.append(exprs.binary(">=", indices[0], exprs.cast(start, "int32", loc), loc))
        draws = random.ParallelDraws(lane_vars, tuple(extents))
        self.parallel_depth += 1
        self.rng_parallel.append(draws)
        try:
            stmts = self._scoped_block(body, dict(zip(names, indices)), lane="body")
        finally:
            self.parallel_depth -= 1
            self.rng_parallel.pop()
        stmts = random.leave_parallel(self, draws, stmts)
        if any(isinstance(extent, int) and extent <= 0 for extent in extents):
            return
        if len(stmts.stmts) == 1 and isinstance(stmts.stmts[0], ir.Parallel):  # T.vectorized inside: one nest
            inner = stmts.stmts[0]
            lane_vars, static, stmts = lane_vars + inner.vars, static + list(inner.extents), inner.body
        if guards:
            cond = guards[0]
            for guard in guards[1:]:
                cond = exprs.binary("and", cond, guard, loc)
            stmts = ir.Seq([ir.If(cond, stmts, loc=loc)])
        out = reducers.expand(self, ir.Parallel(lane_vars, tuple(static), stmts, loc=loc))
        for chunk, count in reversed(chunk_loops):
            out = [ir.For(chunk, ir.Const(0), count, ir.Seq(out), loc=loc)]
        for stmt in out:
            self.emit(stmt)

    def _loop_spec(self, iter_node, loc):
        if isinstance(iter_node, ast.Call):
            callee = self.eval(iter_node.func)
            if callee is py_builtins.range:
                args, kwargs = self._call_args(iter_node)
                if kwargs or not 1 <= len(args) <= 3:
                    raise CompileError("range() takes 1 to 3 positional arguments", loc)
                args = [self.scalar(a, loc) for a in args]
                start, stop, step = (0, args[0], 1) if len(args) == 1 else (args + [1])[:3]
                return tile_ops.LoopSpec("serial", start, stop, step)
        return self.eval(iter_node)

    def stmt_FunctionDef(self, node):
        raise CompileError("nested function definitions are not supported inside a kernel; define helpers "
                           "with @T.macro outside it", self.source.loc(node))

    # ---------------------------------------------------------------- expressions
    def eval(self, node):
        method = getattr(self, "expr_" + type(node).__name__, None)
        if method is None:
            raise CompileError(f"unsupported Python syntax in a kernel: {type(node).__name__} expression",
                               self.source.loc(node))
        return method(node)

    def expr_Constant(self, node):
        return node.value

    def expr_Name(self, node):
        return self.lookup(node.id, self.source.loc(node))

    def expr_Attribute(self, node):
        obj = self.eval(node.value)
        if isinstance(obj, ir.Buffer) and node.attr == "data":
            return views.Storage(obj)
        try:
            return getattr(obj, node.attr)
        except AttributeError:
            raise CompileError(f"{_type_name(obj)} has no attribute {node.attr!r}", self.source.loc(node)) from None

    def _comprehension(self, node, element):
        """The values of a comprehension, evaluated while tracing: its iterables must be
        compile-time (a shape, a list, `range(n)` of ints); `element(node)` makes one value."""
        loc = self.source.loc(node)
        out = []
        self.frames.append({})  # the comprehension's own names do not leak
        try:
            self._comprehend(node.generators, 0, lambda: out.append(element(node)), loc)
        finally:
            self.frames.pop()
        return out

    def _comprehend(self, generators, k, emit, loc):
        if k == len(generators):
            emit()
            return
        gen = generators[k]
        if gen.is_async:
            raise CompileError("async comprehensions are not supported in a kernel", loc)
        iterable = self.eval(gen.iter)
        if isinstance(iterable, (ir.Expr, ir.Buffer, acc.BufferAccess)):
            raise CompileError("a comprehension in a kernel iterates while it is traced: it needs a compile-time "
                               f"iterable, got {_type_name(iterable)}", loc)
        for value in iterable:
            self._bind_target(gen.target, value, loc)
            if all(_as_compile_time_bool(self.eval(cond), loc) for cond in gen.ifs):
                self._comprehend(generators, k + 1, emit, loc)

    def _bind_target(self, target, value, loc):
        if isinstance(target, ast.Name):
            self._bind(target.id, value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            values = list(value)
            if len(values) != len(target.elts):
                raise CompileError(f"cannot unpack {value!r} into {len(target.elts)} names", loc)
            for t, v in zip(target.elts, values):
                self._bind_target(t, v, loc)
        else:
            raise CompileError(f"unsupported comprehension target {type(target).__name__}", loc)

    def expr_ListComp(self, node):
        return self._comprehension(node, lambda n: self.eval(n.elt))

    def expr_GeneratorExp(self, node):
        return iter(self._comprehension(node, lambda n: self.eval(n.elt)))

    def expr_SetComp(self, node):
        return set(self._comprehension(node, lambda n: self.eval(n.elt)))

    def expr_DictComp(self, node):
        return dict(self._comprehension(node, lambda n: (self.eval(n.key), self.eval(n.value))))

    def expr_Tuple(self, node):
        return tuple(self._sequence(node.elts))

    def expr_List(self, node):
        return self._sequence(node.elts)

    def _sequence(self, elts):
        out = []
        for e in elts:
            if isinstance(e, ast.Starred):
                out.extend(self.eval(e.value))
            else:
                out.append(self.eval(e))
        return out

    def expr_Dict(self, node):
        if any(k is None for k in node.keys):
            raise CompileError("**-unpacking in dict literals is not supported", self.source.loc(node))
        return {self.eval(k): self.eval(v) for k, v in zip(node.keys, node.values)}

    def expr_Lambda(self, node):
        # kept as a Python callable (T.annotate_layout records it); compile-time names only
        env = dict(self.source.globals)
        env.update(self.source.closure)
        for frame in self.frames:
            env.update({k: b.value for k, b in frame.items()})
        code = compile(ast.Expression(node), self.source.filename, "eval")
        return eval(code, env)  # noqa: S307 - the user's own source

    def _index(self, node) -> tuple:
        items = node.elts if isinstance(node, ast.Tuple) else [node]
        out = []
        for item in items:
            if isinstance(item, ast.Slice):
                parts = [None if p is None else self.scalar(self.eval(p), self.source.loc(item))
                         for p in (item.lower, item.upper, item.step)]
                if parts[0] is not None and parts[1] is not None and exprs.static_difference(parts[1], parts[0]) is None:
                    # `KV[b, kv_start:kv_end]` with names bound to `base + k * 64` and `base + (k + 1) * 64`:
                    # the extent is their values' difference, the stop written as start + extent
                    stop, start = self._let_free(parts[1]), self._let_free(parts[0])
                    extent = None if stop is None or start is None else exprs.static_difference(stop, start)
                    if extent is not None:
                        parts[1] = exprs.binary("+", parts[0], extent, self.source.loc(item))
                out.append(slice(*parts))
            else:
                value = self.eval(item)
                out.append(self.scalar(value, self.source.loc(item)))
        return tuple(out)

    def _let_free(self, e):
        """`e` with every name bound by a `Let` replaced by its value (transitively), or None where
        a value reads memory (a buffer element may change between two bindings)."""
        values, reads = self.let_values, []

        class _Expand(Transformer):
            def visit_Var(self, v):
                value = values.get(id(v))
                return v if value is None else self.transform(value)

            def visit_Load(self, node):
                reads.append(node)
                return node

        expanded = _Expand().transform(e) if isinstance(e, ir.Expr) else e
        return None if reads else expanded

    def _index_value(self, node):
        if isinstance(node, ast.Slice):
            return slice(*[None if p is None else self.eval(p) for p in (node.lower, node.upper, node.step)])
        return self.eval(node)

    def expr_Subscript(self, node):
        loc = self.source.loc(node)
        obj = self.eval(node.value)
        if isinstance(obj, ir.Buffer):
            return acc.BufferAccess(obj, self._index(node.slice), loc)
        index = self._index_value(node.slice)
        if isinstance(index, (ir.Expr, acc.BufferAccess)):
            raise CompileError(f"cannot index the compile-time value {_type_name(obj)} with a runtime index", loc)
        try:
            return obj[index]
        except Exception as exc:  # noqa: BLE001 - reported at the user's line
            raise CompileError(f"indexing {_type_name(obj)} failed: {exc}", loc) from None

    def _binary(self, op, lhs, rhs, loc):
        runtime = (ir.Expr, ir.Buffer, acc.BufferAccess)
        if isinstance(lhs, _THREAD_VALUES) or isinstance(rhs, _THREAD_VALUES):
            return _thread_binary(op, lhs, rhs, loc)
        if not isinstance(lhs, runtime) and not isinstance(rhs, runtime) and not (
                exprs.is_python_scalar(lhs) and exprs.is_python_scalar(rhs)):
            try:  # Python objects (tuples, strings, ...) keep Python semantics
                return eval(f"lhs {op} rhs", {}, {"lhs": lhs, "rhs": rhs})  # noqa: S307 - fixed operator text
            except Exception as exc:  # noqa: BLE001
                raise CompileError(f"{_type_name(lhs)} {op} {_type_name(rhs)}: {exc}", loc) from None
        return exprs.binary(op, self.scalar(lhs, loc), self.scalar(rhs, loc), loc)

    def expr_BinOp(self, node):
        loc = self.source.loc(node)
        op = _BINOPS.get(type(node.op))
        if op is None:
            raise CompileError(f"unsupported operator {type(node.op).__name__}", loc)
        return self._binary(op, self.eval(node.left), self.eval(node.right), loc)

    def expr_UnaryOp(self, node):
        loc = self.source.loc(node)
        value = self.eval(node.operand)
        op = _UNARY[type(node.op)]
        if isinstance(value, thread_ranges.ThreadSet) and op == "not":
            return value.invert()
        if isinstance(value, _THREAD_VALUES):
            raise CompileError(thread_ranges._MISUSE, loc)
        if isinstance(value, (ir.Expr, ir.Buffer, acc.BufferAccess)):
            return exprs.unary(op, self.scalar(value, loc), loc)
        if op == "not":
            return not value
        try:
            return eval(f"{op} value", {}, {"value": value})  # noqa: S307 - fixed operator text
        except Exception as exc:  # noqa: BLE001
            raise CompileError(f"{op}{_type_name(value)}: {exc}", loc) from None

    def expr_BoolOp(self, node):
        loc = self.source.loc(node)
        op = "and" if isinstance(node.op, ast.And) else "or"
        result = None
        for value_node in node.values:
            value = self.eval(value_node)
            if isinstance(value, (ir.Buffer, acc.BufferAccess)):
                value = self.scalar(value, loc)
            if result is None:
                result = value
            elif isinstance(result, thread_ranges.ThreadSet) or isinstance(value, thread_ranges.ThreadSet):
                result = _thread_binary(op, result, value, loc)
                continue
            elif isinstance(result, ir.Expr) or isinstance(value, ir.Expr):
                result = exprs.binary(op, _as_bool(result), _as_bool(value), loc)
            else:
                result = (result and value) if op == "and" else (result or value)
            if isinstance(result, _THREAD_VALUES):
                continue
            if not isinstance(result, ir.Expr) and ((op == "and" and not result) or (op == "or" and result)):
                return result  # short-circuit on a compile-time value
        return result

    def expr_Compare(self, node):
        loc = self.source.loc(node)
        left = self.eval(node.left)
        result = True
        for op_node, right_node in zip(node.ops, node.comparators):
            right = self.eval(right_node)
            if type(op_node) in _PY_COMPARE:
                if isinstance(left, (ir.Expr, acc.BufferAccess)) or isinstance(right, (ir.Expr, acc.BufferAccess)):
                    raise CompileError("`is` / `in` need compile-time values", loc)
                part = _PY_COMPARE[type(op_node)](left, right)
            else:
                part = self._binary(_CMPOPS[type(op_node)], left, right, loc)
            if result is True:
                result = part
            elif isinstance(result, thread_ranges.ThreadSet) or isinstance(part, thread_ranges.ThreadSet):
                result = _thread_binary("and", result, part, loc)
            else:
                result = exprs.binary("and", result, part, loc)
            left = right
        return result

    def expr_IfExp(self, node):
        loc = self.source.loc(node)
        cond = self.eval(node.test)
        if isinstance(cond, (ir.Buffer, acc.BufferAccess)):
            cond = self.scalar(cond, loc)
        if isinstance(cond, _THREAD_VALUES):
            raise CompileError(thread_ranges._MISUSE, loc)
        if not isinstance(cond, ir.Expr):
            return self.eval(node.body if cond else node.orelse)
        return exprs.select(cond, self.scalar(self.eval(node.body), loc), self.scalar(self.eval(node.orelse), loc),
                            loc)

    def expr_JoinedStr(self, node):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                parts.append(format(self.eval(value.value)))
        return "".join(parts)

    # ---------------------------------------------------------------- calls
    def _call_args(self, node):
        args = self._sequence(node.args)
        kwargs = {}
        for kw in node.keywords:
            if kw.arg is None:
                kwargs.update(self.eval(kw.value))
            else:
                kwargs[kw.arg] = self.eval(kw.value)
        return args, kwargs

    def expr_Call(self, node):
        loc = self.source.loc(node)
        callee = self.eval(node.func)
        hint, self.name_hint = self.name_hint, None  # only the outermost call names a buffer
        args, kwargs = self._call_args(node)
        self.name_hint = hint
        if callee in T.TILE_OPS:
            return self._tile_op(callee, args, kwargs, loc)
        if isinstance(callee, T.Macro):
            return self._inline_macro(callee, args, kwargs, loc)
        if callee is T.Tensor:
            return self._tensor(args, kwargs, loc)
        if callee is T.StridedTensor and kwargs.get("data") is not None:
            raise CompileError("T.StridedTensor(..., data=) (a strided view of another tensor's storage) is not "
                               "supported; declare the strided tensor as a kernel parameter", loc)
        if isinstance(callee, DType):
            if not args and not kwargs and self.in_kernel:  # TVM's `x = T.int32()`: a name `T.let` binds
                return ir.Var(hint or "v", callee)
            if len(args) != 1 or kwargs:
                raise CompileError(f"{callee}(value) takes one argument", loc)
            return exprs.cast(self.scalar(args[0], loc), callee, loc)
        runtime = (ir.Expr, ir.Buffer, acc.BufferAccess)
        has_runtime = any(isinstance(a, runtime) for a in list(args) + list(kwargs.values()))
        if has_runtime and callee in _PY_SCALAR_BUILTINS:
            return _PY_SCALAR_BUILTINS[callee](self, args, kwargs, loc)
        if callee is py_builtins.range:
            raise CompileError("range(...) is only supported as a `for` iterator", loc)
        if callee is py_builtins.print:
            raise CompileError("print() in a kernel runs once, when tritile traces it, not when the kernel runs; "
                               "use T.print(value, msg=...) to print at run time", loc)
        if _is_user_function(callee) and (has_runtime or _calls_tile_ops(callee)):
            # TileLang traces plain helpers like macros: their T calls emit into the kernel
            return self._inline_macro(T.Macro(callee), args, kwargs, loc)
        previous = T.TRACING.lower  # T operations the call makes (a lambda's) lower into the kernel here
        T.TRACING.lower = lambda stub, call_args, call_kwargs: self._tile_op(stub, call_args, call_kwargs, loc)
        try:
            return callee(*args, **kwargs)
        except CompileError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported at the user's line
            raise CompileError(f"calling {_type_name(callee)} failed: {type(exc).__name__}: {exc}", loc) from None
        finally:
            T.TRACING.lower = previous

    def _tensor(self, args, kwargs, loc):
        """`T.Tensor(shape, dtype, data=None, scope=None)` called in the function: a tensor type,
        or with `data=B.data` a view of B's storage."""
        try:
            bound = inspect.signature(T.Tensor).bind(*args, **kwargs)
        except TypeError as exc:
            raise CompileError(f"T.Tensor: {exc}", loc) from None
        bound.apply_defaults()
        if bound.arguments["data"] is None:
            try:
                return T.Tensor(*args, **kwargs)
            except (TypeError, ValueError) as exc:  # a bad shape or dtype
                raise CompileError(f"T.Tensor: {exc}", loc) from None
        return tile_ops.tensor_over(self, bound.arguments["shape"], bound.arguments["dtype"], bound.arguments["data"],
                                    "T.Tensor(shape, dtype, data)", loc)

    def _tile_op(self, stub, args, kwargs, loc):
        impl = T.TILE_OPS[stub]
        name = stub.__name__
        try:
            bound = inspect.signature(impl).bind(*args, **kwargs)
        except TypeError as exc:
            raise CompileError(f"T.{name}: {exc}", loc) from None
        bound.apply_defaults()
        if name in _FOLDABLE_NAMES and all(v is None or isinstance(v, (int, float, str, DType))
                                           for v in bound.arguments.values()):
            try:  # arithmetic on Python numbers folds
                return impl(*bound.args, **bound.kwargs)
            except Exception as exc:  # noqa: BLE001
                raise CompileError(f"T.{name}: {type(exc).__name__}: {exc}", loc) from None
        handler = _HANDLERS[name]
        return handler(self, dict(bound.arguments), loc)

    def _inline_macro(self, macro, args, kwargs, loc):
        if len(self.sources) > MACRO_DEPTH:
            chain = " -> ".join(s.name for s in self.sources[-3:])
            raise CompileError(f"macro {macro.fn.__name__} is inlined {MACRO_DEPTH} levels deep ({chain} -> ...): "
                               f"a macro that calls itself needs a compile-time condition that ends the "
                               f"recursion", loc)
        src = FunctionSource(macro.fn, reads=self.global_reads)
        try:
            bound = inspect.signature(macro.fn).bind(*args, **kwargs)
        except TypeError as exc:
            raise CompileError(f"macro {macro.fn.__name__}: {exc}", loc) from None
        bound.apply_defaults()
        refs = self._ref_params(macro, src, loc)
        frame = _Frame(((k, self._ref_binding(macro, k, v, loc) if k in refs else _Binding(v))
                        for k, v in bound.arguments.items()), "body" if self.parallel_depth else None)
        saved_frames = self.frames
        self.frames = [frame]
        self.sources.append(src)
        try:
            for stmt in src.tree.body:
                if isinstance(stmt, ast.Return):
                    return None if stmt.value is None else self.eval(stmt.value)
                self.statement(stmt)
        except RecursionError:  # macros of deeply nested bodies exhaust Python's stack before MACRO_DEPTH
            raise CompileError(f"macro {macro.fn.__name__}: inlining nests deeper than Python's recursion limit "
                               f"({len(self.sources) - 1} macros deep)", loc) from None
        finally:
            self.sources.pop()
            self.frames = saved_frames
        return None


    def _ref_params(self, macro, src, loc) -> set:
        """The names of the macro's parameters annotated `T.Ref`."""
        refs = set()
        tree_args = src.tree.args
        for arg in tree_args.posonlyargs + tree_args.args + tree_args.kwonlyargs:
            if arg.annotation is None:
                continue
            annotation = macro.fn.__annotations__.get(arg.arg)
            if annotation is None or isinstance(annotation, str):
                self.sources.append(src)
                try:
                    annotation = self.eval(arg.annotation)
                except CompileError:
                    annotation = None
                finally:
                    self.sources.pop()
            if annotation is T.Ref:
                refs.add(arg.arg)
        return refs

    def _ref_binding(self, macro, name, value, loc) -> _Binding:
        """The binding of the `T.Ref` parameter `name` to `value`: an element of a buffer, its indices
        evaluated now (TileLang's), or a `T.alloc_var` variable (assigning it stores already)."""
        if isinstance(value, ir.Buffer) and value.scope == "var":
            return _Binding(value)
        if not (isinstance(value, acc.BufferAccess) and value.is_point):
            raise CompileError(f"macro {macro.fn.__name__}: the T.Ref parameter {name!r} takes a buffer element "
                               f"(A[i]) or a T.alloc_var variable, got {_type_name(value)}", loc)
        items = []
        for item in value.items:
            if isinstance(item, ir.Expr) and not isinstance(item, (ir.Const, ir.Var)) and self.in_kernel:
                item = self._let(f"{name}_index", item, loc)
            items.append(item)
        return _RefBinding(acc.BufferAccess(value.buffer, tuple(items), value.loc))


# T helpers that fold on Python numbers (T.cast / T.infinity keep their dtype, tile ops never fold)
_FOLDABLE_NAMES = frozenset(("ceildiv", "align_up", "floordiv", "floormod", "truncdiv", "max", "min", "exp", "exp2", "log",
                             "log2", "sqrt", "rsqrt", "abs", "tanh", "sin", "cos", "floor", "ceil", "sigmoid",
                             "pow", "if_then_else",
                             "clamp", "Select", "isnan", "isinf", "isfinite", "shift_left", "shift_right",
                             "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not"))


_THREAD_VALUES = (thread_ranges.ThreadExpr, thread_ranges.ThreadSet)


def _thread_binary(op, lhs, rhs, loc):
    """`op` on a thread-index value (thread_ranges.py) and a compile-time one."""
    try:
        if op in ("and", "or"):
            if not isinstance(lhs, thread_ranges.ThreadSet):
                lhs, rhs = rhs, lhs
            if isinstance(lhs, thread_ranges.ThreadSet):
                return lhs.combine(op, rhs)
            raise TypeError(thread_ranges._MISUSE)
        if isinstance(lhs, thread_ranges.ThreadSet) or isinstance(rhs, thread_ranges.ThreadSet):
            raise TypeError("a condition on T.get_thread_binding() may only be an `if` statement's condition, "
                            "alone or under and / or / not")
        return eval(f"lhs {op} rhs", {}, {"lhs": lhs, "rhs": rhs})  # noqa: S307 - fixed operator text
    except TypeError as exc:
        raise CompileError(str(exc), loc) from None


def _as_bool(value):
    return exprs.truth(value) if isinstance(value, ir.Expr) else bool(value)


def _as_compile_time_bool(value, loc) -> bool:
    if isinstance(value, (ir.Expr, ir.Buffer, acc.BufferAccess)):
        raise CompileError("a comprehension's `if` is evaluated while tracing: it needs a compile-time "
                           "condition", loc)
    return bool(value)


def _is_user_function(fn) -> bool:
    """A plain Python function of the user's (not tritile's, torch's or the standard library's)."""
    if not inspect.isfunction(fn) or fn.__name__ == "<lambda>":
        return False
    module = fn.__module__ or ""
    return not module.startswith(("tritile.", "torch", "triton", "numpy")) and module not in sys.stdlib_module_names


def _calls_tile_ops(fn) -> bool:
    """Whether `fn`'s code names one of the `T` tile operations (which only a kernel can run)."""
    names = set(fn.__code__.co_names)
    return any(getattr(T, n, None) in T.TILE_OPS for n in names if n not in _FOLDABLE_NAMES)


def _type_name(obj) -> str:
    if isinstance(obj, ir.Buffer):
        return f"buffer {obj.name}"
    return getattr(obj, "__name__", type(obj).__name__)


def _target_names(target, loc) -> list:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Name) for e in target.elts):
        return [e.id for e in target.elts]
    raise CompileError("loop targets must be plain names", loc)


def _assigned_names(body) -> list:
    """Names stored by Assign / AugAssign / AnnAssign anywhere in `body` (loop targets and
    nested definitions excluded: loop variables are fresh in their own frame)."""
    names = []

    def add_target(t):
        if isinstance(t, ast.Name):
            names.append(t.id)
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                add_target(e)

    def visit(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return
        if isinstance(node, ast.Assign):
            for t in node.targets:
                add_target(t)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            add_target(node.target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    for stmt in body:
        visit(stmt)
    return list(dict.fromkeys(names))


def _builtin_minmax(op):
    def lower(p, args, kwargs, loc):
        if kwargs or len(args) < 2:
            raise CompileError(f"{op}() on runtime values takes two or more positional arguments", loc)
        result = p.scalar(args[0], loc)
        for a in args[1:]:
            result = exprs.binary(op, result, p.scalar(a, loc), loc)
        return result

    return lower


def _builtin_convert(dtype):
    return lambda p, args, kwargs, loc: exprs.cast(p.scalar(args[0], loc), dtype, loc)


_PY_SCALAR_BUILTINS = {
    py_builtins.min: _builtin_minmax("min"),
    py_builtins.max: _builtin_minmax("max"),
    py_builtins.abs: lambda p, args, kwargs, loc: exprs.math_call("abs", [p.scalar(args[0], loc)], loc),
    py_builtins.float: _builtin_convert("float32"),
    py_builtins.int: _builtin_convert("int32"),
    py_builtins.bool: lambda p, args, kwargs, loc: exprs.truth(p.scalar(args[0], loc)),
}


def _declared_strides(name, spec: "T.StridedTensor", shape: tuple, loc) -> tuple:
    """The element strides of `T.StridedTensor` parameter `name`: one per dim of `shape`, each a
    non-negative int or an integer expression of runtime symbols.  Unlike a dim, a stride keeps
    its symbols' dtype (TileLang's strides are often `T.dynamic(..., "int64")`): it only scales
    addresses, so a bare symbol of any integer dtype stays bindable from the tensor's stride."""
    if spec.data is not None:
        raise CompileError(f"tensor {name}: T.StridedTensor(..., data=) (a strided view of another tensor's "
                           f"storage) is not supported; declare the strided tensor as a parameter", loc)
    if not isinstance(spec.strides, tuple):
        raise CompileError(f"tensor {name}: T.StridedTensor strides must be a tuple or list with one entry per "
                           f"dimension, got {spec.strides!r}", loc)
    if len(spec.strides) != len(shape):
        raise CompileError(f"tensor {name}: T.StridedTensor has {len(shape)} dimensions (shape {list(shape)}) but "
                           f"{len(spec.strides)} strides {list(spec.strides)}", loc)
    for dim, stride in enumerate(spec.strides):
        symbolic = isinstance(stride, ir.Expr) and stride.dtype.is_int
        if not symbolic and not (isinstance(stride, int) and not isinstance(stride, bool) and stride >= 0):
            raise CompileError(f"tensor {name}: stride {dim} must be a non-negative int or an integer T.dynamic "
                               f"expression, got {stride!r}", loc)
    return spec.strides


def _bind_dynamic_dims(func: ir.PrimFunc, kernels: list):
    """Record each T.dynamic Var's (param, dim) source; reject symbols nothing binds (in
    `kernels`, the tensors' and the workspaces' shapes)."""
    from tritile.ir.affine import solvable
    from tritile.ir.transform import bound_var, walk

    for index, buf in enumerate(func.params):
        for dim, size in enumerate(buf.shape):
            if isinstance(size, ir.Var) and size not in func.dim_bindings:
                if index in func.out_idx:
                    continue
                func.dim_bindings[size] = (index, dim)
                func.dynamic_vars.append(size)
    # a symbol only an output's shape mentions is bound from that output when the caller passes it
    for index, buf in enumerate(func.params):
        for dim, size in enumerate(buf.shape):
            if isinstance(size, ir.Var) and size not in func.dim_bindings:
                func.dim_bindings[size] = (index, dim)
                func.dynamic_vars.append(size)
    # a symbol only in affine sizes (`T.Tensor((n * 4,), ...)`): solved from the first such one
    for index, buf in enumerate(func.params):
        for dim, size in enumerate(buf.shape):
            for var in (v for v in walk(size) if isinstance(v, ir.Var) and v not in func.dim_bindings):
                if solvable(size, var):
                    func.dim_bindings[var] = (index, dim)
                    func.dynamic_vars.append(var)
    # a symbol only strides name (`T.StridedTensor((M, N), (ld, 1), ...)`): the tensor's stride
    for index, buf in enumerate(func.params):
        for dim, stride in enumerate(buf.strides or ()):
            for var in (v for v in walk(stride) if isinstance(v, ir.Var) and v not in func.dim_bindings
                        and v not in func.stride_bindings):
                if solvable(stride, var):
                    func.stride_bindings[var] = (index, dim)
                    func.dynamic_vars.append(var)
    for kernel in kernels:
        defined = {id(v) for v in func.runtime_vars} | {id(v) for v in kernel.block_vars}
        for node in walk(kernel.body):
            if isinstance(node, ir.For):
                defined.add(id(node.var))
            elif isinstance(node, ir.Parallel):
                defined.update(id(v) for v in node.vars)
            elif bound_var(node) is not None:
                defined.add(id(bound_var(node)))
        for root in (kernel.grid, kernel.body, [(b.shape, b.strides or ()) for b in func.params + func.workspaces
                                                 + func.views]):
            for node in walk(root):
                if isinstance(node, ir.Var) and id(node) not in defined:
                    raise CompileError(f"the symbol {node.name!r} is used but no tensor parameter's shape has it "
                                       f"as a dimension (nor a T.StridedTensor as a stride), so its value cannot "
                                       f"be bound at call time", kernel.loc)
