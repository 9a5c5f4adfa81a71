"""Run each tritile kernel that misses its issue-5 target once after warm-up, so that Nsight Compute
can profile exactly that launch:

    ncu --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
        -k regex:'matmul|main' --launch-skip 1 --launch-count 1 python3 bench/profile_gaps.py gemm
    ncu ... python3 bench/profile_gaps.py attention

(`gemm`: fp16 4096³ with the example's config, `gemm_small_m`: fp16 128x4096x4096 (its small-M
tiles), `gemm_cublas` / `gemm_small_m_cublas`: torch.matmul on them - its kernel's
name is cuBLAS's, so profile it by launch number: ``--launch-skip 2 --launch-count 2`` skips the
two randn kernels; `attention`: B=4 H=32 S=4096 D=128, non-causal;
`causal`: the same, causal; `d64`: B=16 H=16 S=1024 D=64; `attention_cudnn`, `causal_cudnn`,
`d64_cudnn`: cuDNN's
SDPA on those, for the side-by-side view - profile them with ``-k regex:'cudnn|flash|fmha'``;
`fp8` / `fp8_cublaslt`: the FP8 GEMM at 8192³ (examples/gemm_fp8.py's CUDA default / torch._scaled_mm),
its timed launch alone between cudaProfilerStart / Stop - profile it with ``--profile-from-start off``;
`bwd` / `bwd_causal` / `bwd_d64`: the FlashAttention backward kernel (examples/flash_attention_bwd.py,
its preprocess outside the profiled range) at 4x32x4096x128 (causal) / 16x16x1024x64, and
`bwd_cudnn`, ...: SDPA's cuDNN backward there, the same way.)
Each case is launched twice: the first launch compiles, the second is the one profiled.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from examples.flash_attention import tritile_attention  # noqa: E402
from examples.gemm import tritile_matmul  # noqa: E402


# case -> (q/k/v shape, causal, run cuDNN's SDPA instead of tritile)
ATTENTION = {"attention": ((4, 32, 4096, 128), False, False),
             "attention_cudnn": ((4, 32, 4096, 128), False, True),
             "causal": ((4, 32, 4096, 128), True, False), "causal_cudnn": ((4, 32, 4096, 128), True, True),
             "d64": ((16, 16, 1024, 64), False, False), "d64_cudnn": ((16, 16, 1024, 64), False, True)}


# case -> (q/k/v shape, causal) of a backward
BACKWARD = {"bwd": ((4, 32, 4096, 128), False), "bwd_causal": ((4, 32, 4096, 128), True),
            "bwd_d64": ((16, 16, 1024, 64), False)}


# case -> (M, N, K) of an fp16 GEMM
GEMM = {"gemm": (4096, 4096, 4096), "gemm_small_m": (128, 4096, 4096)}


def profile_second_call(run):
    """Call `run` twice, the second call alone between cudaProfilerStart / Stop (ncu's
    ``--profile-from-start off``): the first compiles and warms up."""
    run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def main(case: str):
    if case.removesuffix("_cublas") in GEMM:
        M, N, K = GEMM[case.removesuffix("_cublas")]
        a = torch.randn(M, K, device="cuda", dtype=torch.float16)
        b = torch.randn(K, N, device="cuda", dtype=torch.float16)
        for _ in range(2):
            torch.matmul(a, b) if case.endswith("_cublas") else tritile_matmul(a, b)
    elif case in ATTENTION:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        shape, causal, library = ATTENTION[case]
        q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.float16) for _ in range(3))
        for _ in range(2):
            if library:
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    sdpa(q, k, v, is_causal=causal)
            else:
                tritile_attention(q, k, v, causal)
    elif case in ("fp8", "fp8_cublaslt"):
        from examples.gemm_fp8 import quantize, tritile_gemm_fp8

        a8, scale_a = quantize(torch.randn(8192, 8192, device="cuda"))
        b8, scale_b = quantize(torch.randn(8192, 8192, device="cuda"))
        if case == "fp8":
            def run():
                tritile_gemm_fp8(a8, b8, scale_a, scale_b)
        else:
            def run():
                torch._scaled_mm(a8, b8.t(), scale_a=scale_a.float(), scale_b=scale_b.float(), out_dtype=torch.float16)
        profile_second_call(run)
    elif case.removesuffix("_cudnn") in BACKWARD:
        sys.path.insert(0, os.path.dirname(__file__))
        from attention_bwd_h100 import sdpa_backward, tritile_backward
        from timing import load_example

        shape, causal = BACKWARD[case.removesuffix("_cudnn")]
        q, k, v, do = (torch.randn(*shape, device="cuda", dtype=torch.float16) for _ in range(4))
        run = (sdpa_backward(q, k, v, do, causal) if case.endswith("_cudnn")
               else tritile_backward(load_example("flash_attention_bwd"), q, k, v, do, causal).kernel_alone)
        profile_second_call(run)
    else:
        raise SystemExit(f"unknown case {case!r}: use one of {sorted(GEMM)} (+ '_cublas'), {sorted(ATTENTION)}, "
                         f"fp8, fp8_cublaslt, {sorted(BACKWARD)} (+ '_cudnn')")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1])
