"""Compile final tile IR to a Triton `CompiledKernel` through generated Gluon, and launch it.

`compile_kernel(func, target)` (re-exported as `tritile.codegen.gluon.compile_kernel`):
emits the Gluon module (`tritile.codegen.gluon.emit_module`), writes it to the tritile
cache dir, executes it, and compiles the kernel with
``triton.compile(GluonASTSource(...), target=GPUTarget("cuda", arch, 32))`` - no driver or
GPU needed, so CPU machines compile for sm_80 / sm_90.  Results are cached in memory and
(sources) on disk, see `cache.py`.  Triton errors become `tritile.CompileError`; trouble with
a cache (ours or Triton's) is a `cache.CacheWarning` and a recovery, never a `CompileError`.
Compiles of one kernel are serialized across threads and processes (`cache.compile_lock`), so
concurrent callers compile it once and the rest are served from the caches.

Layouts chosen for another target (the pass list may have been planned for sm_90 while
the device is sm_80) are re-inferred for `target` first.

`GluonKernel.launch(args, dim_values)` takes CUDA tensors in `func.params` order (outputs
pre-allocated) and the runtime dims; everything not depending on the tensors (host
launcher, argument checks, dynamic-dim order) is prepared at compile time, and the launch
itself goes through `tritile.runtime.launcher`.  The kernel's constant tables (the
persistent tile schedule) are copied to each device once and passed after the tensors.
Compile-time assumptions checked at launch: tensors contiguous (a `T.StridedTensor`'s strides are
the `ArgumentBinder`'s to check), 16-byte aligned; the runtime
dims a variant assumes multiples of 16 (`tt.divisibility`, `codegen/arg_attrs.py`) are the
ones `JITKernel` chose it for.
"""
from __future__ import annotations

import torch

from tritile.codegen import ptx_fixups
from tritile.codegen.arg_attrs import divisibility_attrs
from tritile.codegen.generated_module import load_module
from tritile.codegen.runtime_vars import RuntimeVarsLookup
from tritile.errors import CompileError
from tritile.ir import nodes as ir
from tritile.ir.printer import format_func
from tritile.runtime import cache
from tritile.switches import fp_fusion


class GluonKernel(RuntimeVarsLookup):
    """A compiled kernel: `.source` (generated Gluon), `.asm` ({"ttgir", "ptx", ...}),
    `.metadata` (Triton's, e.g. `.shared`), `.compiled` (triton CompiledKernel)."""

    def __init__(self, func: ir.PrimFunc, source: str, compiled, host_launch, descriptors, tables=()):
        self.func = func
        self.name = func.name
        self.source = source
        self.compiled = compiled
        self.asm = compiled.asm
        self.metadata = compiled.metadata
        self.descriptors = descriptors  # [DescriptorSpec] of the kernel's TMA descriptor arguments
        self._host_launch = host_launch
        self._launcher = None  # tritile.runtime.launcher's, made on the first launch (needs the device)
        self._runtime_vars = list(func.runtime_vars)
        self._checks = [(p.name, p.dtype.torch) for p in func.params]
        self._contiguous = [p.strides is None for p in func.params]  # a T.StridedTensor's are checked by the binder
        self.tables = tuple(tables)  # ((name, int32 values), ...): the kernel's constant tables
        self._table_tensors = {}  # device index -> the tables as int32 tensors there

    def bound_to(self, func: ir.PrimFunc) -> "GluonKernel":
        """This compiled kernel for `func`, an IR that prints the same (a cache hit): the
        runtime scalars are looked up by `func`'s Vars, in the same order."""
        return GluonKernel(func, self.source, self.compiled, self._host_launch, self.descriptors, self.tables)

    def launch(self, args, dim_values=None):
        """Launch on CUDA tensors `args` (params order, outputs allocated), checking them (and
        that the runtime integers are multiples of what the kernel assumes) first."""
        if len(args) != len(self._checks):
            raise TypeError(f"{self.name} takes {len(self._checks)} tensors, got {len(args)}")
        for t, (name, dtype), contiguous in zip(args, self._checks, self._contiguous):
            if not isinstance(t, torch.Tensor) or not t.is_cuda:
                raise TypeError(f"argument {name} must be a CUDA tensor")
            if t.dtype != dtype:
                raise TypeError(f"argument {name} must have dtype {dtype}, got {t.dtype}")
            if contiguous and not t.is_contiguous():
                raise ValueError(f"argument {name} must be contiguous")
        for own, var in zip(self.func.runtime_vars, self._runtime_vars):
            if own.multiple_of > 1 and int(dim_values[var]) % own.multiple_of:
                raise ValueError(f"runtime value {own.name} = {dim_values[var]}: this kernel was compiled for a "
                                 f"multiple of {own.multiple_of}")
        self.launch_bound(args, dim_values)

    def launch_bound(self, args, dim_values=None):
        """Launch on arguments an `ArgumentBinder` already checked (count, dtypes, one device
        kind, contiguity); the launcher checks the alignment the kernel was compiled for."""
        dims = [dim_values[v] for v in self._runtime_vars] if self._runtime_vars else []
        if self._launcher is None:
            from tritile.runtime.launcher import kernel_launcher

            names = [name for name, _ in self._checks] + [name for name, _ in self.tables]
            self._launcher = kernel_launcher(self.compiled, self.descriptors, names)
        if self.tables:
            args = [*args, *self._tables_on(args[0].device if args else torch.device("cuda"))]
        self._host_launch(self._launcher, *args, *dims)

    def _tables_on(self, device) -> list:
        """The constant tables as int32 tensors on `device`, made there once."""
        key = device.index if device.index is not None else torch.cuda.current_device()
        tensors = self._table_tensors.get(key)
        if tensors is None:
            tensors = self._table_tensors[key] = [
                torch.tensor(values, dtype=torch.int32, device=torch.device("cuda", key)) for _, values in self.tables]
        return tensors


