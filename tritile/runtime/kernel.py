"""`JITKernel`: one compiled specialisation of a tile program.

Contract: built from the frontend's `PrimFunc` (with its final `out_idx`), it runs the pass
list once (`tritile.lowering.run_passes`, planned for the kernel's target, or for cuda:90
when the target is the CPU so the passes are still exercised) and keeps every stage.
`kernel(*tensors)` checks the arguments (`tritile.runtime.arguments.ArgumentBinder`, which
remembers the outcome per kind of argument list), allocates outputs,
then dispatches: CPU tensors or `TRITILE_INTERPRET=1` -> the reference interpreter on the
final IR; CUDA tensors -> the backend's kernel, compiled on first use and kept here.
A program with runtime integers (`T.dynamic` dims, integer scalar parameters) is specialised
per call on which of them are multiples of 16 (`tritile.ir.divisibility`, as Triton's
`tt.divisibility`): each divisibility key has its own stages (the pass list run on
`divisibility.specialize` of the frontend IR, the first time a call has that key) and its own
compiled kernels; interpreting a call runs its key's final IR too.  `stages` / `func` are the
key of no divisible value (what assumes nothing of them), and
`get_source(stage, dims={name: value})` shows the variant those values select.
`backend` ("gluon" | "triton" | "auto"; None reads `TRITILE_BACKEND`) picks the code generator
through `tritile.codegen`'s table (auto: Gluon on NVIDIA where it takes the program, else
triton.language; triton.language on AMD); the pass list runs as far as the chosen backends
start.  With backend "triton", CPU tensors run the generated kernel in Triton's interpreter.  A call
whose runtime grid has no block (a `T.dynamic` extent of 0: an empty batch) runs nothing.
It returns the outputs (one tensor, or a list when there are several), or None without
`out_idx`.  `kernel.prepare(*args)` checks a call's arguments and returns a `PreparedCall`, which
runs the kernel on tensors of their kind (types, dtypes, shapes, strides, devices) without
checking them again: what a caller that keys its calls by that kind keeps (the torch operators).
`globals_read` holds the guards of the module globals the frontend read
(`tritile.frontend.source`), which the JIT checks before serving this kernel again.

A function of several kernels (`PrimFunc.parts`: several `with T.Kernel` blocks, or
`T.alloc_global` workspaces) is one `JITKernel` per part, each compiled as any one-kernel
function; this one binds the call's arguments, allocates the workspaces on the call's device
(`arguments.allocate_workspaces`) and runs the parts in order on the tensors and workspaces (a
part whose grid has no block is skipped).  The call's divisibility key is one for the whole
call (the parts share the function's runtime Vars); each part keeps its variant per key, so
each kernel is specialised on the values it is launched with.  Its stages are the function
with every part at that stage, and `get_source` of a codegen stage is the parts' sources one
after another.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from tritile import codegen
from tritile.errors import CompileError
from tritile.ir import divisibility
from tritile.ir import nodes as ir
from tritile.ir.printer import format_func
from tritile import switches, transform
from tritile.lowering import PASS_NAMES, run_passes
from tritile.runtime.arguments import (ArgumentBinder, allocate_workspaces, call_device, derive_views, empty_output,
                                      written_params)
from tritile.runtime.target import Target, parse_target

# generated source stages; "triton" and "ttir" always from the triton.language backend, the
# others from the backend chosen for the planned target
_CODEGEN_STAGES = ("gluon", "triton", "ttir", "ttgir", "llir", "ptx", "amdgcn")
_PLANNED_FOR_CPU = Target("cuda", 90)
# how each codegen stage writes a comment line (the heading of each part's source)
_COMMENT = {"gluon": "#", "triton": "#", "llir": ";", "amdgcn": ";"}


@dataclass
class _Variant:
    """The program for one divisibility key: its stages, the runtime integers it renamed (the
    frontend's Var -> the variant's, `multiple_of` 16), its codegen results per target."""

    stages: list
    renamed: dict
    compiled: dict = field(default_factory=dict)  # str(target) -> codegen result
    device_kernel: object = None  # the codegen result for the device target, once compiled
    inspected_stages: list = None  # the whole pass list's stages, when inspected past `stages`

    @property
    def func(self) -> ir.PrimFunc:
        return self.stages[-1][1]

    def dims(self, dim_values: dict) -> dict:
        """A call's runtime values ({frontend Var: value}) keyed by this variant's Vars (the
        interpreters'; the device kernel looks the frontend's Vars up itself)."""
        if not self.renamed:
            return dim_values
        return {self.renamed.get(v, v): value for v, value in dim_values.items()}


class JITKernel:
    def __init__(self, func: ir.PrimFunc, target="auto", verbose: bool = False, pass_configs=None,
                 execution_backend=None, compile_flags=None, backend=None):
        if func.kernel is None and not func.parts:
            raise CompileError(f"{func.name} has no `with T.Kernel(...)` block: tritile compiles kernels, and "
                               f"a function of host code only (TileLang's statements outside T.Kernel) has none",
                               func.loc)
        self.target = parse_target(target)
        self.backend = codegen.backend_name(backend)
        # the body's T.annotate_pass_configs / T.annotate_compile_flags; the caller's override them
        self.pass_configs = transform.normalize({**func.attrs.get("pass_configs", {}), **dict(pass_configs or {})})
        self.compile_flags = compile_flags if compile_flags is not None else func.attrs.get("compile_flags")
        self.execution_backend = execution_backend
        self.plan_target = self.target if self.target.kind in ("cuda", "hip") else _PLANNED_FOR_CPU
        self.globals_read = func.attrs.get("globals_read", ())
        self.backends = codegen.candidates(self.backend, self.plan_target)
        self._parts = [JITKernel(part, target=target, pass_configs=pass_configs, execution_backend=execution_backend,
                                 compile_flags=compile_flags, backend=backend) for part in func.parts]
        if self._parts:
            self.stages = [(name, dataclasses.replace(func, parts=[part.stages[i][1] for part in self._parts]))
                           for i, (name, _) in enumerate(self._parts[0].stages)]
        else:
            with switches.overridden(transform.schedule_overrides(self.pass_configs)):
                self.stages = run_passes(func, self.plan_target,
                                         stop_after=codegen.last_stage(self.backends, PASS_NAMES))
        self.func = self.stages[-1][1]
        self.out_idx = list(self.func.out_idx)
        self._written = written_params(self.func)
        # the parts check their own grids when they run
        self._bind = ArgumentBinder(self.func, self._written, () if self._parts else func.kernel.grid)
        self._runtime_vars = list(self.func.runtime_vars)
        self._plain = _Variant(self.stages, {})  # no runtime integer assumed divisible
        # divisibility key -> _Variant (a function of several kernels: each part keeps its own)
        self._variants = {(False,) * len(divisibility.specialized_vars(self.func)): self._plain}
        self._launched = self._plain  # the variant of the last call (`_device_kernel`)
        if verbose:
            print(format_func(self.func))

    @property
    def params(self):
        return self.func.params

    # ---------------------------------------------------------------- running
    def __call__(self, *args):
        tensors, dim_values, runs, divisible = self._bind(args)
        self._launch(tensors, dim_values, runs, divisible)
        return self._returned(tensors)

    def prepare(self, *args) -> "PreparedCall":
        """`self(*args)`'s checks (its TypeError / ValueError), and a `PreparedCall` that runs
        this kernel on tensors of `args`' kind without them."""
        return PreparedCall(self, args, self._bind.outcome_of_kind(args))

    def _launch(self, tensors: list, dim_values: dict, runs: bool, divisible: tuple) -> None:
        if self._parts:
            self._run_parts(tensors, dim_values, divisible)
        elif runs:
            self._run(tensors, dim_values, divisible)

    def _returned(self, tensors: list):
        """What a call returns: its one output, a list of several, or None."""
        outputs = [tensors[i] for i in self.out_idx]
        if not outputs:
            return None
        return outputs[0] if len(outputs) == 1 else outputs

    def _run(self, tensors: list, dim_values: dict, divisible: tuple) -> None:
        variant = self._variants.get(divisible) or self._variant(divisible)
        self._launched = variant
        # the binder checked that every tensor is on one device kind, CUDA or CPU (`is_cuda` is
        # cheaper than `device.type`)
        if self._interprets("cuda" if tensors and tensors[0].is_cuda else "cpu"):
            if self.backend == "triton" and not switches.interpret_requested():
                # the generated triton.language kernel in Triton's interpreter: a second oracle
                return self._triton_kernel(variant, self.plan_target).interpret(tensors, variant.dims(dim_values))
            from tritile.interpreter import execute

            execute(variant.func, tensors, variant.dims(dim_values))
        else:
            if variant.device_kernel is None:
                # looking the call's runtime values up by the frontend's Vars: no translation per launch
                variant.device_kernel = self._codegen(self._device_target(), variant).with_runtime_vars(
                    self._runtime_vars)
            variant.device_kernel.launch_bound(tensors, dim_values)

    def _variant(self, key: tuple) -> _Variant:
        """The variant of divisibility key `key`, its pass list run on first use."""
        variant = self._variants.get(key)
        if variant is None:
            func, renamed = divisibility.specialize(self.stages[0][1], key)
            with switches.overridden(transform.schedule_overrides(self.pass_configs)):
                stages = run_passes(func, self.plan_target, stop_after=codegen.last_stage(self.backends, PASS_NAMES))
            variant = self._variants[key] = _Variant(stages, renamed)
        return variant

    @property
    def _device_kernel(self):
        """The device kernel of the last call's variant (None before its first GPU launch)."""
        return self._launched.device_kernel

    def _run_parts(self, tensors: list, dim_values: dict, divisible: tuple) -> None:
        """Each part in order, at the call's divisibility key (the parts share the function's
        runtime Vars, so one key selects each part's variant)."""
        tensors = tensors + allocate_workspaces(self.func, dim_values, call_device(tensors))
        tensors = tensors + derive_views(self.func, tensors, dim_values)
        for part in self._parts:
            if part._bind.grid_has_blocks(dim_values):
                part._run(tensors, dim_values, divisible)

    def _interprets(self, device_kind: str) -> bool:
        """Run on the reference interpreter: CPU tensors, or `TRITILE_INTERPRET=1` (read per call)."""
        return device_kind == "cpu" or switches.interpret_requested()

    def _device_target(self) -> Target:
        return self.target if self.target.kind in ("cuda", "hip") else parse_target("auto")

    def _codegen(self, target: Target, variant: _Variant = None):
        """The codegen result of `variant` (default: the one assuming nothing) for `target`."""
        variant = variant or self._plain
        key = str(target)
        if key not in variant.compiled:
            backends = self.backends if target == self.plan_target else codegen.candidates(self.backend, target)
            variant.compiled[key] = codegen.compile_kernel(variant.stages, target, backends)
        return variant.compiled[key]

    def _triton_kernel(self, variant: _Variant, target: Target):
        """The triton.language backend's kernel for `target`, generated (not yet compiled)."""
        from tritile.codegen.triton import compile_kernel

        return compile_kernel(codegen.stage_of(codegen.BACKENDS["triton"], variant.stages), target)

    # ---------------------------------------------------------------- sources
    def get_source(self, stage: str = "tile", dims: dict = None) -> str:
        """The program at `stage`: "tile" (frontend IR), a pass name, "gluon", "triton"
        (generated sources), or "ttir", "ttgir", "llir", "ptx" / "amdgcn" (Triton's stages of the
        chosen backend for the planned target; "ttir" exists only on the triton.language
        backend, which it then uses).  Passes and the Gluon source past where the chosen backends
        start are run for inspection on demand.  `dims` ({T.dynamic or integer scalar parameter
        name: value}) selects the divisibility variant a call with those values runs (one not
        named: not a multiple of 16); without it, the variant that assumes nothing of them.  A
        function of several kernels gives every kernel at that stage."""
        if self._parts:
            return self._parts_source(stage, dims)
        variant = self._variant(divisibility.key_of_sizes(self.func, dims)) if dims else self._plain
        if stage in ("triton", "ttir"):
            kernel = self._triton_kernel(variant, self.plan_target)
            return kernel.source if stage == "triton" else kernel.asm["ttir"]
        if stage == "gluon":
            from tritile.codegen.gluon import compile_kernel

            return compile_kernel(self._all_stages(variant)[-1][1], self.plan_target).source
        if stage in _CODEGEN_STAGES:
            asm = self._codegen(self.plan_target, variant).asm
            if stage not in asm:
                raise ValueError(f"stage {stage!r} does not exist for {self.plan_target} (it has {', '.join(asm)})")
            return asm[stage]
        return format_func(self._stage_func(stage, variant))

    def _stage_func(self, stage: str, variant: _Variant) -> ir.PrimFunc:
        """`variant`'s IR at "tile" or after pass `stage`."""
        for name, func in variant.stages if stage in dict(variant.stages) else self._all_stages(variant):
            if name == stage:
                return func
        valid = ", ".join(["tile", *PASS_NAMES, *_CODEGEN_STAGES])
        raise ValueError(f"unknown stage {stage!r}; expected one of: {valid}")

    def _parts_source(self, stage: str, dims: dict = None, kernel_source: bool = False) -> str:
        """Every part's source at `stage` (or its `get_kernel_source`), in launch order, each of
        the variant `dims` selects."""
        key = divisibility.key_of_sizes(self.func, dims) if dims else None  # checked against the function's names
        if stage not in _CODEGEN_STAGES and not kernel_source:
            variants = [p._variant(key) if key else p._plain for p in self._parts]
            # the header's runtime Vars as the variants renamed them (the parts share the function's)
            renamed = variants[0].renamed
            head = dataclasses.replace(self.func, dynamic_vars=[renamed.get(v, v) for v in self.func.dynamic_vars],
                                       scalar_params=[(i, renamed.get(v, v)) for i, v in self.func.scalar_params])
            return format_func(dataclasses.replace(head, parts=[p._stage_func(stage, v)
                                                                for p, v in zip(self._parts, variants)]))
        mark = _COMMENT.get("gluon" if kernel_source else stage, "//")
        return "\n".join(f"{mark} kernel {i} of {len(self._parts)}: {part.func.name}\n"
                         + (part.get_kernel_source() if kernel_source else part.get_source(stage, dims))
                         for i, part in enumerate(self._parts))

    def _all_stages(self, variant: _Variant) -> list:
        """The stages of the whole pass list: `variant.stages`, or, when the chosen backends
        start earlier, the rest run once for inspection."""
        if len(variant.stages) == len(PASS_NAMES) + 1:
            return variant.stages
        if variant.inspected_stages is None:
            with switches.overridden(transform.schedule_overrides(self.pass_configs)):
                variant.inspected_stages = run_passes(variant.stages[0][1], self.plan_target)
        return variant.inspected_stages

    def get_profiler(self, tensor_supply_type=None):
        """TileLang's profiler: `assert_allclose(ref_prog)`, `do_bench()`, `run_once()`."""
        from tritile.runtime.profiler import Profiler, TensorSupplyType

        return Profiler(self, tensor_supply_type or TensorSupplyType.Auto)

    def run_once(self, func=None):
        """TileLang's: `func` (default this kernel) once on inputs the profiler supplies."""
        return self.get_profiler().run_once(func)

    def get_kernel_source(self, kernel_only: bool = True) -> str:
        """The generated source of the chosen backend (TileLang's name for the device kernel's source)."""
        if self._parts:
            return self._parts_source("gluon", kernel_source=True)
        return self._codegen(self.plan_target).source

    def __repr__(self) -> str:
        return f"JITKernel({self.func.name}, target={self.target})"


