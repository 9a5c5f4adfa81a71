"""`torch.ops.tritile.bmm` (the batched T-language GEMM) and `torch.ops.tritile.linear` (one GEMM
with a bias / activation / residual epilogue), against torch, forward and backward (CPU: the
reference interpreter)."""
import pytest
import torch
import torch.nn.functional as F

from tritile.ops import matmul as tritile_matmul
from tritile.ops.linear import activation_fn

TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def assert_close(actual, expected):
    tol = TOLERANCE[actual.dtype]
    torch.testing.assert_close(actual.float(), expected.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True), (True, True)])
def test_bmm_reads_transposed_batches_in_place(trans_a, trans_b, gemm_kernel_requests):
    a = torch.randn(3, 48, 40).transpose(1, 2) if trans_a else torch.randn(3, 40, 48)  # (3, 40, 48)
    b = torch.randn(3, 24, 48).transpose(1, 2) if trans_b else torch.randn(3, 48, 24)  # (3, 48, 24)
    assert_close(torch.ops.tritile.bmm(a, b), torch.bmm(a, b))
    assert gemm_kernel_requests == [(True, True, trans_a, trans_b)]


def test_bmm_backward_and_half_precision():
    a = torch.randn(2, 33, 20, dtype=torch.float16, requires_grad=True)
    b = torch.randn(2, 20, 17, dtype=torch.float16, requires_grad=True)
    grad = torch.randn(2, 33, 17, dtype=torch.float16)
    torch.ops.tritile.bmm(a, b).backward(grad)
    a2, b2 = (t.detach().float().requires_grad_() for t in (a, b))
    torch.bmm(a2, b2).backward(grad.float())
    assert_close(a.grad, a2.grad)
    assert_close(b.grad, b2.grad)
    with pytest.raises(ValueError, match="'a' must be 3-D"):
        torch.ops.tritile.bmm(torch.randn(4, 4), torch.randn(1, 4, 4))
    with pytest.raises(ValueError, match="'b' has shape"):
        torch.ops.tritile.bmm(torch.randn(2, 4, 4), torch.randn(3, 4, 4))


@pytest.mark.parametrize("activation", ["none", "relu", "silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("bias, residual", [(True, False), (True, True), (False, True)])
def test_linear_epilogue_forward_and_backward(activation, bias, residual):
    x = torch.randn(2, 20, 48, requires_grad=True)
    weight = torch.randn(40, 48, requires_grad=True)
    b = torch.randn(40, requires_grad=True) if bias else None
    res = torch.randn(2, 20, 40, requires_grad=True) if residual else None
    out, pre = torch.ops.tritile.linear(x, weight, b, res, activation, True)
    grad = torch.randn_like(out)
    out.backward(grad)
    leaves = [t for t in (x, weight, b, res) if t is not None]
    ours = [t.grad for t in leaves]
    for t in leaves:
        t.grad = None
    expected_pre = F.linear(x, weight, b)
    expected = activation_fn(activation)(expected_pre) + (res if residual else 0)
    expected.backward(grad)
    assert_close(pre, expected_pre)
    assert_close(out, expected)
    for got, leaf in zip(ours, leaves):
        assert_close(got, leaf.grad)


def test_linear_without_the_preactivation_and_in_bf16():
    x, weight, b = torch.randn(16, 32, dtype=torch.bfloat16), torch.randn(24, 32, dtype=torch.bfloat16), \
        torch.randn(24, dtype=torch.bfloat16)
    out, pre = torch.ops.tritile.linear(x, weight, b, None, "gelu_tanh", False)
    assert pre.numel() == 0
    assert_close(out, F.gelu(F.linear(x.float(), weight.float(), b.float()), approximate="tanh"))
    with pytest.raises(ValueError, match="'activation'"):
        torch.ops.tritile.linear(x, weight, b, None, "tanh", False)
    with pytest.raises(TypeError, match="'bias'"):
        torch.ops.tritile.linear(x, weight, b.float(), None, "none", False)
    with pytest.raises(ValueError, match="'residual'"):
        torch.ops.tritile.linear(x, weight, None, torch.randn(16, 23, dtype=torch.bfloat16), "none", False)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["none", "gelu", "gelu_tanh", "silu", "relu"])
def test_linear_epilogue_on_the_gpu(activation):
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16) / 32
    b, res = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for shape in ((4096,), (4096, 4096)))
    out, pre = torch.ops.tritile.linear(x, weight, b, res, activation, True)
    expected_pre = F.linear(x.float(), weight.float(), b.float())
    torch.testing.assert_close(pre.float(), expected_pre, rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(out.float(), activation_fn(activation)(expected_pre) + res.float(), rtol=2e-2, atol=5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (False, True), (True, False)])
def test_bmm_on_the_gpu(trans_a, trans_b):
    a = torch.randn(16, 1024, 512, device="cuda").half()
    b = torch.randn(16, 512, 768, device="cuda").half()
    a = a.transpose(1, 2).contiguous().transpose(1, 2) if trans_a else a
    b = b.transpose(1, 2).contiguous().transpose(1, 2) if trans_b else b
    torch.testing.assert_close(torch.ops.tritile.bmm(a, b).float(), torch.bmm(a.float(), b.float()),
                               rtol=1e-2, atol=5e-2)


def _epilogue_kernel(activation, dtype):
    from tritile.ops.linear import matmul_epilogue

    config = tritile_matmul.tile_config("cuda", 4096, 4096, 1024, torch.bfloat16)
    return matmul_epilogue.compile(M=4096, N=4096, K=1024, dtype=dtype, has_bias=True, activation=activation,
                                   has_residual=True, keep_pre=True, **config)


def _bmm_kernel(trans_b):
    import tritile.language as T

    return tritile_matmul.batched_matmul.compile(BATCH=16, M=1024, N=1024, K=64, dtype=T.float16, trans_B=trans_b,
                                                 **tritile_matmul.tile_config("cuda", 1024, 1024, 64))


# for tests/test_kernels_compile.py (sm_90 and sm_80): the CUDA configs of the torch.compile ops
COMPILE_CASES = {
    "linear-gelu-bias-residual-pre-bf16": lambda: _epilogue_kernel("gelu", "bfloat16"),
    "bmm-trans_b-fp16": lambda: _bmm_kernel(True),
}


def test_a_fused_epilogue_s_two_stores_share_one_staging_tile():
    """The kept pre-activation and the output of a persistent 128x256 tile loop store through one
    64 KB staging tile (the second store waits until TMA has read the first), which leaves the
    room of the third pipeline stage: the Gluon backend compiles it for sm_90 within 227 KB."""
    import tritile.language as T
    from tritile.ops.linear import matmul_epilogue

    kernel = matmul_epilogue.compile(M=4096, N=4096, K=1024, dtype=T.bfloat16, has_bias=True, activation="gelu_tanh",
                                     keep_pre=True, block_M=128, block_N=256, block_K=64, num_stages=3, threads=256,
                                     target="cuda:90", backend="gluon")
    source = kernel.get_source("gluon")
    assert "for tile_iter in range" in source  # the persistent tile loop, where staging tiles live across tiles
    staging = [line.split("=")[0].strip() for line in source.splitlines()
               if "gl.allocate_shared_memory(gl.bfloat16, [128, 256]" in line]
    assert len(staging) == 1, staging
    assert source.count(f"Pre_desc, [(by * 128), (bx * 256)], {staging[0]})") == 1
    assert source.count(f"C_desc, [(by * 128), (bx * 256)], {staging[0]})") == 1
    assert "wgmma.mma_async" in kernel.get_source("ptx")
