"""Regression tests for the pipelining bug reports we must get right, written TileLang-style
(`import tritile.language as T`, `@tritile.jit`) and run through every pass on the `device`
fixture's tensors (CPU: the interpreter; CUDA: the Gluon kernel): seed 000 (sibling loops 2 then 4, and its mirror), TileLang #3039 (read after
the loop) and seed 001 (a shared buffer used only outside the pipelines)."""
import pytest
import torch

import tritile
import tritile.language as T

BM, BN, BK = 64, 64, 32


@tritile.jit
def sibling_pipelines(A, B, first: int = 2, second: int = 4):
    M, N, K = T.const("M, N, K")
    A: T.Tensor[[M, K], T.float16]
    B: T.Tensor[[K, N], T.float16]
    C = T.empty((M, N), T.float16)
    K_half = K // 2
    with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=128) as (bx, by):
        A_shared = T.alloc_shared((BM, BK), T.float16)
        B_shared = T.alloc_shared((BK, BN), T.float16)
        C_local = T.alloc_fragment((BM, BN), T.float32)
        T.clear(C_local)
        for ko in T.Pipelined(T.ceildiv(K_half, BK), num_stages=first):
            T.copy(A[by * BM, ko * BK], A_shared)
            T.copy(B[ko * BK, bx * BN], B_shared)
            T.gemm(A_shared, B_shared, C_local)
        for ko in T.Pipelined(T.ceildiv(K_half, BK), num_stages=second):
            T.copy(A[by * BM, K_half + ko * BK], A_shared)
            T.copy(B[K_half + ko * BK, bx * BN], B_shared)
            T.gemm(A_shared, B_shared, C_local)
        T.copy(C_local, C[by * BM, bx * BN])
    return C


@tritile.jit
def read_after_loop(A, B, num_stages: int = 3):
    M, N, K = T.const("M, N, K")
    A: T.Tensor[[M, K], T.float16]
    B: T.Tensor[[K, N], T.float16]
    C = T.empty((M, N), T.float16)
    D = T.empty((M, BK), T.float16)
    with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=128) as (bx, by):
        A_shared = T.alloc_shared((BM, BK), T.float16)
        B_shared = T.alloc_shared((BK, BN), T.float16)
        C_local = T.alloc_fragment((BM, BN), T.float32)
        T.clear(C_local)
        for ko in T.Pipelined(T.ceildiv(K, BK), num_stages=num_stages):
            T.copy(A[by * BM, ko * BK], A_shared)
            T.copy(B[ko * BK, bx * BN], B_shared)
            T.gemm(A_shared, B_shared, C_local)
        T.copy(C_local, C[by * BM, bx * BN])
        T.copy(A_shared, D[by * BM, 0])
    return C, D


@tritile.jit
def staged_output(A, B, num_stages: int = 3):
    M, N, K = T.const("M, N, K")
    A: T.Tensor[[M, K], T.float16]
    B: T.Tensor[[K, N], T.float16]
    C = T.empty((M, N), T.float16)
    with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=128) as (bx, by):
        A_shared = T.alloc_shared((BM, BK), T.float16)
        B_shared = T.alloc_shared((BK, BN), T.float16)
        C_shared = T.alloc_shared((BM, BN), T.float16)
        C_local = T.alloc_fragment((BM, BN), T.float32)
        T.clear(C_local)
        for ko in T.Pipelined(T.ceildiv(K, BK), num_stages=num_stages):
            T.copy(A[by * BM, ko * BK], A_shared)
            T.copy(B[ko * BK, bx * BN], B_shared)
            T.gemm(A_shared, B_shared, C_local)
        T.copy(C_local, C_shared)
        T.copy(C_shared, C[by * BM, bx * BN])
    return C


def _inputs(m, n, k, device):
    return torch.randn(m, k, device=device).half(), torch.randn(k, n, device=device).half()


SEED000_ORDERS = [(2, 4), (4, 2)]


@pytest.mark.parametrize("first, second", SEED000_ORDERS, ids=["seed000_2_then_4", "seed000_mirror_4_then_2"])
def test_seed000_sibling_pipelines(first, second, device, assert_close):
    a, b = _inputs(64, 64, 256, device)
    c = sibling_pipelines(a, b, first=first, second=second)
    assert_close(c, (a.float() @ b.float()).half())
    kernel = sibling_pipelines.compile(M=64, N=64, K=256, first=first, second=second)
    text = kernel.get_source("buffer_versioning")
    assert text.count("A_shared = T.alloc_shared") == 1
    assert "A_shared = T.alloc_shared([4, 64, 32], float16)" in text
    assert "% 2, :, :]" in text and "% 4, :, :]" in text


@pytest.mark.parametrize("num_stages", [2, 3])
def test_issue3039_read_after_loop(num_stages, device, assert_close):
    """TileLang #3039: the versioned tile read after the loop holds the last iteration's data."""
    a, b = _inputs(128, 64, 160, device)  # 5 K tiles: the last one lives in slot 4 % num_stages
    c, d = read_after_loop(a, b, num_stages=num_stages)
    assert_close(c, (a.float() @ b.float()).half())
    assert torch.equal(d, a[:, 128:160])


def test_seed001_buffer_outside_pipeline_untouched(device, assert_close):
    a, b = _inputs(64, 128, 128, device)
    assert_close(staged_output(a, b), (a.float() @ b.float()).half())
    text = staged_output.compile(M=64, N=128, K=128).get_source("buffer_versioning")
    assert "C_shared = T.alloc_shared([64, 64], float16)" in text
    assert "A_shared = T.alloc_shared([3, 64, 32], float16)" in text


# The specialisations tests/test_kernels_compile.py compiles for sm_90 and sm_80 (the shapes above).
COMPILE_CASES = {
    **{f"sibling_pipelines-{first}-{second}": (lambda first=first, second=second: sibling_pipelines.compile(
        M=64, N=64, K=256, first=first, second=second)) for first, second in SEED000_ORDERS},
    **{f"read_after_loop-s{stages}": (lambda stages=stages: read_after_loop.compile(
        M=128, N=64, K=160, num_stages=stages)) for stages in (2, 3)},
    "staged_output": lambda: staged_output.compile(M=64, N=128, K=128),
}
