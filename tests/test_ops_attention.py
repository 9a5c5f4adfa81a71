"""`torch.ops.tritile.attention` (tritile/ops/attention.py): FlashAttention forward and backward
as T-language kernels behind a torch operator with autograd, against
`F.scaled_dot_product_attention` (CPU: the reference interpreter)."""
import re

import pytest
import torch
import torch.nn.functional as F

import tritile
from tritile.ops.attention import as_passed, attention

TOLERANCE = {torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}


def reference(q, k, v, grad, **sdpa):
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, **sdpa)
    out.backward(grad.float())
    return out, q.grad, k.grad, v.grad


@pytest.mark.parametrize("dtype, heads_kv, seq_q, seq_kv, dim, causal, scale", [
    (torch.float32, 2, 48, 48, 16, True, None),     # ragged: 48 queries / keys on 32-wide tiles
    (torch.float32, 2, 40, 72, 32, False, 0.3),     # more keys than queries, masked ragged key tile
    (torch.float16, 1, 32, 32, 16, True, None),     # GQA: 4 query heads on one K/V head
    (torch.bfloat16, 2, 64, 64, 64, False, None),   # GQA 2:1
], ids=["fp32-causal-ragged", "fp32-cross-scale", "fp16-gqa4-causal", "bf16-gqa2-d64"])
def test_attention_forward_and_backward_match_sdpa(dtype, heads_kv, seq_q, seq_kv, dim, causal, scale):
    batch, heads = 2, 4
    q = torch.randn(batch, heads, seq_q, dim, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(batch, heads_kv, seq_kv, dim, dtype=dtype, requires_grad=True) for _ in range(2))
    grad = torch.randn(batch, heads, seq_q, dim, dtype=dtype)
    out = attention(q, k, v, causal, scale)
    out.backward(grad)
    expected = reference(q, k, v, grad, is_causal=causal, scale=scale, enable_gqa=heads_kv != heads)
    tol = TOLERANCE[dtype]
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, q.grad, k.grad, v.grad), expected):
        assert got.dtype == dtype and got.shape == want.shape, name
        torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol, msg=name)


def qkv_views(batch, seq, heads, dim, dtype, device="cpu"):
    """q, k, v [batch, heads, seq, dim] as a transformer slices them out of one fused projection
    (strides (seq * 3 * heads * dim, dim, 3 * heads * dim, 1)), and the projection."""
    qkv = torch.randn(batch, seq, 3 * heads * dim, device=device).to(dtype).requires_grad_()
    return (*qkv.view(batch, seq, 3, heads, dim).permute(2, 0, 3, 1, 4), qkv)


@pytest.mark.parametrize("dtype, causal", [(torch.float32, True), (torch.float16, False)])
def test_attention_reads_views_of_a_fused_projection_in_place(dtype, causal, monkeypatch):
    """q, k, v sliced out of a qkv projection and the output's gradient (a transposed [batch, seq,
    heads, dim] tensor) reach the kernels as they are (declared T.StridedTensor, no copy), and the
    output comes back laid out [batch, seq, heads, dim], as SDPA's does."""
    from tritile.ops import attention as ops

    copied = []
    contiguous = torch.Tensor.contiguous
    monkeypatch.setattr(torch.Tensor, "contiguous", lambda t, *a, **k: copied.append(t.shape) or contiguous(t, *a, **k))
    batch, seq, heads, dim = 2, 48, 2, 32
    q, k, v, qkv = qkv_views(batch, seq, heads, dim, dtype)
    out = attention(q, k, v, causal)
    assert out.stride() == (seq * heads * dim, dim, heads * dim, 1)
    grad = torch.randn(batch, seq, heads * dim, dtype=dtype)
    out.transpose(1, 2).reshape(batch, seq, heads * dim).backward(grad)
    assert copied == []
    expected = reference(q, k, v, grad.view(batch, seq, heads, dim).transpose(1, 2), is_causal=causal)
    expected_qkv = torch.stack([g.transpose(1, 2) for g in expected[1:]], dim=2).reshape(qkv.shape)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), expected[0], rtol=tol, atol=tol)
    torch.testing.assert_close(qkv.grad.float(), expected_qkv, rtol=tol, atol=tol)
    sources = [prepared.kernel.get_source("tile") for prepared, _ in ops._forwards.values()]
    assert any("Q: T.StridedTensor" in text and "Output: T.StridedTensor" in text for text in sources)


def test_attention_on_an_unaligned_view_copies_it_with_its_strides():
    """A view 2 bytes off 16-byte alignment (kernels are compiled for aligned addresses) after an
    aligned one of the same strides: copied with those strides, so the kernel the signature
    remembered takes it, and the results match SDPA."""
    batch, seq, heads, dim = 1, 32, 2, 16
    for offset in (0, 1):  # elements of fp32: 0 and 4 bytes
        qkv = torch.randn(batch * seq * 3 * heads * dim + offset)[offset:].view(batch, seq, 3 * heads * dim)
        q, k, v = qkv.view(batch, seq, 3, heads, dim).permute(2, 0, 3, 1, 4)
        assert (q.data_ptr() % 16 == 0) == (offset == 0)
        passed = as_passed(q)  # what the kernels get (the interpreter does not check alignment)
        assert passed.data_ptr() % 16 == 0 and passed.stride() == q.stride() and torch.equal(passed, q)
        assert (passed is q) == (offset == 0)
        torch.testing.assert_close(attention(q, k, v, True), F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                   rtol=2e-4, atol=2e-4)


