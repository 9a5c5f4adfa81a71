"""`T.Pipelined` end to end on the kernels behind TileLang's pipelining bug reports.

Each kernel goes through `@tritile.jit` and every lowering pass, then runs on the `device`
fixture's tensors: on CPU in the reference interpreter (which raises `HazardError` on a schedule
that would race on hardware), on CUDA as the Gluon kernel (tests marked `gpu`):

* sibling pipelined loops sharing `A_shared` / `B_shared` with different `num_stages`
  (TileLang #2309 / PR #2342, seed 000), and a pipelined loop inside an outer serial loop;
* a versioned shared buffer read after its loop (TileLang #3039);
* one shared tile feeding two gemms with different transpose modes (TileLang #1997, seed 003);
* residual K tiles (K=33, TileLang #2365) and trip counts below `num_stages`;
* manual `order=` / `stage=` schedules (test_tilelang_language_pipeline.py);
* an NT GEMM whose B tile is stored by a `T.Parallel` loop (TileLang #96);
* a copy indexed through a runtime index tensor (TileLang #1210).
"""
import pytest
import torch

import tritile
import tritile.language as T
from kernels import gemm, gemm_reference, matmul


@tritile.jit(out_idx=[-1])
def matmul_sibling_pipelines(M, N, K, block_M, block_N, block_K, stages, dtype="float16",
                             accum_dtype="float32"):
    """C = A @ B with the K loop cut into len(stages) consecutive pipelined loops, each with its
    own num_stages, all loading through the same two shared tiles."""
    k_tiles = (K + block_K - 1) // block_K
    cuts = [k_tiles * i // len(stages) for i in range(len(stages) + 1)]

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.clear(C_local)
            for k in T.Pipelined(cuts[0], cuts[1], num_stages=stages[0]):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[k * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            for k in T.Pipelined(cuts[1], cuts[2], num_stages=stages[1]):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[k * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            if len(stages) == 3:
                for k in T.Pipelined(cuts[2], cuts[3], num_stages=stages[2]):
                    T.copy(A[by * block_M, k * block_K], A_shared)
                    T.copy(B[k * block_K, bx * block_N], B_shared)
                    T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return main


SIBLING_STAGES = [(2, 4), (4, 2), (2, 3, 4), (0, 3)]


@pytest.mark.parametrize("stages", SIBLING_STAGES, ids=str)
def test_sibling_pipelines_share_buffers(stages, device, assert_close):
    M, N, K = 128, 128, 384
    kernel = matmul_sibling_pipelines(M, N, K, 64, 64, 32, stages)
    a = torch.randn(M, K, dtype=torch.float16, device=device)
    b = torch.randn(K, N, dtype=torch.float16, device=device)
    assert_close(kernel(a, b), gemm_reference(a, b))


@tritile.jit(out_idx=[-1])
def matmul_batched_outer_loop(batch, M, N, K, block_M, block_N, block_K, num_stages, dtype="float16",
                              accum_dtype="float32"):
    """A serial loop over the batch around a pipelined K loop: the pipeline restarts each time."""

    @T.prim_func
    def main(A: T.Tensor((batch, M, K), dtype), B: T.Tensor((batch, K, N), dtype),
             C: T.Tensor((batch, M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            for b in T.serial(batch):
                T.clear(C_local)
                for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                    T.copy(A[b, by * block_M:(by + 1) * block_M, k * block_K:(k + 1) * block_K], A_shared)
                    T.copy(B[b, k * block_K:(k + 1) * block_K, bx * block_N:(bx + 1) * block_N], B_shared)
                    T.gemm(A_shared, B_shared, C_local)
                T.copy(C_local, C[b, by * block_M:(by + 1) * block_M, bx * block_N:(bx + 1) * block_N])

    return main


def test_pipeline_inside_serial_loop(device, assert_close):
    batch, M, N, K = 3, 64, 128, 96
    kernel = matmul_batched_outer_loop(batch, M, N, K, 64, 64, 32, 2)
    a = torch.randn(batch, M, K, dtype=torch.float16, device=device)
    b = torch.randn(batch, K, N, dtype=torch.float16, device=device)
    assert_close(kernel(a, b), torch.bmm(a.float(), b.float()).to(torch.float16))


@tritile.jit(out_idx=[-1])
def two_gemms_one_tile(M, N, D, block_M, block_N, num_stages, dtype="float16", accum_dtype="float32"):
    """O = (Q X^T) X per row block: X_shared is B of a transpose_B gemm and of a plain gemm."""

    @T.prim_func
    def main(Q: T.Tensor((M, D), dtype), X: T.Tensor((N, D), dtype), O: T.Tensor((M, D), dtype)):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            Q_shared = T.alloc_shared((block_M, D), dtype)
            X_shared = T.alloc_shared((block_N, D), dtype)
            S_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            S_cast = T.alloc_fragment((block_M, block_N), dtype)
            O_local = T.alloc_fragment((block_M, D), accum_dtype)
            T.copy(Q[bx * block_M, 0], Q_shared)
            T.clear(O_local)
            for k in T.Pipelined(T.ceildiv(N, block_N), num_stages=num_stages):
                T.copy(X[k * block_N, 0], X_shared)
                T.gemm(Q_shared, X_shared, S_local, transpose_B=True, clear_accum=True)
                T.copy(S_local, S_cast)
                T.gemm(S_cast, X_shared, O_local)
            T.copy(O_local, O[bx * block_M, 0])

    return main


@pytest.mark.parametrize("num_stages", [0, 2])
def test_shared_tile_feeds_gemms_with_different_transpose(num_stages, device, assert_close):
    M, N, D = 128, 128, 64
    q = torch.randn(M, D, dtype=torch.float16, device=device) / 4
    x = torch.randn(N, D, dtype=torch.float16, device=device) / 4
    kernel = two_gemms_one_tile(M, N, D, 64, 64, num_stages)
    # the kernel rounds each S block to fp16 before the second gemm; so does the reference
    s = (q.float() @ x.float().T).to(torch.float16)
    assert_close(kernel(q, x), (s.float() @ x.float()).to(torch.float16))


TRIP_COUNT_CASES = [
    (33, 2),  # TileLang #2365: the second K tile holds one valid column
    (33, 3),
    (32, 3),  # one iteration, three stages
    (64, 4),  # two iterations, four stages
]
MANUAL_SCHEDULES = [
    ([0, 1, 2], [0, 0, 1]),
    ([0, 1, 2], [0, 0, 2]),
    ([1, 2, 0], [0, 0, 2]),
    ([1, 2, 0], [0, 0, 1]),
    ([0, 1, 2], [0, 1, 2]),
]


@pytest.mark.parametrize("K, num_stages", TRIP_COUNT_CASES)
def test_trip_counts_and_residual_k(K, num_stages, device, assert_close):
    M, N = 64, 128
    kernel = matmul(M, N, K, 64, 64, 32, num_stages=num_stages)
    a = torch.randn(M, K, dtype=torch.float16, device=device)
    b = torch.randn(K, N, dtype=torch.float16, device=device)
    assert_close(kernel(a, b), gemm_reference(a, b))


@pytest.mark.parametrize("order, stage", MANUAL_SCHEDULES, ids=str)
def test_manual_order_and_stage(order, stage, device, assert_close):
    M, N, K = 128, 128, 160
    # a plain function returning the prim_func, compiled with `tritile.compile` as TileLang's
    # test_pipeline_order_stage does
    kernel = tritile.compile(gemm(M, N, K, 64, 64, 32, order=order, stage=stage), out_idx=[2])
    a = torch.randn(M, K, dtype=torch.float16, device=device)
    b = torch.randn(K, N, dtype=torch.float16, device=device)
    assert_close(kernel(a, b), gemm_reference(a, b))


@tritile.jit(out_idx=[-1])
def matmul_nt_parallel_load(M, N, K, block_M, block_N, block_K, dtype="float16", accum_dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_N, block_K), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=1):
                T.copy(A[by * block_M, k * block_K], A_shared)
                for j, kk in T.Parallel(block_N, block_K):
                    B_shared[j, kk] = B[bx * block_N + j, k * block_K + kk]
                T.gemm(A_shared, B_shared, C_local, transpose_B=True)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return main


def test_nt_gemm_with_parallel_shared_store(device, assert_close):
    M, N, K = 128, 128, 128
    a = torch.randn(M, K, dtype=torch.float16, device=device)
    b = torch.randn(N, K, dtype=torch.float16, device=device)
    kernel = matmul_nt_parallel_load(M, N, K, 64, 64, 32)
    assert_close(kernel(a, b), (a.float() @ b.float().T).to(torch.float16))


@tritile.jit(out_idx=[-1])
def gather_row_blocks(num_blocks, block_M, N, dtype="float32"):
    """Y's i-th row block = X's ids[i]-th row block, copied through a pipelined shared tile."""

    @T.prim_func
    def main(X: T.Tensor((num_blocks * block_M, N), dtype), ids: T.Tensor((num_blocks,), "int32"),
             Y: T.Tensor((num_blocks * block_M, N), dtype)):
        with T.Kernel(1, threads=128) as _:
            X_shared = T.alloc_shared((block_M, N), dtype)
            for i in T.Pipelined(num_blocks, num_stages=1):
                T.copy(X[ids[i] * block_M, 0], X_shared)
                T.copy(X_shared, Y[i * block_M, 0])

    return main


def test_pipelined_copy_through_index_tensor(device):
    num_blocks, block_M, N = 4, 16, 64
    x = torch.randn(num_blocks * block_M, N, device=device)
    ids = torch.randperm(num_blocks, device=device).to(torch.int32)
    y = gather_row_blocks(num_blocks, block_M, N)(x, ids)
    expected = x.reshape(num_blocks, block_M, N)[ids.long()].reshape(num_blocks * block_M, N)
    assert torch.equal(y, expected)


# The specialisations tests/test_kernels_compile.py compiles for sm_90 and sm_80: every kernel
# and every parametrisation of the tests above.
COMPILE_CASES = {
    **{f"matmul_sibling_pipelines-{stages}": (lambda stages=stages: matmul_sibling_pipelines(
        128, 128, 384, 64, 64, 32, stages)) for stages in SIBLING_STAGES},
    "matmul_batched_outer_loop": lambda: matmul_batched_outer_loop(3, 64, 128, 96, 64, 64, 32, 2),
    **{f"two_gemms_one_tile-s{stages}": (lambda stages=stages: two_gemms_one_tile(128, 128, 64, 64, 64, stages))
       for stages in (0, 2)},
    **{f"matmul_plain-K{K}-s{stages}": (lambda K=K, stages=stages: matmul(64, 128, K, 64, 64, 32, num_stages=stages))
       for K, stages in TRIP_COUNT_CASES},
    **{f"matmul_manual_schedule-{order}-{stage}": (lambda order=order, stage=stage: tritile.compile(
        gemm(128, 128, 160, 64, 64, 32, order=order, stage=stage), out_idx=[2]))
       for order, stage in MANUAL_SCHEDULES},
    "matmul_nt_parallel_load": lambda: matmul_nt_parallel_load(128, 128, 128, 64, 64, 32),
    "gather_row_blocks": lambda: gather_row_blocks(4, 16, 64),
}
