"""CPU-side cost of a warm tritile call, without the GPU launch itself (runs on a CPU-only machine).

Times, with `time.perf_counter` over many iterations, the host path of a small fp16 GEMM
(examples/gemm.py, M=N=K=128, the H100 tile config) compiled for sm_90 through Gluon/Triton:
* `kernel(a, b)`        - a compiled `JITKernel` (`matmul.compile(...)`, the lazy style's object);
* `matmul(a, b, ...)`   - the eager `@tritile.jit` call (specialisation key + cache lookup first);
and a breakdown of the pieces: argument checks + output allocation (`ArgumentBinder`: the
remembered path a warm call takes, and the full checks of a first call of a kind), the output
allocation alone, `GluonKernel.launch_bound` (alignment check, the generated `tritile_launch`,
the launcher) and the launcher alone (`tritile.runtime.launcher.DirectLaunch` with its
descriptors remembered).

Then the torch operators the torch.compile backend calls (issue #18), each a warm call of
`torch.ops.tritile.<op>.default` as eager code makes it, and of its twin without the autograd
formula, `torch.ops.tritile.<op>_compiled.default`, as a compiled graph makes it, on the decode
step's shapes (bench/torch_compile_h100.py: batch 64, one token; the attention's key cache
shortened to 256, which the host path does not read): `mm` 64x1024 @ 1024x1024, `bmm` 16 x
(64x64 @ 64x64), `linear` with bias and GELU (x [64, 1, 1024], weight (4096, 1024)), the
`attention` forward (q [64, 16, 1, 64], k, v [64, 16, 256, 64]).  The operators pick their
tiles by the tensors' device type, which stays "cpu" here: the CPU tile configs, compiled for
sm_90 (the host path is the same code).

Only Triton's C launch (which needs a GPU) is a no-op, and descriptors are "encoded" without
the driver; CPU tensors stand in for CUDA ones (`Tensor.is_cuda` is patched to True, the
interpreter dispatch is turned off and kernels are compiled for sm_90), everything else is the
code a GPU call runs.
Run: ``python bench/host_overhead.py [--iters N]``.

With ``--gpu`` (a CUDA machine) nothing is patched: the same operator calls on CUDA tensors (the
CUDA tile configs, the real launch), next to the torch calls they stand in for (`torch.mm`,
`torch.bmm`, `F.linear` + `F.gelu`, `F.scaled_dot_product_attention`), and `mm_compiled`'s
pieces (the remembered call's lookup, the prepared kernel call, the output's `torch.empty`, the
launcher alone), each timed as host time per call over back-to-back calls (the queue drained
before each run; the kernels, 8-16 µs, keep up with the host, so the loop measures the host);
``--out FILE`` writes them as JSON:
``PYTHONPATH=$PWD python bench/host_overhead.py --gpu --out bench/results/host_overhead_ops_h100.json``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tritile  # noqa: E402
import tritile.language as T  # noqa: E402
import tritile.ops.attention  # noqa: E402,F401 - registers torch.ops.tritile.attention
import tritile.ops.linear  # noqa: E402,F401 - registers torch.ops.tritile.linear
from examples.gemm import matmul, tile_config  # noqa: E402
from tritile.runtime import launcher  # noqa: E402
from tritile.runtime.kernel import JITKernel  # noqa: E402
from tritile.runtime.launcher import DirectLaunch  # noqa: E402
from tritile.runtime.target import parse_target  # noqa: E402


class _NotLaunched:
    """Stands in for Triton's `CompiledKernel` (what `DirectLaunch` reads of it)."""

    function = 0
    packed_metadata = (4, 1, 0)
    metadata = None


def _launcher_without_gpu(compiled, descriptors, names):
    """`DirectLaunch` with the C launch a no-op and descriptors "encoded" without the driver
    (stands in for `launcher.kernel_launcher`)."""
    return DirectLaunch(_NotLaunched(), descriptors, names, c_launch=lambda *args: None,
                        encode=lambda operand, index: [object(), *operand[1], *operand[2]],
                        current_stream=lambda: 0, fallback=None)


