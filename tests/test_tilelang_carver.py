"""TileLang's `tilelang.carver` (arch, roller, MatmulTemplate), `tilelang.tools.Analyzer` and the
JIT's `get_tir`, as examples/gemm/example_gemm_autotune.py (with_roller) and examples/analyze use
them:

* the devices' numbers (from torch.cuda, or the table of known GPUs without one);
* the recommended hints are valid schedules: the block splits into its warps, the stages' shared
  memory fits the device, the hints are distinct, at most `topk`;
* the hints' configurations - through the example's own kernel and through
  `MatmulTemplate.program` (transposes, bias) - compile and compute the GEMM (the `device`
  fixture: the interpreter on CPU);
* the Analyzer counts 2*M*N*K FLOPs for a GEMM, and the exact bytes of copy / elementwise kernels.
"""
import math

import pytest
import torch

import tritile
import tritile.language as T
from tritile.carver.arch import CDNA, CUDA, auto_infer_current_arch, get_arch
from tritile.carver.roller import Hint, NoRasterization, Rasterization2DColumn, recommend_matmul_hints
from tritile.carver.roller.recommend import BLOCK_SIZES, RSTEPS, SMEM_RESERVE, shared_memory_bytes
from tritile.carver.template import MatmulTemplate
from tritile.tools import AnalysisResult, Analyzer

ARCHS = {"sm_90": lambda: CUDA("cuda:90"), "sm_80": lambda: CUDA("cuda:80"), "gfx942": lambda: CDNA("hip:gfx942")}
SHAPES = [(256, 256, 256), (4096, 4096, 4096), (16, 4096, 4096), (1000, 72, 520), (8192, 128, 64)]


def _no_device_of(kind: str) -> bool:
    return not torch.cuda.is_available() or bool(torch.version.hip) != (kind == "hip")


# -- arch ---------------------------------------------------------------------------------------


@pytest.mark.skipif(not _no_device_of("cuda"), reason="a CUDA device supplies these numbers")
def test_cuda_without_device_is_an_h100():
    arch = CUDA("cuda")
    assert (arch.sm_version, arch.compute_max_core, arch.platform, arch.compute_capability) == (90, 132, "CUDA", "90")
    assert arch.smem_cap == 227 * 1024 and arch.smem_per_sm == 228 * 1024 and arch.warp_size == 32
    assert arch.peak_tflops > 900 and arch.memory_bandwidth_GBps == 3350.0 and not arch.from_device
    assert isinstance(auto_infer_current_arch(), CUDA) and isinstance(get_arch("cuda"), CUDA)


def test_table_archs():
    a100 = CUDA("sm_80")
    assert (a100.sm_version, a100.smem_cap, a100.max_smem_usage) == (80, 163 * 1024, 163 * 1024)
    if not a100.from_device:
        assert a100.compute_max_core == 108
    if _no_device_of("hip"):
        mi300 = CDNA("hip")
        assert (mi300.platform, mi300.compute_max_core, mi300.warp_size, mi300.smem_cap) == ("CDNA", 304, 64, 65536)
    assert isinstance(get_arch("hip:gfx942"), CDNA)
    with pytest.raises(ValueError):
        CUDA("hip")


