"""Code generators from tile IR to a backend's source, and the one table that chooses among them.

Two backends, each a package with the same parts (a rule table per IR node kind, an emitter,
a kernel module, `compile_kernel(func, target)`):

* ``gluon`` (`codegen/gluon/`): the final IR of the whole pass list -> generated ``@gluon.jit``
  (TTGIR level: tritile's own pipelining, layouts, mbarriers, warp specialization); NVIDIA only.
* ``triton`` (`codegen/triton/`): the IR after `accumulator_init` (the passes before it included),
  before any pipeline pass -> generated ``@triton.jit`` (TTIR level: Triton's own pipeliner and layouts); NVIDIA and AMD,
  and, on CPU tensors, Triton's interpreter.

`BACKENDS` says what each needs and takes; `AUTO` which backends ``backend="auto"`` tries, in
order, per target kind (Gluon on NVIDIA up to Hopper, then triton; triton on AMD).  `compile_kernel(stages, target, names)` returns the first backend's
kernel that compiles, or one `CompileError` quoting what each backend refused.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Optional

from tritile.errors import CompileError


@dataclass(frozen=True)
class Backend:
    name: str
    package: str  # defines compile_kernel(func, target)
    start_stage: Optional[str]  # the stage of tritile/lowering's pass list it starts from (None: the last)
    target_kinds: tuple  # target kinds it compiles for
    lazy: bool = False  # its compile_kernel only generates; `.compile()` runs Triton
    auto_max_arch: Optional[int] = None  # auto skips it on newer CUDA archs than this


BACKENDS = {
    # its instruction selection knows Ampere and Hopper (mma_v2, wgmma, TMA): on Blackwell auto
    # takes Triton's tcgen05 path (backend="gluon" still compiles there, through mma_v2)
    "gluon": Backend("gluon", "tritile.codegen.gluon", None, ("cuda",), auto_max_arch=90),
    "triton": Backend("triton", "tritile.codegen.triton", "accumulator_init", ("cuda", "hip"), lazy=True),
}
AUTO = {"cuda": ("gluon", "triton"), "hip": ("triton",)}
CHOICES = ("auto", *BACKENDS)


def backend_name(backend=None) -> str:
    """`backend` ("gluon" | "triton" | "auto"), or when None `TRITILE_BACKEND`, default "auto"."""
    name = backend if backend is not None else os.environ.get("TRITILE_BACKEND", "") or "auto"
    if name not in CHOICES:
        raise ValueError(f"unknown backend {name!r}; use one of {', '.join(CHOICES)}")
    return name


def candidates(backend: str, target) -> list:
    """The backends `backend` tries for `target` (a GPU target), in order."""
    if backend == "auto":
        names = [n for n in AUTO.get(target.kind, ())
                 if BACKENDS[n].auto_max_arch is None or target.arch <= BACKENDS[n].auto_max_arch]
    else:
        names = [backend]
    chosen = [BACKENDS[n] for n in names if target.kind in BACKENDS[n].target_kinds]
    if not chosen:
        raise ValueError(f"backend {backend!r} does not compile for {target}; the triton backend compiles for "
                         f"cuda and hip targets, the gluon backend for cuda")
    return chosen


def last_stage(backends: list, pass_names: list) -> Optional[str]:
    """The pass after which the pass list may stop: the latest start stage of `backends`."""
    if any(b.start_stage is None for b in backends):
        return None
    return max((b.start_stage for b in backends), key=pass_names.index)


def stage_of(backend: Backend, stages: list):
    """The PrimFunc `backend` starts from, out of `stages` ([(name, func)] of run_passes)."""
    if backend.start_stage is None:
        return stages[-1][1]
    return dict(stages)[backend.start_stage]


def compile_kernel(stages: list, target, backends: list):
    """The first of `backends` that compiles the program for `target`; a `CompileError` naming
    what each refused when none does."""
    refusals = []
    for backend in backends:
        compile_for = importlib.import_module(backend.package).compile_kernel
        try:
            kernel = compile_for(stage_of(backend, stages), target)
            return kernel.compile() if backend.lazy else kernel
        except CompileError as err:
            if len(backends) == 1:
                raise
            refusals.append((backend.name, err))
    func = stages[-1][1]
    detail = "\n".join(f"  {name}: {err}".replace("\n", "\n    ") for name, err in refusals)
    raise CompileError(f"no backend compiles kernel {func.name!r} for {target}:\n{detail}", refusals[0][1].loc)
