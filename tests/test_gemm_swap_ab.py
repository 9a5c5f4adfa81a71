"""The swapped product of a thin GEMM (tritile/ops/gemm_loop.py's `accumulate_tiles(swap_ab=True)`:
each program computes its output tile's transpose B^T A^T, A's few rows on wgmma's N side, and
transposes it back): it equals torch's product for every operand layout, through the fused
epilogue, the split-K kernel and the batched GEMM (the reference interpreter on CPU, or Triton's
under TRITILE_BACKEND=triton); `tile_config` picks it for A of at most 32 rows on CUDA; on sm_90
it compiles to wgmma with A's 16 (32) rows as N, unpadded, and five (four) 256-deep stages."""
import itertools

import pytest
import torch

import tritile.language as T
from tritile.ops.gemm_loop import THIN_SWAP_ROWS, tile_config
from tritile.ops.linear import matmul_epilogue
from tritile.ops.matmul import batched_matmul, matmul
from tritile.ops.split_k import SplitKGemm, split_k_config
from tritile.runtime.target import Target

H100 = Target("cuda", 90)
DTYPES = {torch.float16: T.float16, torch.bfloat16: T.bfloat16}
TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 5e-2}


def _close(out, expected, dtype):
    scale = expected.abs().max().item()
    assert (out.float() - expected).abs().max().item() <= TOLERANCE[dtype] * max(scale, 1.0)


@pytest.mark.parametrize("M, N, K, block_M, dtype", [
    (5, 96, 160, 16, torch.float16),     # 5 rows of a 16-row tile, N and K ragged
    (16, 128, 256, 16, torch.bfloat16),
    (20, 70, 96, 32, torch.float16),     # a 32-row tile, N ragged
])
@pytest.mark.parametrize("trans_a, trans_b", list(itertools.product([False, True], repeat=2)))
def test_swapped_gemm_equals_the_product(M, N, K, block_M, dtype, trans_a, trans_b):
    a, b = torch.randn(M, K).to(dtype), torch.randn(K, N).to(dtype)
    kernel = matmul.compile(M=M, N=N, K=K, dtype=DTYPES[dtype], block_M=block_M, block_N=64, block_K=32,
                            num_stages=3, trans_A=trans_a, trans_B=trans_b, swap_ab=True)
    out = kernel(a.t().contiguous() if trans_a else a, b.t().contiguous() if trans_b else b)
    assert out.shape == (M, N) and out.dtype == dtype
    _close(out, a.float() @ b.float(), dtype)


def test_swapped_gemm_keeps_the_fused_epilogue():
    M, N, K = 12, 96, 128
    x, w = torch.randn(M, K).half(), torch.randn(N, K).half()
    bias, residual = torch.randn(N).half(), torch.randn(M, N).half()
    pre = torch.empty(M, N, dtype=torch.float16)
    kernel = matmul_epilogue.compile(M=M, N=N, K=K, dtype=T.float16, block_M=16, block_N=64, block_K=32,
                                     num_stages=2, has_bias=True, activation="gelu_tanh", has_residual=True,
                                     keep_pre=True, swap_ab=True)
    out = kernel(x, w, bias, residual, pre)
    expected_pre = x.float() @ w.float().t() + bias.float()
    _close(pre, expected_pre, torch.float16)
    expected = torch.nn.functional.gelu(expected_pre, approximate="tanh") + residual.float()
    _close(out, expected, torch.float16)


def test_swapped_split_gemm_equals_the_product():
    M, N, K = 16, 64, 256
    a, w = torch.randn(M, K).half(), torch.randn(N, K).half()
    config = dict(block_M=16, block_N=64, block_K=32, num_stages=2, threads=128, swap_ab=True, splits=3)
    gemm = SplitKGemm.build(a, w, config, T.float16, trans_B=True)
    out = gemm(a, w)
    _close(out, a.float() @ w.float().t(), torch.float16)
    assert not gemm.counters.any()


def test_swapped_batched_gemm_equals_the_product():
    a, b = torch.randn(3, 8, 64).to(torch.bfloat16), torch.randn(3, 64, 80).to(torch.bfloat16)
    kernel = batched_matmul.compile(BATCH=3, M=8, N=80, K=64, dtype=T.bfloat16, block_M=16, block_N=64,
                                    block_K=32, num_stages=2, swap_ab=True)
    _close(kernel(a, b), torch.bmm(a.float(), b.float()), torch.bfloat16)


def test_tile_config_swaps_a_thin_gemm():
    for M in (1, 8, 16):
        assert tile_config("cuda", M, 8192, 8192) == dict(block_M=16, block_N=64, block_K=256, num_stages=5,
                                                           threads=128, swap_ab=True)
    assert tile_config("cuda", THIN_SWAP_ROWS, 4096, 4096) == dict(block_M=32, block_N=64, block_K=256,
                                                                    num_stages=4, threads=128, swap_ab=True)
    # wider A, a short K, fp32 and the CPU keep the unswapped tiles
    for args in [(64, 4096, 4096), (16, 4096, 512)]:
        assert "swap_ab" not in tile_config("cuda", *args)
    assert "swap_ab" not in tile_config("cuda", 16, 4096, 4096, torch.float32)
    assert "swap_ab" not in tile_config("cpu", 16, 4096, 4096)
    # 64 swapped programs at 16 x 4096 x 4096 run unsplit; 16 at 16 x 1024 x 4096 in two shares
    assert split_k_config("cuda", 16, 4096, 4096) is None
    assert split_k_config("cuda", 16, 1024, 4096) == dict(tile_config("cuda", 16, 1024, 4096), splits=2)


@pytest.mark.parametrize("M, n", [(16, 16), (32, 32)])
def test_sm90_swapped_gemm_puts_a_rows_on_wgmma_n(M, n):
    config = tile_config("cuda", M, 8192, 8192)
    kernel = matmul.compile(M=M, N=8192, K=8192, dtype=T.float16, target="cuda:90", **config)
    ptx = kernel.get_source("ptx")
    assert f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16" in ptx
    assert "wgmma.mma_async.sync.aligned.m64n64k16" not in ptx  # A is not padded to 64 rows
    stage_bytes = (config["block_M"] + config["block_N"]) * config["block_K"] * 2
    planned = config["num_stages"] * stage_bytes
    assert planned <= kernel._codegen(H100).metadata.shared <= H100.shared_memory_limit


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K", [(1, 8192, 8192), (16, 4096, 4096), (32, 4096, 1024), (16, 1024, 4096)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_thin_ops_take_the_swapped_product(M, N, K, dtype):
    """tritile.mm and tritile.linear (with an epilogue) at decoding's shapes, where tile_config
    swaps the operands (and 16 x 1024 x 4096 also splits K), equal torch's."""
    x, w = torch.randn(M, K, device="cuda", dtype=dtype), torch.randn(N, K, device="cuda", dtype=dtype)
    bias = torch.randn(N, device="cuda", dtype=dtype)
    assert tile_config("cuda", M, N, K, dtype)["swap_ab"]
    _close(torch.ops.tritile.mm(x, w.t()), x.float() @ w.float().t(), dtype)
    _close(torch.ops.tritile.mm(x, w.t().contiguous()), x.float() @ w.float().t(), dtype)
    out, _ = torch.ops.tritile.linear(x, w, bias, None, "silu", False)
    _close(out, torch.nn.functional.silu(x.float() @ w.float().t() + bias.float()), dtype)
