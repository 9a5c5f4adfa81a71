"""Does the 4096^3 fp16 GEMM's figure depend on what ran before it in the process?  Times
tritile's GEMM first thing in a fresh process, then cuBLAS and Triton's best config, then
tritile again, with bench_h100.py's timing (do_bench median, warm-up 50 ms, 300 ms).
Run from the repo root: PYTHONPATH=$PWD python bench/gemm_order_check.py"""
import os
import sys

import torch

sys.path[:0] = [os.path.join(os.path.dirname(__file__), ".."), os.path.dirname(__file__)]

from bench_h100 import bench, tflops  # noqa: E402
from examples.gemm import tritile_matmul  # noqa: E402
from triton_gemm import CONFIGS, triton_matmul  # noqa: E402

n = int(os.environ.get("SIZE", "4096"))
a, b = (torch.randn(n, n, device="cuda", dtype=torch.float16) for _ in range(2))
flops = 2.0 * n ** 3
tritile_matmul(a, b)
steps = [("tritile (first)", lambda: tritile_matmul(a, b)), ("cublas", lambda: torch.matmul(a, b))]
steps += [(f"triton {cfg}", lambda cfg=cfg: triton_matmul(a, b, cfg)) for cfg in CONFIGS[:2]]
steps += [("tritile (after)", lambda: tritile_matmul(a, b)), ("cublas (after)", lambda: torch.matmul(a, b))]
for label, fn in steps:
    fn()
    print(f"{label:32s} {tflops(flops, bench(fn)):7.1f} TFLOP/s", flush=True)
