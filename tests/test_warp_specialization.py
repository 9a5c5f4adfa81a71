"""Warp specialization (opt-in, TRITILE_WARP_SPECIALIZE=1): the planning pass, the generated
producer / consumer partitions (CPU compile checks for sm_90), and GPU runs of the pipelined
kernels of the suites with a producer warp.

Kernels are rebuilt from their frontend IR as `JITKernel`s so the pass list runs with the switch
set (the jit decorators memoise kernels built without it).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from tritile.ir.printer import format_func
from tritile.lowering import run_passes
from tritile.runtime.kernel import JITKernel
from tritile.runtime.target import Target

pytestmark = pytest.mark.usefixtures("gluon_backend")  # the Gluon backend's own code

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

H100, A100 = Target("cuda", 90), Target("cuda", 80)


@pytest.fixture
def warp_specialize(monkeypatch):
    """A producer warp wherever it applies, one CTA per tile (persistent warp-specialized
    kernels: tests/test_persistent_tiles.py)."""
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "1")
    monkeypatch.setenv("TRITILE_PERSISTENT", "0")


def _frontend(build):
    return build().stages[0][1]


def gemm_ir():
    import tritile.language as T
    from tritile.ops.matmul import matmul, tile_config

    return _frontend(lambda: matmul.compile(M=512, N=512, K=512, dtype=T.float16, target="cuda:90",
                                            **tile_config("cuda", 512, 512, 512)))


def attention_ir(causal, seq=512, dim=128):
    from examples.flash_attention import flashattn, tile_config

    return _frontend(lambda: flashattn(1, 2, seq, seq, dim, causal, **tile_config("cuda")))


def siblings_ir(stages):
    from test_kernels_pipeline import matmul_sibling_pipelines

    return _frontend(lambda: matmul_sibling_pipelines(128, 128, 384, 64, 64, 32, stages))


def manual_schedule_ir(order, stage):
    import tritile
    from test_kernels_pipeline import gemm

    return _frontend(lambda: tritile.compile(gemm(128, 128, 160, 64, 64, 32, order=order, stage=stage), out_idx=[2]))


def function(source: str, name: str) -> str:
    """The text of one generated function."""
    match = re.search(rf"^def {name}\(.*?(?=^\S)", source + "\nEND", re.S | re.M)
    assert match, f"no function {name} in the generated module"
    return match.group(0)


# ------------------------------------------------------------------ the planning pass


def test_switched_off(monkeypatch):
    """(What `auto` chooses: tests/test_consumer_partitions.py.)"""
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "0")
    func = run_passes(gemm_ir(), H100)[-1][1]
    assert "warp_specialization" not in func.attrs


def test_planned_for_hopper_and_printed(warp_specialize):
    stages = dict(run_passes(gemm_ir(), H100))
    plan = stages["warp_specialization"].attrs["warp_specialization"]
    assert (plan.producer_warps, plan.producer_registers, plan.loops) == (1, 24, ("k_t",))
    assert "# warp specialized: a producer of 1 warp(s), 24 registers" in format_func(stages["warp_specialization"])
    # the schedule is unchanged: the IR below the comment is the injected pipeline's
    before = format_func(stages["pipeline_injection"]).splitlines()
    after = [line for line in format_func(stages["warp_specialization"]).splitlines() if "warp specialized" not in line]
    assert before == after


def test_not_planned_without_tma_or_for_nested_and_guarded_loops(warp_specialize):
    from test_codegen import pipeline_program

    assert "warp_specialization" not in run_passes(gemm_ir(), A100)[-1][1].attrs
    for name in ("dynamic_outer", "guarded"):  # a pipeline inside a loop; data-dependent copies
        func = run_passes(pipeline_program(name).func, H100)[-1][1]
        assert "warp_specialization" not in func.attrs, name


def test_budget_counts_the_empty_barriers(warp_specialize, monkeypatch):
    planned = run_passes(gemm_ir(), H100)[-1][1].attrs["shared_bytes"]
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "0")
    plain = run_passes(gemm_ir(), H100)[-1][1].attrs["shared_bytes"]
    assert planned - plain == 8 * 3  # one "empty" mbarrier per slot of the 3-stage ring


def gemm_with_float_staging(M, N, K):
    """TileLang's GEMM with a float32 staging tile: 128x256x64 in 3 stages (144 KB of operands in
    the loop) then a 128 KB C_shared after it - 272 KB when none shares bytes."""
    import tritile
    import tritile.language as T

    @tritile.jit(out_idx=[2])
    def build(M, N, K, block_M=128, block_N=256, block_K=64):
        @T.prim_func
        def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16), C: T.Tensor((M, N), T.float32)):
            with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
                A_shared = T.alloc_shared((block_M, block_K), T.float16)
                B_shared = T.alloc_shared((block_K, block_N), T.float16)
                C_local = T.alloc_fragment((block_M, block_N), T.float32)
                C_shared = T.alloc_shared((block_M, block_N), T.float32)
                T.clear(C_local)
                for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=3):
                    T.copy(A[by * block_M, k * block_K], A_shared)
                    T.copy(B[k * block_K, bx * block_N], B_shared)
                    T.gemm(A_shared, B_shared, C_local)
                T.copy(C_local, C_shared)
                T.copy(C_shared, C[by * block_M, bx * block_N])

        return main

    return build(M, N, K)


def test_no_producer_where_the_buffers_fit_only_by_sharing_bytes(monkeypatch, device):
    """Under a producer every buffer is allocated before the fork, so C_shared could not take the
    operands' bytes after the loop (TileLang's attention-sink backward: 238 KB, refused): `auto`
    leaves such a kernel without one, and it compiles and runs; forcing the producer is a
    CompileError naming the buffers."""
    from tritile import CompileError

    monkeypatch.setenv("TRITILE_PERSISTENT", "0")
    kernel = gemm_with_float_staging(256, 512, 192)
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "auto")
    frontend = kernel.stages[0][1]
    func = run_passes(frontend, H100)[-1][1]
    assert "warp_specialization" not in func.attrs and func.attrs["shared_bytes"] <= H100.shared_memory_limit
    assert "wgmma.mma_async" in JITKernel(frontend, target=H100).get_source("ptx")
    a = torch.randn(256, 192, dtype=torch.float16, device=device)
    b = torch.randn(192, 512, dtype=torch.float16, device=device)
    close(kernel(a, b), a.float() @ b.float())
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "1")
    with pytest.raises(CompileError, match="C_shared 131072 B"):
        run_passes(frontend, H100)


# ------------------------------------------------------------------ generated code (sm_90, CPU)


def test_gemm_partitions(warp_specialize):
    k = JITKernel(gemm_ir(), target=H100)
    source, ptx = k.get_source("gluon"), k.get_source("ptx")
    consumer, producer = function(source, "matmul_consumer"), function(source, "matmul_producer")
    # the producer issues every TMA load; the consumers only wait and release slots
    assert "tma.async_copy_global_to_shared" in producer and "tma.async_copy_global_to_shared" not in consumer
    assert "mbarrier.expect" not in consumer and "warpgroup_mma" not in producer
    # the loop runs its 2 epilogue steps too (lowering/consumer_loop_folding.py), which release nothing
    assert "for k_t in range(2, 10):" in consumer
    assert re.search(r"mbarrier\.arrive\(k_t_bars_empty\.index\(k_t % 3\), pred=\(k_t >= 3\) & \(k_t < 8\)\)", consumer)
    assert "((g // 3) & 1) ^ 1, pred=g >= 3" in producer
    assert "gl.warp_specialize([(matmul_consumer" in source and "[1], [24])" in source
    assert "setmaxnreg" in ptx and "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert k._codegen(H100).metadata.num_warps == 12  # 8 consumer warps + the producer's warpgroup


def test_deferred_accumulation_groups_expect_per_copy(warp_specialize):
    source = JITKernel(attention_ir(False), target=H100).get_source("gluon")
    producer = function(source, "main_producer")
    # group g holds K(g) and V(g - 1): each copy expects its own bytes when it is real, else arrives
    assert "for g in range(0, 4 + 1):" in producer
    assert "mbarrier.expect(k_t_bars.index(g % 2), 32768, pred=((g - 1) >= 0) & ((g - 1) < 4))" in producer
    assert "mbarrier.arrive(k_t_bars.index(g % 2), pred=((g - 1) < 0) | ((g - 1) >= 4))" in producer
    assert "mbarrier.init(k_t_bars.index(_stage), count=2)" in source


def test_causal_trip_count_is_recomputed_by_the_producer(warp_specialize):
    producer = function(JITKernel(attention_ir(True), target=H100).get_source("gluon"), "main_producer")
    assert re.search(r"loop_range = gl\.minimum\(4, .*bx", producer)
    assert "for g in range(0, loop_range + 1):" in producer  # deferred PV: V of g - 1 in group g


def test_a_sibling_loop_waits_for_every_release(warp_specialize):
    source = JITKernel(siblings_ir((2, 4)), target=H100).get_source("gluon")
    consumer, producer = function(source, "main_consumer"), function(source, "main_producer")
    # the 4-stage loop's slots held the 2-stage loop's tiles: its first groups wait too
    assert "mbarrier.wait(k_t_bars_1_empty.index(g_1 % 4), (g_1 // 4) & 1)" in producer
    for slot in range(3):
        assert f"mbarrier.arrive(k_t_bars_1_empty.index({slot}))" in consumer


# ------------------------------------------------------------------ GPU runs


def close(out, ref, rel=1e-2):
    torch.testing.assert_close(out.float(), ref.float(), rtol=rel, atol=rel * ref.float().abs().max().item())


GPU_GEMMS = {
    "example_512": lambda: gemm_ir(),
    "siblings_2_4": lambda: siblings_ir((2, 4)),
    "siblings_4_2": lambda: siblings_ir((4, 2)),
    "siblings_0_3": lambda: siblings_ir((0, 3)),
    "manual_012_001": lambda: manual_schedule_ir([0, 1, 2], [0, 0, 1]),
    "manual_012_012": lambda: manual_schedule_ir([0, 1, 2], [0, 1, 2]),
    "manual_120_002": lambda: manual_schedule_ir([1, 2, 0], [0, 0, 2]),
}


@pytest.mark.parametrize("name", sorted(GPU_GEMMS))
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gemm_with_producer_warp_on_gpu(name, warp_specialize):
    func = GPU_GEMMS[name]()
    kernel = JITKernel(func, target=H100)
    assert "_producer" in kernel.get_source("gluon")
    (M, K), (_, N) = [tuple(p.shape) for p in func.params[:2]]
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    close(kernel(a, b), a.float() @ b.float())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_attention_with_producer_warp_on_gpu(causal, warp_specialize):
    from examples.flash_attention import ref_program

    kernel = JITKernel(attention_ir(causal), target=H100)
    assert "_producer" in kernel.get_source("gluon")
    q, k, v = (torch.randn(1, 2, 512, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    close(kernel(q, k, v), ref_program(q, k, v, causal))
