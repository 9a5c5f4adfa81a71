"""Split-K GEMM with `T.atomic_add`, TileLang's examples/gemm_splitk style.

The grid's third dimension splits K; every split accumulates its partial product into C with an
atomic add: the tile form (`T.atomic_add(C[region or head address], C_shared)`) and the scalar
form (`T.atomic_add(C[i, j], value)` inside `T.Parallel`, guarded for a padded shape).  C starts
from random values, so the kernel must add to it, not overwrite it.  On the `device` fixture's
tensors (CPU: the reference interpreter; CUDA: the Gluon kernel).
"""
import pytest
import torch

import tritile
import tritile.language as T


@tritile.jit
def matmul_splitk(M, N, K, block_M, block_N, block_K, split_k, form, dtype="float16",
                  accum_dtype="float32", out_dtype="float32"):
    split_len = K // split_k

    @T.prim_func
    def main(
            A: T.Tensor((M, K), dtype),
            B: T.Tensor((K, N), dtype),
            C: T.Tensor((M, N), out_dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), split_k, threads=128) as (bx, by, bz):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_shared = T.alloc_shared((block_M, block_N), out_dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(split_len, block_K), num_stages=2):
                T.copy(A[by * block_M, bz * split_len + ko * block_K], A_shared)
                T.copy(B[bz * split_len + ko * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C_shared)
            if form == "tile_region":
                T.atomic_add(C[by * block_M:(by + 1) * block_M, bx * block_N:(bx + 1) * block_N], C_shared)
            elif form == "tile_head":
                T.atomic_add(C[by * block_M, bx * block_N], C_shared)
            else:
                for i, j in T.Parallel(block_M, block_N):
                    if by * block_M + i < M and bx * block_N + j < N:
                        T.atomic_add(C[by * block_M + i, bx * block_N + j], C_shared[i, j])

    return main


SPLITK_CASES = [
    ("tile_region", 128, 128),
    ("tile_head", 128, 128),
    ("scalar", 128, 128),
    ("scalar", 200, 136),  # padded: the guard keeps edge tiles inside C
]
K, SPLIT_K = 128, 2


@pytest.mark.parametrize("form, M, N", SPLITK_CASES)
def test_splitk_atomic_add(form, M, N, device, assert_close):
    kernel = matmul_splitk(M, N, K, 64, 64, 32, SPLIT_K, form)
    a = torch.randn(M, K, dtype=torch.float16, device=device)
    b = torch.randn(K, N, dtype=torch.float16, device=device)
    c = torch.randn(M, N, device=device)
    expected = c + a.float() @ b.float()
    kernel(a, b, c)
    assert_close(c, expected)


# The specialisations tests/test_kernels_compile.py compiles for sm_90 and sm_80.
COMPILE_CASES = {f"matmul_splitk-{form}-{M}x{N}": (lambda form=form, M=M, N=N: matmul_splitk(
    M, N, K, 64, 64, 32, SPLIT_K, form)) for form, M, N in SPLITK_CASES}
