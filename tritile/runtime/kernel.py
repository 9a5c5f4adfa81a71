"""`JITKernel`: one compiled specialisation of a tile program.

Contract: built from the frontend's `PrimFunc` (with its final `out_idx`), it runs the pass
list once (`tritile.lowering.run_passes`, planned for the kernel's target, or for cuda:90
when the target is the CPU so the passes are still exercised) and keeps every stage.
`kernel(*tensors)` checks the arguments (`tritile.runtime.arguments.ArgumentBinder`, which
remembers the outcome per kind of argument list), allocates outputs,
then dispatches: CPU tensors or `TRITILE_INTERPRET=1` -> the reference interpreter on the
final IR; CUDA tensors -> the backend's kernel, compiled on first use and kept here.
`backend` ("gluon" | "triton" | "auto"; None reads `TRITILE_BACKEND`) picks the code generator
through `tritile.codegen`'s table (auto: Gluon on NVIDIA where it takes the program, else
triton.language; triton.language on AMD); the pass list runs as far as the chosen backends
start.  With backend "triton", CPU tensors run the generated kernel in Triton's interpreter.  A call
whose runtime grid has no block (a `T.dynamic` extent of 0: an empty batch) runs nothing.
It returns the outputs (one tensor, or a list when there are several), or None without
`out_idx`.  `globals_read` holds the guards of the module globals the frontend read
(`tritile.frontend.source`), which the JIT checks before serving this kernel again.

A function of several kernels (`PrimFunc.parts`: several `with T.Kernel` blocks, or
`T.alloc_global` workspaces) is one `JITKernel` per part, each compiled as any one-kernel
function; this one binds the call's arguments, allocates the workspaces on the call's device
(`arguments.allocate_workspaces`) and runs the parts in order on the tensors and workspaces (a
part whose grid has no block is skipped).  Its stages are the function with every part at that
stage, and `get_source` of a codegen stage is the parts' sources one after another.
"""
from __future__ import annotations

import dataclasses
import os

from tritile import codegen
from tritile.ir import nodes as ir
from tritile.ir.printer import format_func
from tritile import switches, transform
from tritile.lowering import PASS_NAMES, run_passes
from tritile.runtime.arguments import ArgumentBinder, allocate_workspaces, call_device, written_params
from tritile.runtime.target import Target, parse_target

# generated source stages; "triton" and "ttir" always from the triton.language backend, the
# others from the backend chosen for the planned target
_CODEGEN_STAGES = ("gluon", "triton", "ttir", "ttgir", "llir", "ptx", "amdgcn")
_PLANNED_FOR_CPU = Target("cuda", 90)
# how each codegen stage writes a comment line (the heading of each part's source)
_COMMENT = {"gluon": "#", "triton": "#", "llir": ";", "amdgcn": ";"}


