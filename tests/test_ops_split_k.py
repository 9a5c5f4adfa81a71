"""Split-K GEMMs (tritile/ops/split_k.py): the partial sums and their reduction equal torch's
product (through the reference interpreter on CPU, the compiled kernels on a GPU), tritile.mm and
tritile.linear take the split path where the plan says so (`TRITILE_SPLIT_K=on` forces it on
CPU), and the plan follows its measured rule."""
import pytest
import torch

import tritile.language as T
from tritile.ops import linear as tritile_linear
from tritile.ops import matmul as tritile_matmul
from tritile.ops.epilogues import activation_fn
from tritile.ops.split_k import SplitKGemm, matmul_partial_sums, reduce_partial_sums, reduction_rows, split_k_config

DTYPES = {torch.float16: T.float16, torch.bfloat16: T.bfloat16, torch.float32: T.float32}
TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 5e-2, torch.float32: 1e-4}


def _operands(M, N, K, dtype, trans_a, trans_b, device="cpu"):
    """Random A (M, K), B (K, N) and the tensors the kernel takes (a transposed operand as the
    contiguous (K, M) / (N, K) matrix it is the transpose of)."""
    a = torch.randn(M, K, device=device).to(dtype)
    b = torch.randn(K, N, device=device).to(dtype)
    return a, b, (a.t().contiguous() if trans_a else a), (b.t().contiguous() if trans_b else b)


@pytest.mark.parametrize("M, N, K, splits, trans_a, trans_b, dtype", [
    (16, 96, 200, 3, False, False, torch.float16),    # 7 K tiles in shares of 3: the last one short
    (70, 130, 256, 2, True, False, torch.bfloat16),   # ragged M and N, A read transposed
    (33, 64, 320, 4, False, True, torch.float32),     # B read transposed
    (40, 64, 96, 4, False, False, torch.float16),     # 3 K tiles in 4 shares: the last share reads only zeros
])
def test_partial_sums_and_reduction_equal_the_product(M, N, K, splits, trans_a, trans_b, dtype):
    a, b, a_operand, b_operand = _operands(M, N, K, dtype, trans_a, trans_b)
    config = dict(block_M=64, block_N=64, block_K=32, num_stages=2, threads=128, splits=splits)
    gemm = SplitKGemm.build(a_operand, b_operand, config, DTYPES[dtype], trans_A=trans_a, trans_B=trans_b)
    partials = gemm.partial_sums(a_operand, b_operand)
    assert partials.shape == (splits, M, N) and partials.dtype == torch.float32
    expected = a.float() @ b.float()
    torch.testing.assert_close(partials.sum(0), expected, rtol=1e-4, atol=1e-3)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(gemm(a_operand, b_operand).float(), expected, rtol=tol, atol=tol * K ** 0.5)


def test_reduction_applies_the_fused_epilogue():
    M, N, S = 48, 160, 3
    partials = torch.randn(S, M, N)
    bias, residual = torch.randn(N).half(), torch.randn(M, N).half()
    pre = torch.empty(M, N, dtype=torch.float16)
    kernel = reduce_partial_sums.kernel_for(partials, bias, residual, pre, dtype=T.float16, block_M=reduction_rows(M),
                                            has_bias=True, activation="silu", has_residual=True, keep_pre=True)
    out = kernel(partials, bias, residual, pre)
    expected_pre = partials.sum(0) + bias.float()
    torch.testing.assert_close(pre.float(), expected_pre, rtol=1e-2, atol=1e-2)
    expected = activation_fn("silu")(expected_pre) + residual.float()
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=2e-2)


@pytest.fixture
def split_everywhere(monkeypatch):
    monkeypatch.setenv("TRITILE_SPLIT_K", "on")
    tritile_matmul._gemms.clear()
    tritile_linear._linears.clear()
    yield
    tritile_matmul._gemms.clear()
    tritile_linear._linears.clear()


