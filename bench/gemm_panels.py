"""The GEMM's launch-order panel (`T.use_swizzle(panel_size=...)` in tritile/ops/matmul.py)
against cuBLAS: which panel height keeps A's and B's tiles in L2 best at 4096^3 and 8192^3?

Every kernel is examples/gemm.py's (the example's tile config) with only `panel_size` changed;
each result is checked against torch first.  Three rounds, the order rotating each round,
`do_bench(warmup=50, rep=300, median)`; prints the per-round TFLOP/s and the median.
Run: PYTHONPATH=$PWD python bench/gemm_panels.py
"""
from __future__ import annotations

import os
import statistics
import sys

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import tritile.language as T  # noqa: E402
from tritile.ops.matmul import matmul, tile_config  # noqa: E402

PANELS = (4, 8, 10, 16, 32)
CASES = [(4096, torch.float16), (4096, torch.bfloat16), (8192, torch.float16)]


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for n, dtype in CASES:
        a, b = (torch.randn(n, n, device="cuda", dtype=dtype) for _ in range(2))
        ref = a.float() @ b.float()
        candidates = {"cublas": lambda: torch.matmul(a, b)}
        tt = T.bfloat16 if dtype == torch.bfloat16 else T.float16
        for panel in PANELS:
            kernel = matmul.compile(M=n, N=n, K=n, dtype=tt, panel_size=panel, **tile_config("cuda", n, n, n))
            out = kernel(a, b)
            err = float((out.double() - ref.double()).norm() / ref.double().norm())
            assert err < 1e-2, f"panel {panel}: rel err {err}"
            candidates[f"panel {panel}"] = lambda kernel=kernel: kernel(a, b)
        names = list(candidates)
        results = {name: [] for name in names}
        for round_index in range(3):
            shift = round_index * len(names) // 3
            for name in names[shift:] + names[:shift]:
                ms = do_bench(candidates[name], warmup=50, rep=300, return_mode="median")
                results[name].append(2.0 * n ** 3 / (ms * 1e-3) / 1e12)
        print(f"\n{n}^3 {str(dtype).replace('torch.', '')}: TFLOP/s per round, median")
        for name, values in results.items():
            print(f"  {name:10s} {' / '.join(f'{x:6.1f}' for x in values)}   {statistics.median(values):6.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