class JITKernel:
    def __init__(self, func: ir.PrimFunc, target="auto", verbose: bool = False, pass_configs=None,
                 execution_backend=None, compile_flags=None, backend=None):
        self.target = parse_target(target)
        self.backend = codegen.backend_name(backend)
        self.pass_configs = transform.normalize(pass_configs)
        self.compile_flags = compile_flags
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
        self._compiled = {}  # str(target) -> codegen result
        self._device_kernel = None  # the codegen result for the device target, once compiled
        self._inspected_stages = None  # the whole pass list's stages, when inspected past self.stages
        if verbose:
            print(format_func(self.func))

    @property
    def params(self):
        return self.func.params

    # ---------------------------------------------------------------- running
    def __call__(self, *args):
        tensors, dim_values, runs = self._bind(args)
        if self._parts:
            self._run_parts(tensors, dim_values)
        elif runs:
            self._run(tensors, dim_values)
        outputs = [tensors[i] for i in self.out_idx]
        if not outputs:
            return None
        return outputs[0] if len(outputs) == 1 else outputs

    def _run(self, tensors: list, dim_values: dict) -> None:
        # the binder checked that every tensor is on one device kind
        if self._interprets(tensors[0].device.type if tensors else "cpu"):
            if self.backend == "triton" and os.environ.get("TRITILE_INTERPRET", "0") in ("", "0"):
                # the generated triton.language kernel in Triton's interpreter: a second oracle
                return self._triton_kernel(self.plan_target).interpret(tensors, dim_values)
            from tritile.interpreter import execute

            execute(self.func, tensors, dim_values)
        else:
            if self._device_kernel is None:
                self._device_kernel = self._codegen(self._device_target())
            self._device_kernel.launch_bound(tensors, dim_values)

    def _run_parts(self, tensors: list, dim_values: dict) -> None:
        tensors = tensors + allocate_workspaces(self.func, dim_values, call_device(tensors))
        for part in self._parts:
            if part._bind.grid_has_blocks(dim_values):
                part._run(tensors, dim_values)

    def _interprets(self, device_kind: str) -> bool:
        """Run on the reference interpreter: CPU tensors, or `TRITILE_INTERPRET=1` (read per call)."""
        return device_kind == "cpu" or os.environ.get("TRITILE_INTERPRET", "0") not in ("", "0")

    def _device_target(self) -> Target:
        return self.target if self.target.kind in ("cuda", "hip") else parse_target("auto")

    def _codegen(self, target: Target):
        key = str(target)
        if key not in self._compiled:
            backends = self.backends if target == self.plan_target else codegen.candidates(self.backend, target)
            self._compiled[key] = codegen.compile_kernel(self.stages, target, backends)
        return self._compiled[key]

    def _triton_kernel(self, target: Target):
        """The triton.language backend's kernel for `target`, generated (not yet compiled)."""
        from tritile.codegen.triton import compile_kernel

        return compile_kernel(codegen.stage_of(codegen.BACKENDS["triton"], self.stages), target)

    # ---------------------------------------------------------------- sources
    def get_source(self, stage: str = "tile") -> str:
        """The program at `stage`: "tile" (frontend IR), a pass name, "gluon", "triton"
        (generated sources), or "ttir", "ttgir", "llir", "ptx" / "amdgcn" (Triton's stages of the
        chosen backend for the planned target; "ttir" exists only on the triton.language
        backend, which it then uses).  Passes and the Gluon source past where the chosen backends
        start are run for inspection on demand.  A function of several kernels gives every
        kernel at that stage."""
        if self._parts:
            return self._parts_source(stage)
        if stage in ("triton", "ttir"):
            kernel = self._triton_kernel(self.plan_target)
            return kernel.source if stage == "triton" else kernel.asm["ttir"]
        if stage == "gluon":
            from tritile.codegen.gluon import compile_kernel

            return compile_kernel(self._all_stages()[-1][1], self.plan_target).source
        if stage in _CODEGEN_STAGES:
            asm = self._codegen(self.plan_target).asm
            if stage not in asm:
                raise ValueError(f"stage {stage!r} does not exist for {self.plan_target} (it has {', '.join(asm)})")
            return asm[stage]
        return format_func(self._stage_func(stage))

    def _stage_func(self, stage: str) -> ir.PrimFunc:
        """The IR at "tile" or after pass `stage`."""
        for name, func in self.stages if stage in dict(self.stages) else self._all_stages():
            if name == stage:
                return func
        valid = ", ".join(["tile", *PASS_NAMES, *_CODEGEN_STAGES])
        raise ValueError(f"unknown stage {stage!r}; expected one of: {valid}")

    def _parts_source(self, stage: str, kernel_source: bool = False) -> str:
        """Every part's source at `stage` (or its `get_kernel_source`), in launch order."""
        if stage not in _CODEGEN_STAGES and not kernel_source:
            return format_func(dataclasses.replace(self.func, parts=[p._stage_func(stage) for p in self._parts]))
        mark = _COMMENT.get("gluon" if kernel_source else stage, "//")
        return "\n".join(f"{mark} kernel {i} of {len(self._parts)}: {part.func.name}\n"
                         + (part.get_kernel_source() if kernel_source else part.get_source(stage))
                         for i, part in enumerate(self._parts))

    def _all_stages(self) -> list:
        """The stages of the whole pass list: `self.stages`, or, when the chosen backends start
        earlier, the rest run once for inspection."""
        if len(self.stages) == len(PASS_NAMES) + 1:
            return self.stages
        if self._inspected_stages is None:
            with switches.overridden(transform.schedule_overrides(self.pass_configs)):
                self._inspected_stages = run_passes(self.stages[0][1], self.plan_target)
        return self._inspected_stages

    def get_profiler(self, tensor_supply_type=None):
        """TileLang's profiler: `assert_allclose(ref_prog)`, `do_bench()`, `run_once()`."""
        from tritile.runtime.profiler import Profiler, TensorSupplyType

        return Profiler(self, tensor_supply_type or TensorSupplyType.Auto)

    def get_kernel_source(self, kernel_only: bool = True) -> str:
        """The generated source of the chosen backend (TileLang's name for the device kernel's source)."""
        if self._parts:
            return self._parts_source("gluon", kernel_source=True)
        return self._codegen(self.plan_target).source

    def __repr__(self) -> str:
        return f"JITKernel({self.func.name}, target={self.target})"
