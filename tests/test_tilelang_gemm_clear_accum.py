"""`T.gemm(..., clear_accum=cond)` with a runtime condition (TileLang's
examples/warp_specialize/example_warp_specialize_flashmla.py writes `clear_accum=(j == 0)`): the
frontend emits `if cond: T.clear(C)` before an accumulating gemm, so when `cond` holds
C = A @ B, otherwise C += A @ B.  Pipelined GEMM loops whose gemm clears on the first k step (the
whole product) or on the last (only the last step's product) against torch: tritile's interpreter
(every lowering stage, with a producer warp and split consumer partitions too), Triton's
interpreter of the triton.language kernel, and sm_90 PTX of both backends (wgmma)."""
import pytest
import torch

import tritile
import tritile.language as T
from tritile.errors import CompileError
from tritile.interpreter import execute
from tritile.lowering import run_passes
from tritile.runtime.target import Target


def pipelined_gemm(M, N, K, bm, bn, bk, clear_on, stages=3, threads=128):
    nk = K // bk

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16), C: T.Tensor((M, N), T.float32)):
        with T.Kernel(N // bn, M // bm, threads=threads) as (bx, by):
            A_s = T.alloc_shared((bm, bk), T.float16)
            B_s = T.alloc_shared((bk, bn), T.float16)
            C_l = T.alloc_fragment((bm, bn), T.float32)
            for k in T.Pipelined(nk, num_stages=stages):
                T.copy(A[by * bm, k * bk], A_s)
                T.copy(B[k * bk, bx * bn], B_s)
                if clear_on == "first":
                    T.gemm(A_s, B_s, C_l, clear_accum=(k == 0))
                else:
                    T.gemm(A_s, B_s, C_l, clear_accum=(k == nk - 1))
            T.copy(C_l, C[by * bm, bx * bn])

    return main


def operands(M, N, K, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(M, K, generator=gen).half(), torch.randn(K, N, generator=gen).half())


def reference(a, b, clear_on, bk):
    if clear_on == "last":
        a, b = a[:, -bk:], b[-bk:, :]
    return a.float() @ b.float()


SHAPE = (128, 128, 256, 64, 64, 32)  # 8 k steps


@pytest.mark.parametrize("clear_on", ["first", "last"])
def test_runtime_clear_accum_on_the_interpreter(clear_on, device, assert_close):
    a, b = (t.to(device) for t in operands(128, 128, 256))
    c = torch.empty(128, 128, dtype=torch.float32, device=device)
    tritile.compile(pipelined_gemm(*SHAPE, clear_on))(a, b, c)
    assert_close(c, reference(a, b, clear_on, 32))


@pytest.mark.parametrize("clear_on", ["first", "last"])
def test_runtime_clear_accum_on_tritons_interpreter(clear_on, assert_close):
    a, b = operands(128, 128, 256, seed=1)
    c = torch.empty(128, 128, dtype=torch.float32)
    tritile.compile(pipelined_gemm(*SHAPE, clear_on), backend="triton")(a, b, c)  # CPU: Triton's interpreter
    assert_close(c, reference(a, b, clear_on, 32))


@pytest.mark.parametrize("clear_on", ["first", "last"])
def test_every_stage_with_a_producer_and_consumer_partitions(clear_on, monkeypatch, assert_close):
    """Two warpgroups on 128x128 tiles: a producer warp and, switched on, the rows split across
    the consumers; the interpreter runs every lowering stage's program."""
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "1")
    monkeypatch.setenv("TRITILE_CONSUMER_PARTITIONS", "1")
    monkeypatch.setenv("TRITILE_PERSISTENT", "0")
    func = tritile.compile(pipelined_gemm(128, 128, 256, 128, 128, 64, clear_on, threads=256)).stages[0][1]
    stages = run_passes(func, Target("cuda", 90))
    final = stages[-1][1]
    assert "warp_specialization" in final.attrs
    a, b = operands(128, 128, 256, seed=2)
    expected = reference(a, b, clear_on, 64)
    for name, stage in stages:
        c = torch.empty(128, 128, dtype=torch.float32)
        execute(stage, [a, b, c], {})
        assert_close(c, expected), name


@pytest.mark.parametrize("backend", ["gluon", "triton"])
@pytest.mark.parametrize("clear_on", ["first", "last"])
def test_runtime_clear_accum_compiles_for_hopper(clear_on, backend):
    ptx = tritile.compile(pipelined_gemm(*SHAPE, clear_on), target="cuda:90", backend=backend).get_source("ptx")
    assert ".target sm_90" in ptx and "wgmma.mma_async" in ptx


def test_a_non_scalar_condition_is_a_compile_error():
    with pytest.raises(CompileError, match="clear_accum must be a bool or a runtime condition"):
        @T.prim_func
        def main(A: T.Tensor((64, 32), T.float16), B: T.Tensor((32, 64), T.float16),
                 C: T.Tensor((64, 64), T.float32)):
            with T.Kernel(1, threads=128):
                A_s = T.alloc_shared((64, 32), T.float16)
                B_s = T.alloc_shared((32, 64), T.float16)
                C_l = T.alloc_fragment((64, 64), T.float32)
                T.copy(A, A_s)
                T.copy(B, B_s)
                T.gemm(A_s, B_s, C_l, clear_accum="yes")
                T.copy(C_l, C)
