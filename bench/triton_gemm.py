"""The Triton baseline for GEMM benchmarks: a `tl.dot` kernel fed by TMA tensor descriptors.

Best of a fixed config list (the configs Triton's own tutorials use on Hopper), so the
baseline is a well-tuned Triton, not a strawman.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

CONFIGS = [  # (BM, BN, BK, stages, warps)
    (128, 256, 64, 3, 8),
    (128, 256, 64, 4, 8),
    (128, 128, 64, 4, 4),
    (128, 128, 64, 5, 8),
    (64, 128, 64, 4, 4),
]


@triton.jit
def _gemm_kernel(a_desc, b_desc, c_desc, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    group = GROUP_M * num_pid_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        a = a_desc.load([pid_m * BM, k * BK])
        b = b_desc.load([k * BK, pid_n * BN])
        acc = tl.dot(a, b, acc)
    c_desc.store([pid_m * BM, pid_n * BN], acc.to(c_desc.dtype))


def triton_matmul(a: torch.Tensor, b: torch.Tensor, config) -> torch.Tensor:
    BM, BN, BK, stages, warps = config
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    a_desc = TensorDescriptor.from_tensor(a, [BM, BK])
    b_desc = TensorDescriptor.from_tensor(b, [BK, BN])
    c_desc = TensorDescriptor.from_tensor(c, [BM, BN])
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
    _gemm_kernel[grid](a_desc, b_desc, c_desc, M, N, K, BM, BN, BK, 8, num_stages=stages, num_warps=warps)
    return c