# -- hints --------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch_name", list(ARCHS))
@pytest.mark.parametrize("M, N, K", SHAPES)
def test_hints_are_valid(arch_name, M, N, K):
    arch = ARCHS[arch_name]()
    topk = 20
    hints = MatmulTemplate(M=M, N=N, K=K, in_dtype=T.float16, out_dtype=T.float16,
                           accum_dtype=T.float32).with_arch(arch).recommend_hints(topk=topk)
    assert 0 < len(hints) <= topk
    assert len({h.key() for h in hints}) == len(hints), "hints must be distinct"
    for h in hints:
        assert isinstance(h, Hint) and h.use_tc
        (bm, bn), (wm, wn), (bk,) = h.block, h.warp, h.rstep
        assert bm in BLOCK_SIZES and bn in BLOCK_SIZES and bk in RSTEPS
        assert bm % wm == 0 and bn % wn == 0 and min(wm, wn) >= 16
        assert (bm // wm) * (bn // wn) in (4, 8)
        assert 1 <= h.pipeline_stage <= max(1, math.ceil(K / bk))
        smem = shared_memory_bytes(bm, bn, bk, h.pipeline_stage, 2, 2)
        assert h.smem_bytes == smem and smem + SMEM_RESERVE <= arch.smem_cap
        assert bm * bn // h.threads <= 128, "accumulator registers per thread"
    # the best of each block shape comes first: the leading hints have distinct blocks
    blocks = [tuple(h.block) for h in hints]
    leading = blocks[:len(set(blocks))]
    assert len(set(leading)) == len(leading)
    assert [h.score for h in hints[:len(leading)]] == sorted(h.score for h in hints[:len(leading)])


def test_hint_ranking_and_rasterization():
    h100 = CUDA("cuda:90")
    big = recommend_matmul_hints(8192, 8192, 8192, h100, topk=3)
    # large problems: the highest-intensity tiles (128 x 256) that fit, deep pipelines, L2 rasterization
    assert sorted(big[0].block) == [128, 256] and big[0].pipeline_stage == 3
    assert big[0].rasterization_plan == Rasterization2DColumn(int(h100.compute_max_core ** 0.5))
    small = recommend_matmul_hints(256, 256, 256, h100, topk=3)
    # a small problem: small tiles (more blocks than one SM wave's worth is no cost), no rasterization
    assert small[0].block == [32, 32] and isinstance(small[0].rasterization_plan, NoRasterization)
    # the example's own reading of a hint
    config = big[0].config()
    assert config["thread_num"] == 256 and config["block_K"] == big[0].rstep[0] and config["enable_rasteration"]


# -- the hints' programs run -------------------------------------------------------------------------


def example_gemm(M, N, K, block_M, block_N, block_K, num_stages, thread_num, enable_rasteration):
    """examples/gemm/example_gemm_autotune.py's kernel (B stored (N, K))."""
    dtype, accum_dtype = T.float16, T.float32

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=thread_num) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_N, block_K), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            C_shared = T.alloc_shared((block_M, block_N), dtype)
            T.use_swizzle(panel_size=10, enable=enable_rasteration)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * block_K], B_shared)
                T.gemm(A_shared, B_shared, C_local, transpose_B=True)
            T.copy(C_local, C_shared)
            T.copy(C_shared, C[by * block_M, bx * block_N])

    return main


def test_hint_configs_run_the_example_gemm(device, assert_close):
    M, N, K = 128, 96, 160
    template = MatmulTemplate(M=M, N=N, K=K, in_dtype=T.float16, out_dtype=T.float16,
                              accum_dtype=T.float32).with_arch(CUDA("cuda"))
    assert template.equivalent_function() is not None
    torch.manual_seed(0)
    a = torch.randn(M, K, device=device, dtype=torch.float16)
    b = torch.randn(N, K, device=device, dtype=torch.float16)
    ref = (a.float() @ b.float().T).half()
    for hint in template.recommend_hints(topk=6):
        kernel = tritile.compile(example_gemm(M, N, K, **hint.config()), out_idx=[-1])
        assert_close(kernel(a, b), ref)


@pytest.mark.parametrize("trans_A, trans_B, with_bias", [(False, True, False), (True, False, True),
                                                         (False, False, True)])
def test_template_program_runs(trans_A, trans_B, with_bias, device, assert_close):
    M, N, K = 80, 112, 96
    template = MatmulTemplate(M=M, N=N, K=K, trans_A=trans_A, trans_B=trans_B, in_dtype=T.float16,
                              out_dtype=T.float16, accum_dtype=T.float32, with_bias=with_bias)
    torch.manual_seed(1)
    a = torch.randn((K, M) if trans_A else (M, K), device=device, dtype=torch.float16)
    b = torch.randn((N, K) if trans_B else (K, N), device=device, dtype=torch.float16)
    bias = torch.randn(N, device=device)
    ref = (a.float().T if trans_A else a.float()) @ (b.float().T if trans_B else b.float())
    ref = (ref + bias if with_bias else ref).half()
    args = (a, b, bias) if with_bias else (a, b)
    programs = [template.equivalent_function()] + [template.program(h) for h in template.recommend_hints(topk=3)]
    for program in programs:
        assert_close(tritile.compile(program, out_idx=[-1])(*args), ref)


# -- Analyzer -----------------------------------------------------------------------------------


M, N, K = 512, 384, 256


