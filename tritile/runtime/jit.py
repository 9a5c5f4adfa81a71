"""Entry points: `@tritile.jit`, `tritile.compile` and the `JITKernel` they return.

Two styles, detected from the decorated function's source:
* lazy - the function returns a `@T.prim_func`; `f(*consts)` returns a `JITKernel` cached
  per argument tuple, and `out_idx` names the outputs the kernel allocates and returns;
* eager - the body is the kernel (`with T.Kernel` directly in it, tensors annotated as
  `A: T.Tensor(...)`, outputs from `T.empty` and `return`).  `f(a, b, **consts)` compiles
  once per specialisation (keyword constants, `T.const` values read from the tensors'
  shapes, dtypes, device kind) and runs; `f.compile(**consts)` returns the `JITKernel`.
  A parameter annotated with a dtype (`alpha: T.float32` in the signature, or a bare
  `n: T.int32` in the body) is a runtime scalar argument, not a constant: one kernel serves
  every value.
  `out_idx` is rejected (the `return` statement names the outputs).
Caches are per decorated function, keyed by value (not by object identity), so repeated
calls with equal arguments return the same `JITKernel` object.  `f.cache_info()` reports
the cache as `functools.lru_cache` does (`CacheInfo(hits, misses, currsize)`: a miss is one
compiled specialisation) and `f.cache_clear()` empties it.
A warm eager call is keyed cheaply first: each argument's kind (a tensor's type, dtype,
shape, device kind; any other value with its type) and the way it was passed.  Only a new
kind binds the signature, reads the `T.const` dims and builds the specialisation key, so
every argument error is raised as before, on the first call of its kind.
A module global the kernel reads is part of its key: the frontend records the globals a trace
resolved (the kernel's and its macros'; for the lazy style also those the Python function's
code loads) with their values, and a cached kernel is served only while every one of them
still holds (`source.globals_unchanged`, a few identity checks); otherwise the changed value
compiles a new specialisation (up to `_VARIANTS` kept per key).  Only rebinding a global or
changing a list/dict/set global's contents is seen, not a change inside another object
(`cfg.BLOCK = 64` on a module or instance `cfg`).
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
from collections import namedtuple

import torch

import tritile.language as T
from tritile import switches
from tritile.errors import CompileError
from tritile.frontend import parse_kernel, probe_const_dims
from tritile.frontend.source import FunctionSource, GlobalReads, globals_unchanged
from tritile.ir import nodes as ir
from tritile.ir.dtypes import DType
from tritile.runtime.kernel import JITKernel

__all__ = ["jit", "compile", "JITKernel", "CacheInfo"]

CacheInfo = namedtuple("CacheInfo", "hits misses currsize")
_CALLS_REMEMBERED = 256  # kinds of eager call remembered (shapes vary freely with T.dynamic); then start over
_VARIANTS = 8  # kernels kept per key, one per set of values of the globals they read; newest first


def _normalize_out_idx(func: ir.PrimFunc, out_idx) -> list:
    if out_idx is None:
        return list(func.out_idx)
    if func.out_idx:
        raise ValueError(f"out_idx conflict: {func.name} already declares outputs with T.empty; drop out_idx")
    indices = [out_idx] if isinstance(out_idx, int) else list(out_idx)
    # out_idx counts the call's parameters, scalars included (TileLang's); the IR's counts the tensors
    call_params = func.call_params()
    n = len(call_params)
    normalized = []
    for i in indices:
        if not isinstance(i, int) or not -n <= i < n:
            raise ValueError(f"out_idx entry {i!r} is out of range for {n} parameters")
        param = call_params[i % n]
        if not isinstance(param, ir.Buffer):
            raise ValueError(f"out_idx entry {i!r} names the scalar parameter {param.name!r}; only tensors can be "
                             f"outputs")
        normalized.append(func.params.index(param))
    return normalized


def compile(func, out_idx=None, target="auto", execution_backend=None, target_host=None, verbose=False,
            pass_configs=None, compile_flags=None, backend=None):  # noqa: A001 - TileLang's name
    """Compile a `PrimFunc` (from `@T.prim_func`) into a `JITKernel`; `backend` is "gluon", "triton"
    or "auto" (None: `TRITILE_BACKEND`, default "auto"; see `tritile.codegen`)."""
    if not isinstance(func, ir.PrimFunc):
        raise TypeError(f"tritile.compile expects a @T.prim_func, got {type(func).__name__}")
    func = dataclasses.replace(func, out_idx=_normalize_out_idx(func, out_idx))
    return JITKernel(func, target=target, verbose=verbose, pass_configs=pass_configs,
                     execution_backend=execution_backend, compile_flags=compile_flags, backend=backend)


def _freeze(value):
    """A hashable, type-aware cache key for Python arguments."""
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_freeze(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((repr(k), _freeze(v)) for k, v in value.items())))
    try:
        hash(value)
        return (type(value).__name__, value)
    except TypeError:
        return (type(value).__name__, repr(value))


def _constants_key(args: tuple, kwargs: dict):
    """The cache key of a lazy-style call: each value with its type (3, 3.0 and True are other
    constants), keywords in name order.  Calls whose values all hash (scalars, strings, dtypes)
    build it directly; the rest go through `_freeze` (lists, dicts, unhashable values)."""
    key = (tuple([(type(a), a) for a in args]), tuple(sorted([(k, type(v), v) for k, v in kwargs.items()])))
    try:
        hash(key)
        return key
    except TypeError:
        return ("frozen", _freeze(args), _freeze(kwargs))


# the options of `tritile.compile` a `@tritile.jit` function passes on (out_idx aside)
COMPILE_OPTIONS = ("target", "verbose", "pass_configs", "execution_backend", "compile_flags", "backend")


class JITFunction:
    """What `@tritile.jit` returns: a `LazyJIT` or an `EagerJIT` (TileLang's `JITFunc`), with
    the specialisation cache both share."""

    def __init__(self, fn, options: dict):
        self.fn = fn
        self.options = options
        self._kernels = {}
        self._hits = self._misses = 0
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def _compile_options(self, **overrides) -> dict:
        """The options of `tritile.compile` this function's kernels are built with: the decorator's,
        `overrides` replacing some."""
        return {**{k: self.options[k] for k in COMPILE_OPTIONS}, **overrides}

    def _cached(self, key, build) -> JITKernel:
        """The kernel cached under `key` and the schedule switches overridden around the call
        (`switches.overridden`: a kernel built under others is another schedule) whose globals
        still hold, built by `build()` on a miss."""
        key = (key, switches.current_overrides())
        variants = self._kernels.get(key)
        for kernel in variants or ():
            if globals_unchanged(kernel.globals_read):
                self._hits += 1
                return kernel
        self._misses += 1
        kernel = build()
        self._kernels[key] = [kernel, *(variants or ())][:_VARIANTS]
        return kernel

    def get_kernel_source(self, *args, **kwargs) -> str:
        """TileLang's `f.get_kernel_source(...)`: the generated source of `f.compile(...)`'s kernel."""
        return self.compile(*args, **kwargs).get_kernel_source()

    def par_compile(self, configs, num_workers: int = None, ignore_error: bool = False) -> list:
        """TileLang's `f.par_compile(configs)`: the kernel of each config - a dict of keyword arguments
        or a tuple of positional ones, as `f.compile` takes them (an eager kernel's tensors may be
        `T.Tensor(shape, dtype)` placeholders, which supply the `T.const` dims) - in order.  With
        `ignore_error`, a config that fails is warned about and gives None.  tritile compiles them
        one after another (`num_workers` is accepted and unused)."""
        kernels = []
        for config in configs:
            if not isinstance(config, (dict, tuple)):
                raise ValueError(f"Invalid config type: {type(config)}, expected tuple or dict.")
            args, kwargs = (config, {}) if isinstance(config, tuple) else ((), dict(config))
            try:
                kernels.append(self._compile_config(args, kwargs))
            except Exception as exc:  # noqa: BLE001 - TileLang's ignore_error
                if not ignore_error:
                    raise
                import warnings

                warnings.warn(f"{self.__name__}.par_compile: config {config!r} failed: {type(exc).__name__}: {exc}",
                              stacklevel=2)
                kernels.append(None)
        return kernels

    def _compile_config(self, args, kwargs) -> JITKernel:
        return self.compile(*args, **kwargs)

    def cache_info(self) -> CacheInfo:
        """Specialisation cache statistics: `hits`, `misses` (= kernels compiled), `currsize`."""
        return CacheInfo(self._hits, self._misses, sum(map(len, self._kernels.values())))

    def cache_clear(self) -> None:
        """Forget every compiled specialisation and reset the statistics."""
        self._kernels.clear()
        self._hits = self._misses = 0


class LazyJIT(JITFunction):
    """`f(*consts)` -> the function's `@T.prim_func`, compiled and cached."""

    def __call__(self, *args, **kwargs) -> JITKernel:
        """A compile option among the keywords (`pass_configs=`, as an autotune config gives it) that
        is not a parameter of the function overrides the decorator's for this kernel."""
        options = {}
        if kwargs and not set(COMPILE_OPTIONS).isdisjoint(kwargs):  # rare: keep the cache-hit path free of it
            parameters = inspect.signature(self.fn).parameters
            options = {name: kwargs.pop(name) for name in COMPILE_OPTIONS if name in kwargs and name not in parameters}
        key = _constants_key(args, kwargs) if not options else (_constants_key(args, kwargs), _freeze(options))
        return self._cached(key, lambda: self._build(*args, options=options, **kwargs))

    def _build(self, *args, options=None, **kwargs) -> JITKernel:
        reads = GlobalReads()
        reads.record_code(self.fn)  # what the Python function itself reads, before it runs
        func = self.fn(*args, **kwargs)
        if not isinstance(func, ir.PrimFunc):
            raise TypeError(f"@tritile.jit function {self.fn.__name__} must return a @T.prim_func, got "
                            f"{type(func).__name__}")
        reads.add(func.attrs.get("globals_read", ()))
        func = dataclasses.replace(func, attrs={**func.attrs, "globals_read": reads.guards()})
        return compile(func, out_idx=self.options["out_idx"], **self._compile_options(**(options or {})))

    compile = __call__

    def parse_cache_key(self, *args, **kwargs):
        """TileLang's `f.parse_cache_key(...)`: the key a call with these arguments is cached under."""
        return _constants_key(args, kwargs)

    def get_tir(self, *args, **kwargs) -> ir.PrimFunc:
        """TileLang's `f.get_tir(*consts)`: the function's `@T.prim_func` for these constants, as the
        frontend builds it (not lowered, not compiled)."""
        func = self.fn(*args, **kwargs)
        if not isinstance(func, ir.PrimFunc):
            raise TypeError(f"@tritile.jit function {self.fn.__name__} must return a @T.prim_func, got "
                            f"{type(func).__name__}")
        return func


class EagerJIT(JITFunction):
    """The body is the kernel: `f(a, b, **consts)` runs it, `f.compile(**consts)` builds it."""

    def __init__(self, fn, options: dict):
        super().__init__(fn, options)
        if options["out_idx"] is not None:
            raise ValueError(f"out_idx is not supported for the eager-style kernel {fn.__name__}: its outputs are "
                             f"the T.empty tensors it returns")
        self.signature = inspect.signature(fn)
        tree = FunctionSource(fn).tree
        # the parameters the kernel takes at run time, in signature order: tensors, then of those
        # the scalars (`n: T.int32`), whose values are arguments of one kernel, not constants
        self.runtime_params = _annotated_params(tree, _is_tensor_annotation, _is_scalar_annotation)
        self.scalar_params = set(_annotated_params(tree, _is_scalar_annotation))
        self._probes = {}
        # the cheap key of a call (`_argument_kind` of each argument) -> (kernel, runtime-argument
        # sources), so a repeated kind of call skips signature binding and the T.const key
        self._calls = {}
        self._param_index = {name: i for i, name in enumerate(self.signature.parameters)}
        self._scalar_positions = {self._param_index[name] for name in self.scalar_params}
        self._variadic = any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in self.signature.parameters.values())

    def compile(self, *args, **consts) -> JITKernel:
        """The kernel for the constants `consts` (its parameters other than tensors, and its
        `T.const` dims); `tritile.compile`'s options among them (`target=`, `backend=`, ...)
        replace the decorator's for this kernel.  An option that is also a parameter of the
        kernel is ambiguous: a TypeError.  Given positional arguments or tensors, TileLang's call
        form: `f.compile(a, b, n)` (and `f.get_kernel_source(a, b, n)`) is the kernel the call
        `f(a, b, n)` runs, not run."""
        if args or any(isinstance(v, torch.Tensor) for v in consts.values()):
            return self.kernel_for(*args, **consts)
        options = {name: consts.pop(name) for name in COMPILE_OPTIONS if name in consts}
        for name in options:
            if name in self.signature.parameters:
                raise TypeError(f"{self.fn.__name__}.compile(): {name!r} is both a parameter of the kernel and an "
                                f"option of tritile.compile; give the option to @tritile.jit({name}=...)")
        key = ("compile", _freeze(consts), _freeze(options))
        return self._cached(key, lambda: self._build(consts, options))

    def _build(self, consts: dict, options: dict = None) -> JITKernel:
        return JITKernel(parse_kernel(self.fn, consts), **self._compile_options(**(options or {})))

    def get_tir(self, *args, **kwargs) -> ir.PrimFunc:
        """TileLang's `f.get_tir(...)`: the kernel's PrimFunc as the frontend builds it (not lowered,
        not compiled) for the constants given (`f.get_tir(block_M=128, ...)`, `T.const` dims by name:
        `f.get_tir(N=64, ...)`); tensors given for tensor parameters only supply the `T.const` dims
        read from their shapes."""
        return parse_kernel(self.fn, self._consts_of(args, kwargs, "get_tir"))

    def _consts_of(self, args, kwargs, what: str) -> dict:
        """The constants of a kernel given by (some of) its arguments: those other than tensors and
        runtime scalars, `T.const` dims by name, and the `T.const` dims read from the shapes of the
        tensors given (torch tensors or `T.Tensor` placeholders)."""
        dims = {name: kwargs.pop(name) for name in list(kwargs) if name not in self.signature.parameters}
        try:
            bound = self.signature.bind_partial(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.fn.__name__}.{what}(): {exc}") from None
        consts = {name: value for name, value in bound.arguments.items() if name not in self.runtime_params}
        consts.update(dims)
        tensors = {name: value for name, value in bound.arguments.items()
                   if name in self.runtime_params and isinstance(value, (torch.Tensor, T.Tensor))}
        if tensors:
            for name, (position, dim) in probe_const_dims(self.fn, consts).items():
                tensor = tensors.get(self.runtime_params[position])
                if name not in consts and tensor is not None:
                    size = tensor.shape[dim]
                    if not isinstance(size, int):
                        raise ValueError(f"{self.fn.__name__}.{what}(): T.const {name!r} is read from dimension "
                                         f"{dim} of {self.runtime_params[position]}, which the placeholder "
                                         f"{tensor!r} does not give as an int")
                    consts[name] = int(size)
        return consts

    def _compile_config(self, args, kwargs) -> JITKernel:
        """`par_compile`'s kernel of a config: from constants when its tensors are `T.Tensor`
        placeholders (or left out), else the kernel the call with these arguments runs."""
        if any(isinstance(v, torch.Tensor) for v in list(args) + list(kwargs.values())):
            return self.kernel_for(*args, **kwargs)
        options = {name: kwargs.pop(name) for name in COMPILE_OPTIONS if name in kwargs}
        return self.compile(**self._consts_of(args, kwargs, "par_compile"), **options)

    def parse_cache_key(self, *args, **kwargs):
        """TileLang's `f.parse_cache_key(...)`: the key a call with these arguments is remembered under
        (each argument's kind: a tensor's type, dtype, shape and device kind, a constant's value)."""
        return (tuple([_argument_kind(a, i in self._scalar_positions) for i, a in enumerate(args)]),
                tuple((k, _argument_kind(v, k in self.scalar_params)) for k, v in kwargs.items()),
                switches.current_overrides())

    def __call__(self, *args, **kwargs):
        key = self.parse_cache_key(*args, **kwargs)
        try:
            kernel, sources, guards = self._calls[key]
            if guards and not globals_unchanged(guards):
                raise KeyError(key)
        except (KeyError, TypeError):  # a new kind of call, a changed global, or an unhashable constant
            kernel, sources = self._specialize(args, kwargs)
            self._remember_call(key, args, kwargs, (kernel, sources, kernel.globals_read))
        else:
            self._hits += 1
        return kernel(*[args[s] if isinstance(s, int) else kwargs[s] if isinstance(s, str) else s.value
                        for s in sources])

    def kernel_for(self, *args, **kwargs) -> JITKernel:
        """The compiled kernel a call with these arguments runs, without running it."""
        return self._specialize(args, kwargs)[0]

    def _remember_call(self, key, args, kwargs, entry) -> None:
        """Remember `entry` under `key` when the key determines it: every constant hashable,
        and no tensor passed as a constant (a constant's key is its value, a tensor's its kind)."""
        runtime = set(entry[1])
        constants = [a for i, a in enumerate(args) if i not in runtime] + [v for k, v in kwargs.items()
                                                                           if k not in runtime]
        if self._variadic or any(isinstance(v, torch.Tensor) for v in constants):
            return
        try:
            hash(key)
        except TypeError:
            return
        if len(self._calls) >= _CALLS_REMEMBERED:
            self._calls.clear()
        self._calls[key] = entry

    def _specialize(self, args, kwargs):
        """(kernel, where each runtime parameter was passed: an index into args or a keyword)."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.fn.__name__}(): {exc}") from None
        runtime, tensors, sources, consts = [], [], [], {}
        for position, (name, parameter) in enumerate(self.signature.parameters.items()):
            if name in bound.arguments:
                value = bound.arguments[name]
                index = self._param_index[name]
                source = index if index < len(args) else name
            elif name in self.runtime_params and parameter.default is not parameter.empty:
                value = parameter.default  # `data: T.float32 = 1` left out: the default, as an argument
                source = _Default(value)
            else:
                continue
            if name in self.runtime_params:
                if name not in self.scalar_params:
                    if not isinstance(value, torch.Tensor):
                        raise TypeError(f"argument '{name}' (param {position}): expected a torch.Tensor, got "
                                        f"{type(value).__name__}")
                    tensors.append(value)
                runtime.append(value)
                sources.append(source)
            else:
                consts[name] = value
        const_key = _freeze(consts)
        probe = self._probes.get(const_key)
        if probe is None or not globals_unchanged(probe[1]):
            probe = self._probes[const_key] = probe_const_dims(self.fn, consts, with_globals=True)
        for name, (position, dim) in probe[0].items():
            tensor = runtime[position]
            if dim >= tensor.dim():
                raise ValueError(f"argument '{self.runtime_params[position]}' (param {position}): expected at least "
                                 f"{dim + 1} dimensions to read T.const {name!r}, got shape {list(tensor.shape)}")
            consts[name] = int(tensor.shape[dim])
        key = ("call", _freeze(consts), tuple(str(t.dtype) for t in tensors),
               tuple(t.device.type for t in tensors))
        return self._cached(key, lambda: self._build(consts)), sources

    def cache_clear(self) -> None:
        self._calls.clear()
        super().cache_clear()


class _Default:
    """Where a runtime argument left out of the call comes from: its parameter's default."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _argument_kind(value, runtime_scalar: bool = False):
    """What a call's specialisation depends on, cheaply: a tensor's type, dtype, shape and
    device kind; a runtime scalar argument's type; any other value itself, with its type (3
    and 3.0 are other constants)."""
    if isinstance(value, torch.Tensor):
        return type(value), value.dtype, value.shape, value.device.type
    return type(value) if runtime_scalar else (type(value), value)


