"""TileLang's explicit warp specialization (`T.alloc_barrier`, `T.ws`, `T.tma_copy`,
`T.barrier_arrive` / `T.barrier_wait`): a producer / consumer GEMM runs on CPU through the
interpreter, whose mbarrier model reports deadlocks and mismatched arrival counts; the Gluon
backend rejects the construct with a CompileError at the user's line."""
import pytest
import torch

import tritile
import tritile.language as T

# constructs only the tile-IR interpreter runs (the backends refuse them): CPU tensors take it,
# whatever TRITILE_BACKEND says
pytestmark = pytest.mark.usefixtures("gluon_backend")


@tritile.jit
def _ws_gemm(A, B, block_M, block_N, block_K, dtype=T.float16, accum_dtype=T.float32):
    M, N, K = T.const("M, N, K")
    A: T.Tensor((M, K), dtype)
    B: T.Tensor((K, N), dtype)
    C = T.empty((M, N), dtype)
    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
        A_shared = T.alloc_shared((block_M, block_K), dtype)
        B_shared = T.alloc_shared((block_K, block_N), dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
        bars = T.alloc_barrier([128, 128])  # [data ready, compute done]
        with T.ws(1):
            T.clear(C_local)
        for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=0):
            with T.ws(0):
                T.barrier_wait(bars[1], (ko + 1) % 2)
                T.tma_copy(A[by * block_M, ko * block_K], A_shared, barrier=bars[0])
                T.tma_copy(B[ko * block_K, bx * block_N], B_shared, barrier=bars[0])
                T.barrier_arrive(bars[0])
            with T.ws(1):
                T.barrier_wait(bars[0], ko % 2)
                T.gemm(A_shared, B_shared, C_local)
                T.barrier_arrive(bars[1])
        with T.ws(1):
            T.copy(C_local, C[by * block_M, bx * block_N])
    return C


def test_producer_consumer_gemm():
    a = torch.randn(64, 96, dtype=torch.float16)
    b = torch.randn(96, 32, dtype=torch.float16)
    c = _ws_gemm(a, b, 32, 16, 32)
    torch.testing.assert_close(c, (a.float() @ b.float()).half(), rtol=1e-2, atol=1e-2)


def test_printed_ir_shows_the_warp_groups():
    text = _ws_gemm.compile(M=64, N=32, K=96, block_M=32, block_N=16, block_K=32).get_source("tile")
    assert "with T.ws(0):" in text and "T.alloc_barrier([128, 128])" in text
    assert "T.barrier_wait(bars[1], " in text and "T.barrier_arrive(bars[0])" in text


def _one_barrier_kernel(wait_parity, arrive_count, arrive_groups):
    @T.prim_func
    def main(A: T.Tensor((128,), T.float32), B: T.Tensor((128,), T.float32)):
        with T.Kernel(1, threads=256) as bx:
            bar = T.alloc_barrier(arrive_count)
            tile = T.alloc_shared((128,), T.float32)
            with T.ws(*arrive_groups):
                T.copy(A[0], tile)
                T.barrier_arrive(bar)
            T.barrier_wait(bar, wait_parity)
            T.copy(tile, B[0])

    return main


def test_barrier_phase_completes_after_all_groups_arrive():
    kernel = tritile.compile(_one_barrier_kernel(0, 256, (0, 1)), out_idx=[1])
    a = torch.randn(128)
    torch.testing.assert_close(kernel(a), a)


def test_wait_that_never_returns_is_reported():
    kernel = tritile.compile(_one_barrier_kernel(0, 256, (0,)), out_idx=[1])  # 128 of 256 arrivals
    with pytest.raises(tritile.CompileError, match="never returns"):
        kernel(torch.randn(128))


def test_too_many_arrivals_are_reported():
    kernel = tritile.compile(_one_barrier_kernel(0, 128, (0, 1)), out_idx=[1])
    with pytest.raises(tritile.CompileError, match="256 threads arrive"):
        kernel(torch.randn(128))


def test_ws_group_outside_the_kernel_threads():
    with pytest.raises(tritile.CompileError, match="no warp group 2"):
        @T.prim_func
        def main(A: T.Tensor((128,), T.float32)):
            with T.Kernel(1, threads=256) as bx:
                with T.ws(2):
                    T.fill(A[0:128], 1.0)


def test_barrier_wait_needs_a_barrier():
    with pytest.raises(tritile.CompileError, match="expected a barrier"):
        @T.prim_func
        def main(A: T.Tensor((128,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                tile = T.alloc_shared((128,), T.float32)
                T.barrier_wait(tile, 0)


def test_gluon_rejects_explicit_warp_specialization_at_the_users_line():
    with pytest.raises(tritile.CompileError, match="explicit warp specialization") as err:
        _ws_gemm.compile(M=64, N=32, K=96, block_M=32, block_N=16, block_K=32, target="cuda:90").get_source("gluon")
    assert "test_tilelang_language_warp_specialize.py" in str(err.value)