@tritile.jit
def eager_gemm(A, B, block_M=None, block_N=None, block_K=None, num_stages=None, thread_num=None):
    """examples/analyze/example_gemm_analyze.py's kernel."""
    dtype, accum_dtype = T.float16, T.float32
    A: T.Tensor((M, K), dtype)
    B: T.Tensor((N, K), dtype)
    C = T.empty((M, N), dtype)
    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=thread_num) as (bx, by):
        A_shared = T.alloc_shared((block_M, block_K), dtype)
        B_shared = T.alloc_shared((block_N, block_K), dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
        C_shared = T.alloc_shared((block_M, block_N), dtype)
        T.clear(C_local)
        for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
            T.copy(A[by * block_M, k * block_K], A_shared)
            T.copy(B[bx * block_N, k * block_K], B_shared)
            T.gemm(A_shared, B_shared, C_local, transpose_B=True)
        T.copy(C_local, C_shared)
        T.copy(C_shared, C[by * block_M, bx * block_N])
    return C


def test_analyzer_gemm():
    block_M, block_N, block_K = 128, 64, 32
    func = eager_gemm.get_tir(block_M=block_M, block_N=block_N, block_K=block_K, num_stages=3, thread_num=128)
    arch = CUDA("cuda:90")
    result = Analyzer.analysis(func, arch)
    assert isinstance(result, AnalysisResult)
    assert result.total_flops == 2 * M * N * K
    # A is read once per column of blocks, B once per row of blocks, C written once
    expected_bytes = 2 * (M * K * (N // block_N) + N * K * (M // block_M) + M * N)
    assert result.total_global_bytes == expected_bytes
    assert result.expected_tflops == arch.peak_tflops and result.expected_bandwidth_GBps == arch.memory_bandwidth_GBps
    assert result.estimated_time == pytest.approx(max(expected_bytes / (arch.memory_bandwidth_GBps * 1e9),
                                                      2 * M * N * K / (arch.peak_tflops * 1e12)))
    # the same program as a lazy prim_func (MatmulTemplate's) and as a compiled JITKernel
    template = MatmulTemplate(M=M, N=N, K=K, in_dtype=T.float16, out_dtype=T.float16, accum_dtype=T.float32)
    assert Analyzer.analysis(template.equivalent_function(), arch).total_flops == 2 * M * N * K
    kernel = eager_gemm.compile(block_M=block_M, block_N=block_N, block_K=block_K, num_stages=3, thread_num=128)
    assert Analyzer.analysis(kernel, arch).total_global_bytes == expected_bytes


def copy_kernel(M, N, block, dtype):
    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block), T.ceildiv(M, block), threads=128) as (bx, by):
            tile = T.alloc_shared((block, block), dtype)
            T.copy(A[by * block, bx * block], tile)
            T.copy(tile, B[by * block, bx * block])

    return main


def scale_kernel(M, N, block):
    @T.prim_func
    def main(A: T.Tensor((M, N), T.float32), B: T.Tensor((N,), T.float16), C: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(M, block), threads=128) as bx:
            for i, j in T.Parallel(block, N):
                C[bx * block + i, j] = A[bx * block + i, j] * B[j]

    return main


def test_analyzer_exact_bytes():
    arch = CUDA("cuda:90")
    result = Analyzer.analysis(copy_kernel(256, 192, 64, T.float16), arch)
    assert (result.total_flops, result.total_global_bytes) == (0, 2 * 256 * 192 * 2)
    assert result.estimated_time == pytest.approx(2 * 256 * 192 * 2 / 3350e9)
    # element accesses inside T.Parallel: A and C per element (4 bytes), B per element too (2 bytes)
    result = Analyzer.analysis(scale_kernel(128, 64, 32), arch)
    assert result.total_global_bytes == 128 * 64 * (4 + 2 + 4)


def _value(x) -> int:
    return x.value if isinstance(x, tritile.ir.nodes.Const) else x


def test_get_tir():
    @tritile.jit
    def lazy(M, block):
        return copy_kernel(M, 64, block, T.float32)

    func = lazy.get_tir(128, block=32)
    assert isinstance(func, tritile.ir.nodes.PrimFunc) and _value(func.kernel.grid[1]) == 4

    @tritile.jit
    def eager(X, block: int = 32):
        n = T.const("n")
        X: T.Tensor((n,), T.float32)
        Y = T.empty((n,), T.float32)
        with T.Kernel(T.ceildiv(n, block), threads=128) as bx:
            T.copy(X[bx * block:(bx + 1) * block], Y[bx * block:(bx + 1) * block])
        return Y

    by_name = eager.get_tir(n=256, block=64)
    from_tensor = eager.get_tir(torch.empty(512))
    assert _value(by_name.params[0].shape[0]) == 256 and _value(by_name.kernel.grid[0]) == 4
    assert _value(from_tensor.params[0].shape[0]) == 512 and _value(from_tensor.kernel.grid[0]) == 16
    assert Analyzer.analysis(from_tensor).total_global_bytes == 2 * 512 * 4
