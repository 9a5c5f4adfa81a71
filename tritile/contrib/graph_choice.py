"""Which compiled graph runs a model's step: the one with tritile's ops, or inductor's own.

`gemm_choice` hands an op to tritile where tritile's kernel is faster alone; the step does not
promise that: an op timed alone does not see the step's fusions (a residual add tritile's linear
takes in its epilogue is one inductor would have folded into the next LayerNorm anyway), its L2
contents or clocks.  On the H100 a train step whose ops were each chosen >= 3 % faster came out
0.7-1.5 % slower than inductor's (bench/NOTES.md, sessions 19-20).  So on CUDA the backend
compiles each graph twice, with tritile's rewrites and without them, and `GraphChoice` times the
two on the graph's first call and keeps the faster for every later call.

Contract:
* Timed: the forward and, when grad mode is on and an output requires grad, the backward
  (`torch.autograd.grad` with random output gradients, so no `.grad` is written), `ROUNDS`
  alternating samples of each, every sample `calls` steps back to back (at least `SAMPLE_MS` of
  device time); tritile's graph is kept only when its median is at least `MARGIN` below
  inductor's - a tie goes to inductor's own.
* No side effects: the timed runs take copies of the inputs (same sizes and strides), so an
  in-place update of an input inside the graph (a BatchNorm's running statistics, an optimizer
  step) happens once, on the real call; the CPU and CUDA random generators are restored after
  timing, so the real call draws what it would have drawn untimed.
* Not timed, tritile's graph kept: when the rewrites turned out to choose no tritile op (both
  graphs are inductor's), when an input overlaps itself (no copy of the same strides: an
  expanded view), and when the copies would take more than half the device's free memory.
* `GraphChoice.outcome` says what was decided and why, for `explain`.
"""
from __future__ import annotations

import contextlib
import math
import time
from typing import Callable, Optional

import torch
from torch.utils import _pytree as pytree

ROUNDS = 7
MARGIN = 0.99
SAMPLE_MS = 2.0
_MAX_CALLS_PER_SAMPLE = 64


class GraphChoice:
    """A compiled graph's callable that, on its first call, times `tritile_graph` against
    inductor's own (`compile_inductor_graph()`, compiled only when tritile's graph holds a
    tritile op) and then runs the faster one.  `rewrites_chosen(graphs)`: whether tritile's
    graph holds a tritile op, once its first run has compiled `graphs` ATen graphs (forward, and
    backward) - None when it cannot tell (an FX graph cache hit skips the rewrite);
    `on_choice(kept_tritile, why)` is told the outcome."""

    def __init__(self, tritile_graph: Callable, compile_inductor_graph: Callable[[], Callable],
                 rewrites_chosen: Callable[[int], Optional[bool]], on_choice: Callable[[bool, str], None]):
        self._tritile_graph = tritile_graph
        self._compile_inductor_graph = compile_inductor_graph
        self._inductor_graph = None
        self._rewrites_chosen = rewrites_chosen
        self._on_choice = on_choice
        self._chosen = None
        self.outcome = ""

    def __call__(self, *args):
        if self._chosen is None:
            keep_tritile, self.outcome = self._choose(args)
            self._chosen = self._tritile_graph if keep_tritile else self._inductor_graph
            self._on_choice(keep_tritile, self.outcome)
        return self._chosen(*args)

    def _choose(self, args) -> tuple:
        """(whether tritile's graph is kept, why)."""
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        refusal = _copy_refusal(tensors)
        if refusal:
            return True, f"tritile's graph kept untimed: {refusal}"
        with _random_state_restored(tensors):
            copies = [_copy(a) if isinstance(a, torch.Tensor) else a for a in args]
            steps = {"tritile": _Step(self._tritile_graph, copies)}
            steps["tritile"].warm_up()  # compiles the backward: every rewrite has run after it
            if self._rewrites_chosen(1 + steps["tritile"].ran_backward) is False:
                return True, "no op went to tritile: its graph is inductor's"
            self._inductor_graph = self._compile_inductor_graph()
            steps["inductor"] = _Step(self._inductor_graph, copies)
            steps["inductor"].warm_up()
            device = next((t.device for t in tensors if t.device.type == "cuda"), tensors[0].device)
            medians = _alternating_medians(steps, device)
        tritile_ms, inductor_ms = medians["tritile"], medians["inductor"]
        times = f"{tritile_ms:.3f} ms a step against inductor's own {inductor_ms:.3f} ms"
        if tritile_ms <= MARGIN * inductor_ms:
            return True, f"tritile's graph kept: {times}"
        return False, f"inductor's graph kept: tritile's {times} (needs {1 - MARGIN:.0%} less)"