def _annotated_params(tree: ast.FunctionDef, *kinds) -> list:
    """Parameters (in signature order) whose annotation, in the signature or as a bare
    `name: annotation` in the body, is one of `kinds` (predicates on the annotation's AST)."""
    args = tree.args.posonlyargs + tree.args.args + tree.args.kwonlyargs
    annotations = [(a.arg, a.annotation) for a in args if a.annotation is not None]
    annotations += [(node.target.id, node.annotation) for node in _walk_body(tree.body)
                    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is None]
    annotated = {name for name, annotation in annotations if any(kind(annotation) for kind in kinds)}
    return [a.arg for a in args if a.arg in annotated]


def _is_tensor_annotation(node) -> bool:
    """`T.Tensor(...)`, `T.Tensor[...]`, `T.Buffer...`, `T.StridedTensor(...)`, `T.ptr` (typed by
    `T.match_buffer` in the body; signature annotations like `x: bool` are constants)."""
    if isinstance(node, ast.Attribute) and node.attr == "ptr":
        return True
    if isinstance(node, (ast.Call, ast.Subscript)):
        head = node.func if isinstance(node, ast.Call) else node.value
        name = head.attr if isinstance(head, ast.Attribute) else getattr(head, "id", "")
        return name in ("Tensor", "Buffer", "StridedTensor")
    return False


