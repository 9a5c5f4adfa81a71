"""Compile the generated ``@triton.jit`` module, and run it on a GPU or in Triton's interpreter.

`compile_kernel(func, target) -> TritonKernel` emits the module (`kernel_module.emit_module`),
stores it in tritile's cache directory and executes it (the memory cache serves a program
that prints the same again).  Nothing is compiled yet: `TritonKernel.compiled` runs
``triton.compile(ASTSource(...), target=GPUTarget(kind, arch, warp size))`` on first use -
the asm of every stage (ttir, ttgir, llir, ptx / amdgcn) for any target, on a machine
without a GPU - and refuses a kernel whose shared memory outgrows the target with a
`CompileError` at the user's kernel.

`TritonKernel.launch_bound(tensors, dim_values)` launches on GPU tensors; `interpret(...)`
runs the same kernel on CPU tensors in Triton's interpreter (`TRITON_INTERPRET=1`'s
executor, enabled for this call only: see `interpreting`).  Both take the tensors in
`func.params` order, outputs allocated, as an `ArgumentBinder` checked them.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import types

from tritile.codegen.generated_module import load_module
from tritile.codegen.triton.kernel_module import emit_module
from tritile.errors import CompileError
from tritile.ir import nodes as ir
from tritile.ir.printer import format_func
from tritile.runtime import cache

_interpreter_lock = threading.Lock()
_rewritten = {}  # a @triton.jit function's Python function -> its interpreter rewrite
_ABSENT = object()  # an attribute a patch adds, deleted again afterwards


@contextlib.contextmanager
def interpreting(module):
    """Calls of ``@triton.jit`` functions (the generated helpers, triton.language's own
    `tl.sum`, `tl.zeros`, ...) run through Triton's interpreter while this is held.

    Triton switches its interpreter on at import time (`TRITON_INTERPRET=1` makes every
    ``@triton.jit`` an `InterpretedFunction`); tritile chooses it per call, so the kernel runs
    as an `InterpretedFunction` and the JIT functions it calls are rewritten the same way
    here.  The interpreter patches triton.language while a kernel runs (`_patch_lang`), so
    one kernel is interpreted at a time, process-wide; `_interpreter_repairs` are in force
    meanwhile, and the generated `module`'s `libdevice` is `_INTERPRETED_LIBDEVICE`."""
    import numpy as np
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    def call_interpreted(self, *args, **kwargs):
        fn = _rewritten.get(self.fn)
        if fn is None:
            fn = _rewritten[self.fn] = InterpretedFunction(self.fn).rewrite()
        return fn(*args, **kwargs)

    with _interpreter_lock:
        patches = [(JITFunction, "__call__", call_interpreted), (module, "libdevice", _INTERPRETED_LIBDEVICE),
                   *_interpreter_repairs()]
        saved = [(owner, name, owner.__dict__.get(name, _ABSENT)) for owner, name, _ in patches]
        for owner, name, value in patches:
            setattr(owner, name, value)
        try:
            with np.errstate(all="ignore"):  # IEEE results (x / 0, inf - inf) warn in numpy only
                yield
        finally:
            for owner, name, value in saved:
                if value is _ABSENT:
                    delattr(owner, name)
                else:
                    setattr(owner, name, value)


