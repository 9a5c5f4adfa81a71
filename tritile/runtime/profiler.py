"""`kernel.get_profiler()`: TileLang's Profiler surface for checking and timing a kernel.

`Profiler(kernel, tensor_supply_type)` makes inputs for the kernel's non-output parameters
from their shapes and dtypes (random normal floats, random small integers; laid out with a
`T.StridedTensor`'s strides; `T.dynamic` dims or strides need `input_tensors`), on CUDA when a GPU is present, else on the CPU (the interpreter).
`assert_allclose(ref_prog)` runs the kernel and `ref_prog(*inputs)` and compares every output
with TileLang's mismatch budget; `do_bench(func=None)` times the kernel (or `func`) in ms with
`triton.testing.do_bench` on CUDA and a wall clock on CPU.
"""
from __future__ import annotations

import enum
import time

import torch

from tritile.ir import nodes as ir
from tritile.runtime.arguments import laid_out


class TensorSupplyType(enum.Enum):
    Auto = "auto"
    Normal = "normal"
    Uniform = "uniform"
    Integer = "integer"
    Randn = "randn"
    Zero = "zero"
    One = "one"


def _supply(buffer: ir.Buffer, kind: TensorSupplyType, device: str, what: str = "get_profiler") -> torch.Tensor:
    return laid_out(buffer, _values(buffer, kind, device), what)


def supply_inputs(kernel, kind: TensorSupplyType, device, what: str = "get_profiler") -> list:
    """Tensors of `kind` for `kernel`'s parameters other than its outputs (`out_idx`), in order:
    the inputs the profiler and the autotuner make."""
    outputs = set(kernel.out_idx)
    return [_supply(p, kind, device, what) for i, p in enumerate(kernel.params) if i not in outputs]


def _values(buffer: ir.Buffer, kind: TensorSupplyType, device: str) -> torch.Tensor:
    shape = []
    for dim in buffer.shape:
        if not isinstance(dim, int):
            raise ValueError(f"parameter {buffer.name!r} has the runtime dimension {dim!r}: pass input_tensors")
        shape.append(dim)
    dtype, ir_dtype = buffer.dtype.torch, buffer.dtype
    if kind is TensorSupplyType.Zero:
        return torch.zeros(shape, dtype=dtype, device=device)
    if kind is TensorSupplyType.One:
        return torch.ones(shape, dtype=dtype, device=device)
    # TileLang's choices (tilelang/utils/tensor.py): its tests' tolerances are set for them - a
    # float16-accumulated GEMM over randn inputs misses them where uniform(-1, 1) inputs pass
    if kind is TensorSupplyType.Auto and dtype in (torch.float16, torch.float32, torch.bfloat16):
        return torch.empty(shape, device=device, dtype=dtype).uniform_(-1.0, 1.0)
    if kind in (TensorSupplyType.Auto, TensorSupplyType.Integer):
        if ir_dtype.is_float and ir_dtype.bits == 8:
            return torch.randint(-128, 128, shape, device=device, dtype=torch.int8).to(dtype)
        if ir_dtype.name == "bool":
            return torch.randint(0, 2, shape, device=device).to(dtype)
        if ir_dtype.name.startswith("uint"):
            return torch.randint(0, 3, shape, device=device).to(dtype)
        return torch.randint(-2, 3, shape, device=device).to(dtype)
    if dtype == torch.int8 and kind in (TensorSupplyType.Uniform, TensorSupplyType.Normal):
        return torch.ones(shape, dtype=dtype, device=device)
    if kind is TensorSupplyType.Uniform:
        return torch.empty(shape, device=device, dtype=torch.float32).uniform_(-1.0, 1.0).to(dtype)
    if kind is TensorSupplyType.Normal:  # TileLang's normal_(-1.0, 1.0): mean -1
        return torch.empty(shape, device=device, dtype=torch.float32).normal_(-1.0, 1.0).to(dtype)
    return torch.randn(shape, device=device).to(dtype)