def _is_scalar_annotation(node) -> bool:
    """`T.int32`, `T.float32`, ...: a dtype of the `T` namespace names a runtime scalar parameter."""
    return isinstance(node, ast.Attribute) and isinstance(getattr(T, node.attr, None), DType)


def _walk_body(body):
    """ast.walk over `body` without entering nested function definitions."""
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


# calls that only an eager body makes (TileLang's builder-only T functions): the kernel may then be
# in a macro the body calls (`gemm_impl(A, B, C, ...)` of eagerjit.ipynb)
_EAGER_CALLS = ("const", "empty", "match_buffer")


def _is_eager(fn) -> bool:
    """Eager style: a `with ...Kernel(...)` directly in the body (not in a nested function), or,
    without a nested `@T.prim_func` (the lazy style's), a call of `T.const` / `T.empty` or a bare
    `A: T.Tensor[...]` annotation of a parameter in the body - the `with T.Kernel` is then in a
    macro the body calls."""
    try:
        tree = FunctionSource(fn).tree
    except CompileError:
        return False
    if any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node is not tree
           and any(_call_name(d if not isinstance(d, ast.Call) else d.func) == "prim_func"
                   for d in node.decorator_list)
           for node in ast.walk(tree)):
        return False
    params = {a.arg for a in tree.args.posonlyargs + tree.args.args + tree.args.kwonlyargs}
    for node in _walk_body(tree.body):
        if isinstance(node, ast.With):
            for item in node.items:
                call = item.context_expr
                if isinstance(call, ast.Call) and _call_name(call.func) == "Kernel":
                    return True
        elif isinstance(node, ast.Call) and _call_name(node.func) in _EAGER_CALLS and not _array_library_call(node.func):
            return True
        elif (isinstance(node, ast.AnnAssign) and node.value is None and isinstance(node.target, ast.Name)
              and node.target.id in params and _is_tensor_annotation(node.annotation)):
            return True
    return False


def _array_library_call(func) -> bool:
    """`torch.empty(...)` / `np.empty(...)`: a host array, not TileLang's `T.empty`."""
    return (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
            and func.value.id in ("torch", "np", "numpy"))


def _call_name(func) -> str:
    """The name a call's function is spelled with: `T.Kernel` / `Kernel` -> "Kernel"."""
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def jit(func=None, *, out_idx=None, target="auto", verbose=False, pass_configs=None, execution_backend=None,
        compile_flags=None, debug_root_path=None, target_host=None, backend=None):
    """`@tritile.jit` or `@tritile.jit(out_idx=..., target=..., backend=...)` (TileLang's keywords, and
    tritile's `backend`: "gluon" | "triton" | "auto", None reading `TRITILE_BACKEND` when a kernel is built)."""
    options = dict(out_idx=out_idx, target=target, verbose=verbose, pass_configs=pass_configs, backend=backend,
                   execution_backend=execution_backend, compile_flags=compile_flags,
                   debug_root_path=debug_root_path)

    def decorate(fn):
        return EagerJIT(fn, options) if _is_eager(fn) else LazyJIT(fn, options)

    return decorate(func) if func is not None else decorate
