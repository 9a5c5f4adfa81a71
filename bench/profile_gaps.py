"""Run each tritile kernel that misses its issue-5 target once after warm-up, so that Nsight Compute
can profile exactly that launch:

    ncu --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
        -k regex:'matmul|main' --launch-skip 1 --launch-count 1 python3 bench/profile_gaps.py gemm
    ncu ... python3 bench/profile_gaps.py attention

(`gemm`: fp16 4096³ with the example's config; `attention`: B=4 H=32 S=4096 D=128, non-causal;
`causal`: the same, causal; `causal_cudnn`: cuDNN's SDPA on it, for the side-by-side view -
profile it with ``-k regex:'flash|fmha|cudnn|sm90'``.)
Each case is launched twice: the first launch compiles, the second is the one profiled.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from examples.flash_attention import tritile_attention  # noqa: E402
from examples.gemm import tritile_matmul  # noqa: E402


def main(case: str):
    if case == "gemm":
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
        b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
        for _ in range(2):
            tritile_matmul(a, b)
    elif case in ("attention", "causal", "causal_cudnn"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        q, k, v = (torch.randn(4, 32, 4096, 128, device="cuda", dtype=torch.float16) for _ in range(3))
        for _ in range(2):
            if case == "causal_cudnn":
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    sdpa(q, k, v, is_causal=True)
            else:
                tritile_attention(q, k, v, case == "causal")
    else:
        raise SystemExit(f"unknown case {case!r}: use gemm, attention, causal or causal_cudnn")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1])