@pytest.mark.parametrize("trans_b", [False, True])
def test_tritile_mm_runs_the_split_gemm_where_planned(split_everywhere, trans_b):
    a = torch.randn(24, 160).half()
    b = torch.randn(72, 160).half().t() if trans_b else torch.randn(160, 72).half()
    out = torch.ops.tritile.mm(a, b)
    (kernel, _, remembered_trans_b), = tritile_matmul._gemms.values()
    assert isinstance(kernel, SplitKGemm) and remembered_trans_b == trans_b
    torch.testing.assert_close(out.float(), a.float() @ b.float(), rtol=2e-2, atol=5e-2)


def test_tritile_linear_keeps_its_epilogue_when_split(split_everywhere):
    x, weight = torch.randn(2, 9, 128).bfloat16(), torch.randn(80, 128).bfloat16()
    bias, residual = torch.randn(80).bfloat16(), torch.randn(2, 9, 80).bfloat16()
    out, pre = torch.ops.tritile.linear(x, weight, bias, residual, "gelu_tanh", True)
    (call,) = tritile_linear._linears.values()
    assert isinstance(call.kernel, SplitKGemm)
    expected_pre = x.float() @ weight.float().t() + bias.float()
    torch.testing.assert_close(pre.float(), expected_pre, rtol=5e-2, atol=1e-1)
    torch.testing.assert_close(out.float(), activation_fn("gelu_tanh")(expected_pre) + residual.float(), rtol=5e-2,
                               atol=1e-1)


def test_plan_follows_the_measured_rule(monkeypatch):
    monkeypatch.delenv("TRITILE_SPLIT_K", raising=False)
    # a weight gradient with few wide tiles and a long K: two shares of 128 K tiles each fill the SMs
    assert split_k_config("cuda", 1024, 1024, 16384, torch.bfloat16)["splits"] == 2
    assert split_k_config("cuda", 512, 512, 8192, torch.float16)["splits"] == 4
    for shape in [(16, 4096, 4096), (64, 1024, 1024), (128, 8192, 8192),  # small M: splitting measured slower
                  (3072, 1024, 16384), (4096, 4096, 4096),                # enough tiles to fill the SMs
                  (1024, 1024, 1024)]:                                    # K too short to share
        assert split_k_config("cuda", *shape, torch.float16) is None, shape
    assert split_k_config("cpu", 1024, 1024, 16384, torch.float16) is None
    assert split_k_config("cuda", 1024, 1024, 16384, torch.float32) is None
    monkeypatch.setenv("TRITILE_SPLIT_K", "off")
    assert split_k_config("cuda", 1024, 1024, 16384, torch.float16) is None
    monkeypatch.setenv("TRITILE_SPLIT_K", "on")
    assert split_k_config("cpu", 64, 64, 256, torch.float16)["splits"] >= 2
    assert split_k_config("cpu", 64, 64, 32, torch.float16) is None  # one K tile: nothing to split


def _split_weight_gradient_kernels():
    config = split_k_config("cuda", 1024, 1024, 16384, torch.bfloat16)
    return matmul_partial_sums.compile(M=1024, N=1024, K=16384, dtype=T.bfloat16, trans_A=True, **config)


def _split_reduction_kernel():
    return reduce_partial_sums.compile(S=2, M=1024, N=1024, dtype=T.bfloat16, has_bias=True, activation="gelu",
                                       block_M=reduction_rows(1024))


# for tests/test_kernels_compile.py (sm_90 and sm_80)
COMPILE_CASES = {
    "split-k-partial-sums-weight-gradient-bf16": _split_weight_gradient_kernels,
    "split-k-reduction-bias-gelu-bf16": _split_reduction_kernel,
}


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K, trans_a", [(1024, 1024, 16384, True), (512, 768, 8192, False)])
def test_split_gemm_on_the_gpu(M, N, K, trans_a):
    """The shapes the plan splits, through tritile.mm on the device (the weight gradient's
    transposed A read in place)."""
    assert split_k_config("cuda", M, N, K, torch.bfloat16) is not None
    a = torch.randn(K, M, device="cuda").bfloat16().t() if trans_a else torch.randn(M, K, device="cuda").bfloat16()
    b = torch.randn(K, N, device="cuda").bfloat16()
    expected = a.float() @ b.float()
    torch.testing.assert_close(torch.ops.tritile.mm(a, b).float(), expected, rtol=2e-2, atol=2e-2 * K ** 0.5)
