"""FP8 e4m3 GEMM (examples/gemm_fp8.py) against torch._scaled_mm (cuBLASLt), one run (issue #19).

Per-tensor scales, fp16 out, 4096^3 and 8192^3: TFLOP/s of both, and the accuracy of both
against an fp64 product of the same fp8 values (the largest error relative to max |C|, and how
many outputs are off by more than 2 % of max |C| / 1000).  A few tile configs of ours.

    python bench/gemm_fp8_h100.py --out bench/results/gemm_fp8_h100.json
"""
from __future__ import annotations

import argparse
import json

import torch

from timing import load_example, median_ms, save

CONFIGS = [dict(block_M=128, block_N=128, block_K=128, num_stages=3, threads=256, promote_every=4),
           dict(block_M=128, block_N=128, block_K=128, num_stages=4, threads=256, promote_every=4),
           dict(block_M=128, block_N=128, block_K=128, num_stages=4, threads=256, promote_every=8)]


def _accuracy(c, exact) -> dict:
    top = exact.abs().max().item()
    diff = (c.double() - exact).abs()
    return {"max_rel_to_max": round(diff.max().item() / top, 6), "over_2e-5_of_max": int((diff > 2e-5 * top).sum())}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    G = load_example("gemm_fp8")
    rows = []
    for n in (4096, 8192):
        a8, sa = G.quantize(torch.randn(n, n, device="cuda"))
        b8, sb = G.quantize(torch.randn(n, n, device="cuda"))
        exact = (a8.double() @ b8.double().t()) * (sa.double() * sb.double())
        flops = 2 * n ** 3
        cublas = lambda: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float16)  # noqa: E731
        ms = median_ms(cublas)
        row = {"size": n, "cublaslt": {"ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1), **_accuracy(cublas(), exact)},
               "tritile": []}
        scales = torch.stack([sa.float().reshape(()), sb.float().reshape(())])
        for config in CONFIGS:
            kernel = G.gemm_fp8(n, n, n, **config)
            ours = lambda: kernel(a8, b8, scales)  # noqa: E731
            t = median_ms(ours)
            row["tritile"].append({**config, "ms": round(t, 4), "tflops": round(flops / t / 1e9, 1),
                                   "ratio": round(ms / t, 3), **_accuracy(ours(), exact)})
        print(json.dumps(row), flush=True)
        rows.append(row)
        del exact
    save(args.out, rows)


if __name__ == "__main__":
    main()