def test_the_forward_returns_the_log_sum_exp():
    q, k, v = (torch.randn(1, 2, 32, 16) for _ in range(3))
    out, lse = torch.ops.tritile.attention(q, k, v, False, None)
    scores = (q @ k.transpose(-1, -2)) / 16 ** 0.5
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1) / torch.log(torch.tensor(2.0)), rtol=1e-4, atol=1e-4)


def test_attention_rejects_what_its_kernels_do_not_take():
    q = torch.randn(1, 4, 32, 16)
    with pytest.raises(TypeError, match="'k'"):
        attention(q, q.half(), q)
    with pytest.raises(ValueError, match="'q' has head dim 24"):
        attention(*(torch.randn(1, 4, 32, 24) for _ in range(3)))
    with pytest.raises(ValueError, match="'k' has 3 heads"):
        attention(q, torch.randn(1, 3, 32, 16), torch.randn(1, 3, 32, 16))
    with pytest.raises(ValueError, match="causal attention with 32 queries and 16 keys"):
        attention(q, torch.randn(1, 4, 16, 16), torch.randn(1, 4, 16, 16), True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dim, causal, heads_kv", [(64, True, 16), (128, False, 4), (128, True, 16)])
def test_attention_on_the_gpu(dtype, dim, causal, heads_kv):
    q = torch.randn(2, 16, 1024, dim, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(2, heads_kv, 1024, dim, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    grad = torch.randn_like(q)
    out = attention(q, k, v, causal)
    out.backward(grad)
    expected = reference(q, k, v, grad, is_causal=causal, enable_gqa=heads_kv != 16)
    for got, want in zip((out, q.grad, k.grad, v.grad), expected):
        torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dim, causal", [(64, True), (128, False), (128, True)])
def test_attention_on_views_of_a_fused_projection_on_the_gpu(dtype, dim, causal):
    """q / k / v permuted slices of one projection and a transposed [batch, seq, heads, dim] output
    gradient: on sm_90 their tiles move by 4-D TMA (Gluon's full-rank descriptors)."""
    batch, seq, heads = 2, 1024, 16
    q, k, v, qkv = qkv_views(batch, seq, heads, dim, dtype, device="cuda")
    grad = torch.randn(batch, seq, heads * dim, device="cuda", dtype=dtype)
    out = attention(q, k, v, causal)
    out.transpose(1, 2).reshape(batch, seq, heads * dim).backward(grad)
    expected = reference(q, k, v, grad.view(batch, seq, heads, dim).transpose(1, 2), is_causal=causal)
    expected_qkv = torch.stack([g.transpose(1, 2) for g in expected[1:]], dim=2).reshape(qkv.shape)
    torch.testing.assert_close(out.float(), expected[0], rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(qkv.grad.float(), expected_qkv, rtol=3e-2, atol=3e-2)


def _cuda_kernel(kernel, dim, causal, groups, dtype="bfloat16"):
    from tritile.ops import attention as ops

    args = dict(batch=2, heads=16, seq=1024, dim=dim, is_causal=causal, groups=groups, dtype=dtype)
    return getattr(ops, f"flashattn_{kernel}")(**args, **ops.tile_config("cuda", dim)[kernel])


@pytest.mark.parametrize("causal", [False, True])
def test_gqa_backward_programs_walk_the_group_in_one_loop(causal):
    """A backward program takes one K/V head's key block through its group's query heads in one
    software-pipelined loop over (head, query block) steps and stores dK / dV once, in the
    inputs' dtype."""
    from tritile.ops import attention as ops

    kernel = tritile.compile(ops.flashattn_bwd.fn(2, 16, 1024, 64, causal, groups=4, dtype="bfloat16",
                                                  **ops.tile_config("cuda", 64, causal)["bwd"]),
                             target="cuda:90", backend="gluon")
    source = kernel.get_source("gluon")
    assert "for step_t in range(1, " in source, source
    assert source.count("software-pipelined loop") == 1
    assert re.search(r"_store_tile\d+ = gl\.allocate_shared_memory\(gl\.bfloat16, ", source), source


# for tests/test_kernels_compile.py (sm_90 and sm_80): the CUDA configs torch.ops.tritile.attention launches
COMPILE_CASES = {
    "fwd-d128-causal-gqa4-bf16": lambda: _cuda_kernel("fwd", 128, True, 4),
    "bwd-d64-gqa2-bf16": lambda: _cuda_kernel("bwd", 64, False, 2),
}