def _interpreter_repairs() -> list:
    """(owner, attribute, replacement) for where Triton 3.6's interpreter departs from what the
    compiled kernel computes (docs/semantics.md):
    * `tl.maximum` / `tl.minimum` (maxnumf / minnumf, NaN-ignoring) are numpy's NaN-propagating
      maximum / minimum there: np.fmax / np.fmin;
    * bfloat16 `tl.dot` operands are multiplied as their uint16 bits: widened to float32 (exact);
      bfloat16 constants (`tl.full`) have no builder: rounded from float32 (bfloat16 arithmetic
      stays unmodeled: numpy adds the bits);
    * a scalar's `__index__` (a loop bound: `range(n)` of a runtime dim) is `int()` of a
      1-element array, an error under numpy >= 2.4: `.item()`;
    * `tl.device_print` prints numpy arrays; here it prints as the GPU does, one line per
      element: ``pid (x, y, z) idx (i, j) msg: value`` (floats as %f; a one-element value is
      taken for a scalar, ``idx ()``: the builder sees no shape beyond the data's)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    create_dot, patch_tensor = InterpreterBuilder.create_dot, interpreter._patch_lang_tensor

    def widened(x):
        if x.dtype.scalar != tl.bfloat16:
            return x
        return TensorHandle((x.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def create_dot_bf16(builder, a, b, d, *precision):
        return create_dot(builder, widened(a), widened(b), d, *precision)

    def patch_tensor_index(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    def get_bf16(builder, value):  # the float32 bits rounded to their upper half, to nearest even
        bits = np.array([value], dtype=np.float32).view(np.uint32)
        return TensorHandle(((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16), tl.bfloat16)

    return [(InterpreterBuilder, "get_bf16", get_bf16),
            (InterpreterBuilder, "create_maxnumf", lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmax)),
            (InterpreterBuilder, "create_minnumf", lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmin)),
            (InterpreterBuilder, "create_dot", create_dot_bf16),
            (interpreter, "_patch_lang_tensor", patch_tensor_index),
            (InterpreterBuilder, "create_print", _print_as_the_gpu_does)]


def _print_as_the_gpu_does(builder, prefix, hex, values, is_signed):
    pid = "pid ({}, {}, {})".format(*builder.grid_idx)
    if not values:
        print(pid + prefix)
    for value in values:
        data = value.data
        if data.size == 1 and data.ndim <= 1:
            data = data.reshape(())
        for index in itertools.product(*(range(n) for n in data.shape)):
            element = data[index].item()
            text = f"{element:f}" if isinstance(element, float) else str(int(element))
            print(f"{pid} idx ({', '.join(map(str, index))}){prefix}{text}")


# what the generated helpers call of libdevice, under Triton's interpreter (which runs no extern
# library call): mul_rn, the floor-modulo helper's unfused product, is numpy's (never fused)
_INTERPRETED_LIBDEVICE = types.SimpleNamespace(mul_rn=lambda a, b: a * b)


class TritonKernel:
    """A generated kernel: `.source` (triton.language), `.compiled` (Triton's CompiledKernel
    for `target`, made on first use), `.asm` ({"ttir", "ttgir", "llir", "ptx" | "amdgcn", ...}),
    `.metadata`."""

    def __init__(self, func: ir.PrimFunc, gen, module, target):
        self.func = func
        self.name = func.name
        self.source = gen.source
        self.target = target
        self._gen = gen
        self._module = module
        self._jit_fn = getattr(module, gen.kernel_name)
        self._compiled = None
        self._compile_lock = threading.Lock()
        self._dynamic_vars = list(func.dynamic_vars)

    def bound_to(self, func: ir.PrimFunc) -> "TritonKernel":
        """This kernel for `func`, an IR that prints the same (a cache hit): the runtime dims
        are looked up by `func`'s Vars, in the same order."""
        return TritonKernel(func, self._gen, self._module, self.target)

    # ---------------------------------------------------------------- compiling
    @property
    def compiled(self):
        with self._compile_lock:
            if self._compiled is None:
                self._compiled = self._compile()
        return self._compiled

    def compile(self) -> "TritonKernel":
        """Compile now (a `CompileError` if Triton refuses the program); returns self."""
        _ = self.compiled
        return self

    @property
    def asm(self) -> dict:
        return self.compiled.asm

    @property
    def metadata(self):
        return self.compiled.metadata

    def _compile(self):
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        gen, target = self._gen, self.target
        attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(gen.arg_names)
                 if gen.signature[name].startswith("*")}
        src = ASTSource(self._jit_fn, dict(gen.signature), constexprs={}, attrs=attrs)
        # num_stages=1: loops Triton pipelines are the T.Pipelined ones, each with its own stages
        options = {"num_warps": gen.num_warps, "num_stages": 1}
        try:
            compiled = cache.triton_compile(src, GPUTarget(target.kind, target.arch, target.warp_size), options)
        except OSError:
            raise  # the environment (an unusable Triton cache directory, a missing assembler), not the kernel
        except Exception as err:  # Triton's CompilationError / MLIR failures
            detail = "\n".join(str(err).strip().splitlines()[-12:])
            raise CompileError(f"the triton.language backend failed to compile kernel {self.name!r} for {target}:"
                               f"\n{detail}", self.func.loc) from err
        used, limit = compiled.metadata.shared, target.shared_memory_limit
        if used > limit:
            raise CompileError(f"kernel {self.name} needs {used} bytes of shared memory on {target}, more than the "
                               f"{limit} bytes available; use smaller tiles or fewer num_stages",
                               self.func.kernel.loc or self.func.loc)
        return compiled

    # ---------------------------------------------------------------- running
    def _dims(self, dim_values) -> list:
        return [int(dim_values[v]) for v in self._dynamic_vars] if self._dynamic_vars else []

    def launch_bound(self, tensors, dim_values=None):
        """Launch on GPU tensors (contiguous, 16-byte aligned: the kernel assumes both)."""
        for t, p in zip(tensors, self.func.params):
            if t.data_ptr() % 16:
                raise ValueError(f"argument {p.name} must be 16-byte aligned")
        compiled = self.compiled

        def launch(grid, args):
            compiled[grid](*args)

        self._module.tritile_launch(launch, *tensors, *self._dims(dim_values))

    def interpret(self, tensors, dim_values=None):
        """Run on CPU tensors in Triton's interpreter."""
        from triton.runtime.interpreter import InterpretedFunction

        interpreted = InterpretedFunction(self._jit_fn.fn)

        def launch(grid, args):
            with interpreting(self._module):
                interpreted[grid](*args)

        self._module.tritile_launch(launch, *tensors, *self._dims(dim_values))


def compile_kernel(func: ir.PrimFunc, target) -> TritonKernel:
    """`func` (at the backend's start stage) as a `TritonKernel` for `target` (a GPU target;
    CPU callers pass the target they plan for), from the memory cache when a program that
    prints the same was generated before."""

    key = cache.cache_key(format_func(func), ("triton.language",), target)
    hit = cache.lookup(key)
    if hit is None:
        with cache.compile_lock(key):
            hit = cache.lookup(key)
            if hit is None:
                gen = emit_module(func, target, target.warp_size)
                path = cache.store_module(key, gen.source)
                module = load_module(f"tritile_triton_k_{key}", gen.source,
                                     str(path) if path is not None else f"<tritile triton module k_{key}>")
                hit = cache.remember(key, TritonKernel(func, gen, module, target))
    # equal IR text, but the caller's runtime-dim Vars may be other objects: bind them
    same_vars = all(a is b for a, b in zip(hit.func.dynamic_vars, func.dynamic_vars))
    return hit if same_vars else hit.bound_to(func)
