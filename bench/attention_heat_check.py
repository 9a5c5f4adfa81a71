"""Does attention's side-by-side figure depend on how hot the GPU is?  In one process, times
tritile's causal (and non-causal) attention and cuDNN's, fresh; then after `HEAT_S` seconds
(default 60) of back-to-back 8192^3 GEMMs, as bench_h100.py's attention section runs after its
GEMM section; then once more.  bench_h100.py's timing (do_bench median, 50 ms warm-up, 300 ms).
Run from the repo root: PYTHONPATH=$PWD python bench/attention_heat_check.py"""
import os
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

sys.path[:0] = [os.path.join(os.path.dirname(__file__), ".."), os.path.dirname(__file__)]

from bench_h100 import bench, tflops  # noqa: E402
from child_runs import attention_inputs, attn_flops  # noqa: E402
from examples.flash_attention import tritile_attention  # noqa: E402


def cudnn(q, k, v, causal):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return sdpa(q, k, v, is_causal=causal)


def heat(seconds: float):
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.float16) for _ in range(2))
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            torch.matmul(a, b)
        torch.cuda.synchronize()


def main():
    q, k, v = attention_inputs(4, 32, 4096, 128)
    for causal in (True, False):
        tritile_attention(q, k, v, causal)
        cudnn(q, k, v, causal)
    for phase in ("fresh", "after GEMM load", "again"):
        if phase == "after GEMM load":
            heat(float(os.environ.get("HEAT_S", "60")))
        for causal in (True, False):
            flops = attn_flops(4, 32, 4096, 128, causal)
            mine = tflops(flops, bench(lambda: tritile_attention(q, k, v, causal)))
            lib = tflops(flops, bench(lambda: cudnn(q, k, v, causal)))
            print(f"{phase:16s} causal={int(causal)}  tritile {mine:6.1f}  cuDNN {lib:6.1f}  ratio {mine / lib:.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
