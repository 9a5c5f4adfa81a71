"""GEMM tile-config sweep of examples/gemm.py's T-language kernel against cuBLAS, on one GPU.

Run on the GPU machine from the repo root:  PYTHONPATH=$PWD python bench/gemm_variants.py [--sizes 4096,8192] [--dtypes float16,bfloat16] [--only 128x256]
Every variant is checked against a float32 torch reference (relative error <= 1e-2) before it
is timed; a failing variant is reported and skipped.  `copy_first` is the same program with
the planned schedule spelled out by the user (`order=[0, 1, 2], stage=[0, 0, D]`), which keeps
the producers-first emission: the A/B of pipeline_injection's consumers-first steady state.
Prints one compact table (TFLOP/s = 2MNK / median time of triton.testing.do_bench).
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import tritile  # noqa: E402
import tritile.language as T  # noqa: E402
from examples.gemm import matmul  # noqa: E402


@tritile.jit
def matmul_copy_first(A, B, block_M: int = 128, block_N: int = 128, block_K: int = 64, num_stages: int = 3,
                      threads: int = 128, dtype=T.float16, accum_dtype=T.float32):
    M, N, K = T.const("M, N, K")
    A: T.Tensor[[M, K], dtype]
    B: T.Tensor[[K, N], dtype]
    C = T.empty((M, N), dtype)
    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
        A_shared = T.alloc_shared((block_M, block_K), dtype)
        B_shared = T.alloc_shared((block_K, block_N), dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
        T.use_swizzle(panel_size=10)
        T.clear(C_local)
        for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages, order=[0, 1, 2],
                             stage=[0, 0, num_stages - 1]):
            T.copy(A[by * block_M, k * block_K], A_shared)
            T.copy(B[k * block_K, bx * block_N], B_shared)
            T.gemm(A_shared, B_shared, C_local)
        T.copy(C_local, C[by * block_M, bx * block_N])
    return C


VARIANTS = {
    "copy_first 128x128x64 s3 w4": (matmul_copy_first, dict(block_M=128, block_N=128, block_K=64, num_stages=3, threads=128)),
    "128x128x64 s3 w4": (matmul, dict(block_M=128, block_N=128, block_K=64, num_stages=3, threads=128)),
    "128x256x64 s3 w8": (matmul, dict(block_M=128, block_N=256, block_K=64, num_stages=3, threads=256)),
    "128x256x64 s4 w8": (matmul, dict(block_M=128, block_N=256, block_K=64, num_stages=4, threads=256)),
    "256x128x64 s3 w8": (matmul, dict(block_M=256, block_N=128, block_K=64, num_stages=3, threads=256)),
}


def tflops(M, N, K, ms):
    return 2.0 * M * N * K / (ms * 1e-3) / 1e12


def bench(fn):
    return do_bench(fn, warmup=50, rep=300, return_mode="median")


def attention():
    """The issue-5 attention shapes: tritile's example kernel vs SDPA's cuDNN back-end."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from examples.flash_attention import tritile_attention

    print(f"{'B x H x S x D':18} {'causal':6} {'cuDNN':>7} {'tritile':>8} {'ratio':>6}  rel_err")
    for B, H, S, D, causal in ((4, 32, 4096, 128, False), (4, 32, 4096, 128, True), (16, 16, 1024, 64, False)):
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
        flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ref = sdpa(q, k, v, is_causal=causal)
            cudnn = flops / bench(lambda: sdpa(q, k, v, is_causal=causal)) / 1e9
        try:
            out = tritile_attention(q, k, v, causal)
            err = float((out.double() - ref.double()).norm() / ref.double().norm())
            ours = flops / bench(lambda: tritile_attention(q, k, v, causal)) / 1e9 if err < 1e-2 else 0.0
        except Exception as e:  # report and go on
            traceback.print_exc()
            err, ours = float("nan"), 0.0
        print(f"{B}x{H}x{S}x{D:<8} {str(causal):6} {cudnn:7.1f} {ours:8.1f} {ours / cudnn:6.3f}  {err:.1e}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="4096,8192")
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--only", default="", help="comma-separated substrings of variant names")
    parser.add_argument("--attention", action="store_true", help="also time examples/flash_attention.py vs SDPA")
    args = parser.parse_args()
    if args.attention:
        attention()
    rows = []
    for dtype_name in args.dtypes.split(","):
        torch_dtype = getattr(torch, dtype_name)
        t_dtype = T.bfloat16 if dtype_name == "bfloat16" else T.float16
        for size in (int(s) for s in args.sizes.split(",")):
            a = torch.randn(size, size, device="cuda", dtype=torch_dtype)
            b = torch.randn(size, size, device="cuda", dtype=torch_dtype)
            ref = a.float() @ b.float()
            rows.append((dtype_name, size, "cuBLAS", tflops(size, size, size, bench(lambda: a @ b)), 0.0))
            for name, (kernel, cfg) in VARIANTS.items():
                if args.only and not any(s in name for s in args.only.split(",")):
                    continue
                try:
                    out = kernel(a, b, dtype=t_dtype, **cfg)
                    err = float((out.double() - ref.double()).norm() / ref.double().norm())
                    if err > 1e-2:
                        raise AssertionError(f"rel err {err:.3g}")
                    ms = bench(lambda: kernel(a, b, dtype=t_dtype, **cfg))
                    rows.append((dtype_name, size, name, tflops(size, size, size, ms), err))
                except Exception as e:  # report and go on
                    traceback.print_exc()
                    rows.append((dtype_name, size, name + f" FAILED {type(e).__name__}: {str(e)[:80]}", 0.0, 0.0))
    print(f"\n{'dtype':9} {'size':>5}  {'variant':34} {'TFLOP/s':>8} {'vs cuBLAS':>9}  rel_err")
    best = {}
    for dtype_name, size, name, tf, err in rows:
        if name == "cuBLAS":
            best[(dtype_name, size)] = tf
        ratio = tf / best[(dtype_name, size)]
        print(f"{dtype_name:9} {size:5d}  {name:34} {tf:8.1f} {ratio:9.3f}  {err:.1e}")
    print(torch.cuda.get_device_name(), torch.__version__)


if __name__ == "__main__":
    main()