def compile_kernel(func: ir.PrimFunc, target) -> GluonKernel:
    """`func` (final tile IR) compiled for the CUDA `target`: from the memory cache, else compiled
    once under the kernel's `cache.compile_lock` - concurrent callers of one kernel wait and share
    the result."""
    if getattr(target, "kind", None) != "cuda":
        raise ValueError(f"target must be a CUDA target for the Gluon backend, got {target}")
    if func.attrs.get("layout_target") != str(target):
        # encodings are target-specific (wgmma vs mma.sync): choose them for this target
        from tritile.lowering import layout_inference

        func = layout_inference.run(func, target)
    ir_text = format_func(func)
    contract = fp_fusion()  # read once: the key and the compile must agree
    key = cache.cache_key(ir_text, _specialization(func, contract), target)
    hit = cache.lookup(key)
    if hit is None:
        with cache.compile_lock(key):
            # another thread may have compiled it while this one waited for the lock
            hit = cache.lookup(key) or cache.remember(key, _compile(func, target, key, contract))
    # equal IR text, but the caller's runtime-dim Vars may be other objects: bind them
    same_vars = all(a is b for a, b in zip(hit.func.runtime_vars, func.runtime_vars))
    return hit if same_vars else hit.bound_to(func)


def _compile(func: ir.PrimFunc, target, key: str, contract: bool) -> GluonKernel:
    from tritile.codegen.gluon.kernel_module import emit_module

    try:
        gen = emit_module(func, target)
    except CompileError:
        raise
    except Exception as err:  # a backend bug: still report it against the user's kernel
        raise CompileError(f"the Gluon backend cannot lower kernel {func.name!r}: {type(err).__name__}: {err}",
                           func.loc) from err
    path = cache.store_module(key, gen.source)
    module = load_module(f"tritile_gluon_k_{key}", gen.source,
                         str(path) if path is not None else f"<tritile gluon module k_{key}>")
    compiled = _triton_compile(func, target, gen, module, contract)
    _check_shared_memory(func, target, compiled)
    from tritile.runtime.launcher import DescriptorSpec

    descriptors = [DescriptorSpec(block, layout) for block, layout in module.TMA_DESCRIPTORS]
    return GluonKernel(func, gen.source, compiled, module.tritile_launch, descriptors, module.CONSTANT_TABLES)


def _check_shared_memory(func, target, compiled):
    """lowering/shared_memory_budget.py counts the program's buffers; the code generator adds
    its own (TMA-store staging tiles, barriers): a kernel that outgrows the SM would otherwise
    fail at its first launch, inside Triton."""
    used, limit = compiled.metadata.shared, target.shared_memory_limit
    if used > limit:
        planned = func.attrs.get("shared_bytes")
        raise CompileError(f"kernel {func.name} needs {used} bytes of shared memory on {target}"
                           + (f" ({planned} B of buffers, the rest staging tiles and barriers of the generated code)"
                              if planned is not None else "")
                           + f", more than the {limit} bytes available; use smaller tiles or fewer num_stages",
                           func.kernel.loc or func.loc)


def _specialization(func, contract: bool) -> tuple:
    # pointers are compiled as 16-byte aligned (checked at launch); a runtime dim's divisibility
    # is in the IR text (`ir/divisibility.py`: "# dynamic: k (multiple of 16)"); codegen switches that leave the IR text unchanged must still select another kernel
    from tritile.codegen.gluon.rings import codegen_options
    from tritile.codegen.gluon.rules import vector_atomics_enabled
    from tritile.switches import schedule_switch

    return ("ptr-align-16",) + codegen_options() + (("vector_atomics", vector_atomics_enabled()),
                                                     ("fp_fusion", contract),
                                                     ("full_rank_tma", schedule_switch("TRITILE_FULL_RANK_TMA")),
                                                     ("tma_reduce", schedule_switch("TRITILE_TMA_REDUCE")))


def _triton_compile(func, target, gen, module, contract: bool):
    """`module`'s kernel compiled by Triton; `contract`: whether a product feeding a sum may
    become one fused multiply-add (`switches.fp_fusion`)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    signature = {}
    descs = {d.name: d for d in gen.descriptors}
    for name in gen.arg_names:
        if name in descs:
            d = descs[name]
            host = module.TensorDescriptor.from_tensor(
                torch.empty(list(d.block_shape), dtype=d.dtype.torch), list(d.block_shape),
                getattr(module, f"HOST_{name}_layout"))
            signature[name] = mangle_type(host)
        else:
            signature[name] = gen.signature[name]
    attrs = divisibility_attrs(func, gen.arg_names, gen.signature)
    src = cache.keyed_source(GluonASTSource)(getattr(module, gen.kernel_name), signature, constexprs={}, attrs=attrs)
    try:
        with ptx_fixups.applied():
            return cache.triton_compile(src, GPUTarget("cuda", target.arch, 32),
                                        {"num_warps": gen.num_warps, "enable_fp_fusion": contract})
    except OSError:
        raise  # the environment (an unusable Triton cache directory, a missing ptxas), not the kernel
    except Exception as err:  # Triton's CompilationError / MLIR failures
        detail = str(err).strip().splitlines()
        summary = "\n".join(detail[-12:])
        raise CompileError(f"the Gluon backend failed to compile kernel {func.name!r} for {target}:\n{summary}",
                           func.loc) from err