class Profiler:
    def __init__(self, kernel, tensor_supply_type: TensorSupplyType = TensorSupplyType.Auto):
        self.kernel = kernel
        self.supply_type = tensor_supply_type
        self.device = "cuda" if torch.cuda.is_available() else "cpu"

    @property
    def func(self):
        """TileLang's `profiler.func` (its adapter): the kernel itself, called with the inputs
        (`out_idx` parameters left out, returned) as `kernel(...)` is."""
        return self.kernel

    def __call__(self, *args, **kwargs):
        return self.func(*args, **kwargs)

    def _inputs(self) -> list:
        return supply_inputs(self.kernel, self.supply_type, self.device)

    def run_once(self, func=None, input_tensors=None):
        """TileLang's: `func` (default the kernel) once on the supplied inputs (or `input_tensors`)."""
        return (func or self.kernel)(*(input_tensors if input_tensors is not None else self._inputs()))

    def assert_allclose(self, reference_program, input_tensors=None, atol: float = 1e-2, rtol: float = 1e-2,
                        max_mismatched_ratio: float = 0.01):
        """Outputs of the kernel and of `reference_program(*inputs)` agree: at most
        `max_mismatched_ratio` of the elements of each output may differ by more than
        atol + rtol * |reference|."""
        inputs = input_tensors if input_tensors is not None else self._inputs()
        got = self.kernel(*inputs)
        expected = reference_program(*inputs)
        got = list(got) if isinstance(got, (list, tuple)) else [got]
        expected = list(expected) if isinstance(expected, (list, tuple)) else [expected]
        if len(got) != len(expected):
            raise AssertionError(f"the kernel returns {len(got)} outputs, the reference {len(expected)}")
        for index, (out, ref) in enumerate(zip(got, expected)):
            out, ref = out.double(), ref.to(out.device).double()
            if out.shape != ref.shape:
                raise AssertionError(f"output {index}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
            bad = ~((out - ref).abs() <= atol + rtol * ref.abs())
            ratio = bad.sum().item() / max(1, bad.numel())
            if ratio > max_mismatched_ratio:
                worst = (out - ref).abs().max().item()
                raise AssertionError(f"output {index}: {ratio:.2%} of the elements mismatch (allowed "
                                     f"{max_mismatched_ratio:.2%}), max abs difference {worst:.4g}")

    def do_bench(self, func=None, warmup: int = 25, rep: int = 100, input_tensors=None,
                 return_mode: str = "mean", backend: str = "event", **_unused) -> float:
        """Milliseconds per call of the kernel (or of `func(*inputs)`), see `do_bench`."""
        inputs = input_tensors if input_tensors is not None else self._inputs()
        fn = (lambda: func(*inputs)) if func is not None else (lambda: self.kernel(*inputs))
        return do_bench(fn, warmup=warmup, rep=rep, return_mode=return_mode, backend=backend)


BENCH_BACKENDS = ("event", "cupti", "cudagraph")


def do_bench(fn, warmup: float = 25, rep: float = 100, _n_warmup: int = 0, _n_repeat: int = 0, quantiles=None,
             fast_flush: bool = True, backend: str = "event", return_mode: str = "mean"):
    """TileLang's `tilelang.profiler.do_bench`: milliseconds per call of `fn` - on a GPU by
    `triton.testing.do_bench` (CUDA events over `rep` ms after `warmup` ms, the L2 flushed between
    calls; every `backend` TileLang names is timed that way), on a CPU machine by a wall clock over
    three calls after one.  `quantiles` / `return_mode` ("mean", "median", "min", "max", "all") as
    in Triton; `_n_warmup` / `_n_repeat` (call counts) are accepted and the times rule."""
    if backend not in BENCH_BACKENDS:
        raise ValueError(f"do_bench: backend must be one of {BENCH_BACKENDS}, got {backend!r}")
    if torch.cuda.is_available():
        from triton.testing import do_bench as triton_do_bench

        return triton_do_bench(fn, warmup=warmup, rep=rep, quantiles=quantiles, return_mode=return_mode)
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    summary = {"mean": sum(times) / len(times), "median": sorted(times)[1], "min": min(times), "max": max(times)}
    return times if return_mode == "all" else summary[return_mode]