def _pretend_cuda() -> None:
    """CPU tensors run the sm_90 Gluon kernels' host path, every launcher a no-op one."""
    torch.Tensor.is_cuda = property(lambda self: True)  # CPU tensors pass the Gluon launcher's check
    JITKernel._interprets = lambda self, device_kind: False  # dispatch to the Gluon kernel anyway
    sm90 = parse_target("cuda:90")
    JITKernel._device_target = lambda self: sm90  # what "auto" resolves to on an H100
    launcher.kernel_launcher = _launcher_without_gpu


def per_call_us(fn, iters: int, repeats: int = 40, drain=None) -> float:
    """The best over `repeats` runs of `iters` calls: a shared machine's noise only ever adds time,
    and many short runs find a quiet moment where a few long ones may not.  `drain` (GPU: a
    synchronize) runs before each run, untimed."""
    for _ in range(min(200, iters)):
        fn()
    best = float("inf")
    for _ in range(repeats):
        if drain is not None:
            drain()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - start) / iters * 1e6)
    return best


def _captured_launch(gluon, tensors, dims):
    """The (grid, tensors, TMA operands, dims) the generated `tritile_launch` passes on."""
    captured = []
    gluon._host_launch(lambda *launch_args: captured.append(launch_args), *tensors,
                       *[dims[v] for v in gluon.func.dynamic_vars])
    return captured[0]


def _kernel_rows(n: int) -> list:
    """The examples/gemm.py kernel's call, and its pieces."""
    config = tile_config("cuda", n, n, n)
    kernel = matmul.compile(M=n, N=n, K=n, dtype=T.float16, target="cuda:90", **config)
    a = torch.randn(n, n, dtype=torch.float16)
    b = torch.randn(n, n, dtype=torch.float16)
    eager = tritile.jit(target="cuda:90")(matmul.fn)  # the eager call, dispatching to sm_90 code here
    kernel(a, b)  # compiles for sm_90 (no GPU needed) and makes the launcher
    gluon = kernel._device_kernel
    launch = gluon._launcher
    tensors, dims = kernel._bind((a, b))[:2]
    grid, kernel_tensors, operands, dim_args = _captured_launch(gluon, tensors, dims)
    rows = [
        ("kernel(a, b)  [compiled JITKernel, total]", lambda: kernel(a, b)),
        ("matmul(a, b, **cfg)  [eager jit, total]", lambda: eager(a, b, dtype=T.float16, **config)),
        ("  argument checks + output allocation (warm: remembered kind)", lambda: kernel._bind((a, b))),
        ("  argument checks + output allocation (first call of a kind)", lambda: kernel._bind._bind_checked((a, b))),
        ("  output allocation alone (torch.empty)", lambda: torch.empty((n, n), dtype=torch.float16)),
        ("  GluonKernel.launch_bound (alignment, grid, TMA operands, launcher)",
         lambda: gluon.launch_bound(tensors, dims)),
        (f"  DirectLaunch alone ({len(operands)} remembered descriptors, C launch a no-op)",
         lambda: launch(grid, kernel_tensors, operands, dim_args)),
    ]
    return rows


def _operator_rows(device: str = "cpu", with_torch: bool = False) -> list:
    """The torch operators on the decode step's shapes (see the module docstring); `with_torch`:
    the torch calls they stand in for too."""
    def randn(*shape):
        return torch.randn(*shape, dtype=torch.float16, device=device)

    a, b = randn(64, 1024), randn(1024, 1024)
    batch_a, batch_b = randn(16, 64, 64), randn(16, 64, 64)
    x, weight, bias = randn(64, 1, 1024), randn(4096, 1024), randn(4096)
    q, k, v = randn(64, 16, 1, 64), randn(64, 16, 256, 64), randn(64, 16, 256, 64)
    ops = torch.ops.tritile
    calls = [
        ("mm", "64x1024 @ 1024x1024", (a, b)),
        ("bmm", "16 x 64x64 @ 64x64", (batch_a, batch_b)),
        ("linear", "[64, 1, 1024] x (4096, 1024) + bias, gelu", (x, weight, bias, None, "gelu", False)),
        ("attention", "q [64, 16, 1, 64], k, v [64, 16, 256, 64]", (q, k, v, False, None)),
    ]
    # each operator as eager code calls it, and its twin without the autograd formula, which a
    # compiled graph calls (inductor's generated code: `torch.ops.tritile.mm_compiled.default`)
    rows = [(f"torch.ops.tritile.{name}{suffix}  {what}",
             lambda op=getattr(ops, name + suffix).default, args=args: op(*args))
            for suffix in ("", "_compiled") for name, what, args in calls]
    if with_torch:
        F = torch.nn.functional
        rows += [("torch.mm", lambda: torch.mm(a, b)),
                 ("torch.bmm", lambda: torch.bmm(batch_a, batch_b)),
                 ("F.linear (+ bias), F.gelu", lambda: F.gelu(F.linear(x, weight, bias))),
                 ("F.linear (+ bias) alone", lambda: F.linear(x, weight, bias)),
                 ("F.scaled_dot_product_attention", lambda: F.scaled_dot_product_attention(q, k, v))]
    return rows