class _Step:
    """One step of a compiled graph on the copies: forward, and backward when the outputs need one."""

    def __init__(self, graph: Callable, inputs: list):
        self._graph, self._inputs = graph, inputs
        self._wrt = [a for a in inputs if isinstance(a, torch.Tensor) and a.requires_grad]
        self._output_grads = None
        self.ran_backward = False

    def warm_up(self) -> None:
        for _ in range(2):  # the first compiles the backward, the second runs warm
            self()

    def __call__(self) -> None:
        outputs = [o for o in pytree.tree_leaves(self._graph(*self._inputs))
                   if isinstance(o, torch.Tensor) and o.requires_grad]
        if not (torch.is_grad_enabled() and outputs and self._wrt):
            return
        if self._output_grads is None:
            self._output_grads = [torch.randn_like(o) for o in outputs]
        self.ran_backward = True
        torch.autograd.grad(outputs, self._wrt, self._output_grads, allow_unused=True)


def _alternating_medians(steps: dict, device: torch.device) -> dict:
    """Median ms a step of each, over ROUNDS samples taken in alternating order."""
    calls = _calls_per_sample(steps["tritile"], device)
    samples = {name: [] for name in steps}
    names = list(steps)
    for round_index in range(ROUNDS):
        for name in names if round_index % 2 == 0 else reversed(names):
            samples[name].append(_sample_ms(steps[name], calls, device) / calls)
    return {name: sorted(times)[len(times) // 2] for name, times in samples.items()}


def _calls_per_sample(step: _Step, device: torch.device) -> int:
    one = _sample_ms(step, 1, device)
    return max(1, min(_MAX_CALLS_PER_SAMPLE, math.ceil(SAMPLE_MS / max(one, 1e-3))))


def _sample_ms(step: _Step, calls: int, device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(calls):
            step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    began = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - began) * 1e3


def _copy_refusal(tensors: list) -> str:
    if not tensors:
        return "the graph has no tensor input"
    for t in tensors:
        if _overlaps(t):
            return f"an input of strides {tuple(t.stride())} overlaps itself: no copy has its strides"
    devices = {t.device for t in tensors if t.device.type == "cuda"}
    for device in devices:
        needed = sum(_span(t) * t.element_size() for t in tensors if t.device == device)
        free, _ = torch.cuda.mem_get_info(device)
        if needed > free // 2:
            return f"copies of the inputs ({needed / 2 ** 30:.1f} GiB) would take over half the free memory"
    return ""


def _overlaps(t: torch.Tensor) -> bool:
    """Whether two elements of `t` may share memory (an expanded view): a copy could not be
    written with its strides."""
    reach = 0  # one past the farthest offset the dims of smaller stride reach
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s != 1):
        if stride <= reach - 1 or stride == 0:
            return True
        reach = max(reach, 1) + stride * (size - 1)
    return False


def _span(t: torch.Tensor) -> int:
    """Elements from `t`'s first to its last (gaps of a sliced view included)."""
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) if t.numel() else 0


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` with its sizes and strides (inductor's graph asserts them), as a leaf
    that requires grad when `t` does."""
    with torch.no_grad():
        storage = torch.empty(_span(t), dtype=t.dtype, device=t.device)
        copy = storage.as_strided(t.shape, t.stride()).copy_(t)
    return copy.requires_grad_(t.requires_grad)


@contextlib.contextmanager
def _random_state_restored(tensors: list):
    cuda_devices = sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})
    cpu_state = torch.get_rng_state()
    cuda_states = [torch.cuda.get_rng_state(d) for d in cuda_devices]
    try:
        yield
    finally:
        torch.set_rng_state(cpu_state)
        for device, state in zip(cuda_devices, cuda_states):
            torch.cuda.set_rng_state(state, device)
