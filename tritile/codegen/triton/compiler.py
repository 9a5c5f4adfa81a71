"""Compile the generated ``@triton.jit`` module, and run it on a GPU or in Triton's interpreter.

`compile_kernel(func, target) -> TritonKernel` emits the module (`kernel_module.emit_module`),
stores it in tritile's cache directory and executes it (the memory cache serves a program
that prints the same again).  Nothing is compiled yet: `TritonKernel.compiled` runs
``triton.compile(ASTSource(...), target=GPUTarget(kind, arch, warp size))`` on first use -
the asm of every stage (ttir, ttgir, llir, ptx / amdgcn) for any target, on a machine
without a GPU - and refuses a kernel whose shared memory outgrows the target with a
`CompileError` at the user's kernel.

`TritonKernel.launch_bound(tensors, dim_values)` launches on GPU tensors (through
`tritile.runtime.launcher`, as the Gluon backend's kernels: host TMA descriptors encoded once
per address and geometry); `interpret(...)` runs the same kernel - its TMA descriptors too -
on CPU tensors in Triton's interpreter (`TRITON_INTERPRET=1`'s executor, enabled for this call
only and repaired: `interpreter.py`).  Both take the tensors in
`func.params` order, outputs allocated, as an `ArgumentBinder` checked them.
"""
from __future__ import annotations

import threading

from tritile.codegen import ptx_fixups
from tritile.codegen.arg_attrs import divisibility_attrs
from tritile.codegen.generated_module import load_module
from tritile.codegen.runtime_vars import RuntimeVarsLookup
from tritile.codegen.triton import descriptors
from tritile.codegen.triton.interpreter import interpreting, typed_scalar
from tritile.codegen.triton.kernel_module import emit_module
from tritile.errors import CompileError
from tritile.ir import nodes as ir
from tritile.ir.printer import format_func
from tritile.runtime import cache
from tritile.switches import fp_fusion


class TritonKernel(RuntimeVarsLookup):
    """A generated kernel: `.source` (triton.language), `.compiled` (Triton's CompiledKernel
    for `target`, made on first use), `.asm` ({"ttir", "ttgir", "llir", "ptx" | "amdgcn", ...}),
    `.metadata`.  `fp_fusion`: whether Triton may contract a multiply and an add into one fused
    multiply-add (`switches.fp_fusion`, read when the kernel was generated)."""

    def __init__(self, func: ir.PrimFunc, gen, module, target, fp_fusion: bool = True):
        self.func = func
        self.fp_fusion = fp_fusion
        self.name = func.name
        self.source = gen.source
        self.target = target
        self._gen = gen
        self._module = module
        self._jit_fn = getattr(module, gen.kernel_name)
        self._compiled = None
        self._compile_lock = threading.Lock()
        self._launcher = None  # tritile.runtime.launcher's, made on the first GPU launch
        self._runtime_vars = list(func.runtime_vars)

    def bound_to(self, func: ir.PrimFunc) -> "TritonKernel":
        """This kernel for `func`, an IR that prints the same (a cache hit): the runtime scalars
        are looked up by `func`'s Vars, in the same order."""
        return TritonKernel(func, self._gen, self._module, self.target, self.fp_fusion)

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
        attrs = divisibility_attrs(self.func, gen.arg_names, gen.signature)
        src = cache.keyed_source(ASTSource)(self._jit_fn, dict(gen.signature), constexprs={}, attrs=attrs)
        # num_stages=1: loops Triton pipelines are the T.Pipelined ones, each with its own stages
        options = {"num_warps": gen.num_warps, "num_stages": 1, "enable_fp_fusion": self.fp_fusion}
        try:
            with ptx_fixups.applied():  # acts on CUDA's ptx stage only
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
        return [dim_values[v] for v in self._runtime_vars] if self._runtime_vars else []

    def launch_bound(self, tensors, dim_values=None):
        """Launch on GPU tensors (contiguous, 16-byte aligned: the kernel assumes both; a
        misaligned one is a ValueError naming it) through `tritile.runtime.launcher`: on NVIDIA
        Triton's C launcher with each TMA descriptor encoded once per address and geometry."""
        if self._launcher is None:
            from tritile.runtime.launcher import TritonLaunch, kernel_launcher

            names = [p.name for p in self.func.params]
            make = kernel_launcher if self.target.kind == "cuda" else TritonLaunch
            self._launcher = make(self.compiled, self._descriptor_specs(), names)
        self._module.tritile_launch(self._launcher, *tensors, *self._dims(dim_values))

    def interpret(self, tensors, dim_values=None):
        """Run on CPU tensors in Triton's interpreter, TMA descriptors included (Triton's
        interpreter reads and writes through host `TensorDescriptor`s with the hardware's
        out-of-bounds rule); a tensor read or written through one must be 16-byte aligned, as
        on the GPU."""
        from triton.runtime.interpreter import InterpretedFunction

        from tritile.runtime.launcher import addresses, host_descriptor

        interpreted = InterpretedFunction(self._jit_fn.fn)
        descs = self._gen.descriptors
        scalars = [self._gen.signature[name] for name in self._gen.arg_names[len(self.func.params) + len(descs):]]
        specs = self._descriptor_specs()

        def launch(grid, tensors, tma_operands, dims):
            addresses([operand[0] for operand in tma_operands], [self.func.params[d.param_index].name for d in descs])
            descriptors = [host_descriptor(operand, spec) for operand, spec in zip(tma_operands, specs)]
            typed = [typed_scalar(value, ty) for value, ty in zip(dims, scalars)]
            with interpreting(self._module):
                interpreted[grid](*tensors, *descriptors, *typed)

        self._module.tritile_launch(launch, *tensors, *self._dims(dim_values))

    def _descriptor_specs(self) -> list:
        from tritile.runtime.launcher import DescriptorSpec

        return [DescriptorSpec(block, layout) for block, layout in self._module.TMA_DESCRIPTORS]


def compile_kernel(func: ir.PrimFunc, target) -> TritonKernel:
    """`func` (at the backend's start stage) as a `TritonKernel` for `target` (a GPU target;
    CPU callers pass the target they plan for), from the memory cache when a program that
    prints the same was generated before."""

    contract = fp_fusion()
    key = cache.cache_key(format_func(func), ("triton.language", ("tma", descriptors.enabled()),
                                              ("fp_fusion", contract)), target)
    hit = cache.lookup(key)
    if hit is None:
        with cache.compile_lock(key):
            hit = cache.lookup(key)
            if hit is None:
                gen = emit_module(func, target, target.warp_size)
                path = cache.store_module(key, gen.source)
                module = load_module(f"tritile_triton_k_{key}", gen.source,
                                     str(path) if path is not None else f"<tritile triton module k_{key}>")
                hit = cache.remember(key, TritonKernel(func, gen, module, target, contract))
    # equal IR text, but the caller's runtime-dim Vars may be other objects: bind them
    same_vars = all(a is b for a, b in zip(hit.func.runtime_vars, func.runtime_vars))
    return hit if same_vars else hit.bound_to(func)