def _mm_piece_rows(device: str = "cuda") -> list:
    """`tritile.mm_compiled`'s warm call at 64x1024 @ 1024x1024 on `device`'s tensors, piece by piece:
    the remembered call's lookup, the prepared kernel call (output + launch), the output's
    allocation and the launcher alone."""
    from tritile.ops import matmul as tritile_matmul
    from tritile.ops.signatures import signature

    a = torch.randn(64, 1024, dtype=torch.float16, device=device)
    b = torch.randn(1024, 1024, dtype=torch.float16, device=device)
    out = torch.ops.tritile.mm_compiled.default(a, b)
    prepared = tritile_matmul._gemms[tritile_matmul.matmul, signature(a, b)][0]
    # a tree before session 21 remembers the JITKernel itself (a same-machine baseline: this script
    # copied into that tree)
    gluon = getattr(prepared, "kernel", prepared)._device_kernel
    launch_args = _captured_launch(gluon, [a, b, out], {})
    return [("  mm_compiled: signature + remembered-call lookup",
             lambda: tritile_matmul._gemms[tritile_matmul.matmul, signature(a, b)]),
            ("  mm_compiled: the prepared kernel call (output + launch)", lambda: prepared(a, b)),
            ("  mm_compiled: torch.empty of the output",
             lambda: torch.empty((64, 1024), dtype=a.dtype, device=a.device)),
            ("  mm_compiled: the launcher alone (DirectLaunch)", lambda: gluon._launcher(*launch_args))]


def _gpu_main(opts) -> None:
    """The operators and their torch counterparts on CUDA tensors (see the module docstring)."""
    import json

    print(f"host µs per call on {torch.cuda.get_device_name()} (fp16, CUDA tile configs, back-to-back calls), "
          f"best of 40 x {opts.iters}:")
    results = {}
    for label, fn in _operator_rows("cuda", with_torch=True) + _mm_piece_rows():
        results[label] = per_call_us(fn, opts.iters, drain=torch.cuda.synchronize)
        print(f"{results[label]:8.2f}  {label}")
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "iters": opts.iters, "us_per_call": results}, f,
                      indent=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=500)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--gpu", action="store_true", help="the operators on CUDA tensors, nothing patched")
    parser.add_argument("--out", help="with --gpu: write the timings to this JSON file")
    opts = parser.parse_args()
    if opts.gpu:
        return _gpu_main(opts)
    n = opts.size
    _pretend_cuda()
    rows = _kernel_rows(n)
    results = {label: per_call_us(fn, opts.iters) for label, fn in rows}
    total_kernel = results[rows[0][0]]
    results["  jit layer (eager total - kernel total): signature, T.const key, cache"] = (
        results[rows[1][0]] - total_kernel)
    print(f"host µs per call, {n}x{n}x{n} fp16 GEMM, launch replaced by a no-op, best of 40 x {opts.iters}:")
    for label, us in results.items():
        print(f"{us:8.2f}  {label}")
    print(f"host µs per call of the torch operators (fp16, CPU tile configs), best of 40 x {opts.iters}:")
    for label, fn in _operator_rows():
        print(f"{per_call_us(fn, opts.iters):8.2f}  {label}")


if __name__ == "__main__":
    main()