class PreparedCall:
    """`kernel(*args)` for calls whose tensors are all of one kind (types, dtypes, shapes,
    strides, devices), checked once: `JITKernel.prepare` ran the argument checks and kept what
    they bind (`ArgumentBinder.outcome_of_kind`: runtime dims, output layouts, whether the grid
    has blocks, divisibility key); a call only allocates the outputs and runs the kernel.  Where
    calls of the kind do not all bind alike (scalar parameters, a tensor the checks copy) each
    call is `kernel(*args)`.  The caller vouches that each call's tensors are of the kind it was
    prepared for: the torch operators keep one per call signature (tritile/ops/signatures.py),
    which fixes the kind of every tensor they pass.  What the launch checks (16-byte alignment)
    and TRITILE_INTERPRET are still checked per call."""

    def __init__(self, kernel: JITKernel, args, outcome):
        self.kernel = kernel
        self._outcome = outcome
        if outcome is None:
            return
        self._dims, self._out_layouts, self._runs, self._divisible = outcome
        binder = kernel._bind
        self._device = call_device(args)
        # the common layout: the parameters are the inputs, then contiguous outputs in `out_idx`
        # order (appended to the arguments)
        self._appended = [(tuple(shape), dtype) for (_, dtype), (shape, strides) in
                          zip(binder.outputs, self._out_layouts) if strides is None]
        in_order = binder.inputs + [i for i, _ in binder.outputs] == list(range(binder.n_params))
        if len(self._appended) != len(self._out_layouts) or not in_order:
            self._appended = None
        # the one output's position (what most kernels return), else None: `kernel._returned`
        self._output = kernel.out_idx[0] if len(kernel.out_idx) == 1 else None

    def __call__(self, *args):
        kernel = self.kernel
        if self._outcome is None:
            return kernel(*args)
        if not self._out_layouts:  # every tensor passed
            tensors = list(args)
        elif self._appended is not None:
            tensors = list(args)
            for shape, dtype in self._appended:
                tensors.append(empty_output(shape, dtype, self._device))
        else:
            tensors = kernel._bind.with_outputs(list(args), self._out_layouts)
        kernel._launch(tensors, self._dims, self._runs, self._divisible)
        return tensors[self._output] if self._output is not None else kernel._returned(tensors)
