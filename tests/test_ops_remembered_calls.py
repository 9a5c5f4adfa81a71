"""The torch operators' remembered call signatures (tritile/ops/signatures.py): a repeated call
skips the checks and kernel choice, gives what a fresh call gives, and every bad argument still
raises TypeError / ValueError naming it (CPU: the reference interpreter)."""
import pytest
import torch
import torch.nn.functional as F

from tritile.ops import attention as tritile_attention
from tritile.ops import linear as tritile_linear
from tritile.ops import matmul as tritile_matmul
from tritile.ops.linear import activation_fn
from tritile.ops.signatures import Remembered, signature


@pytest.fixture
def first_calls(monkeypatch) -> list:
    """The operator calls that took the first-call path (checks, kernel choice), one entry each;
    every remembered call forgotten first."""
    calls = []
    for module, memo, first in ((tritile_matmul, "_gemms", "_first_gemm"),
                                (tritile_linear, "_linears", "_first_linear"),
                                (tritile_attention, "_forwards", "_first_attention")):
        monkeypatch.setattr(module, memo, Remembered())
        original = getattr(module, first)
        monkeypatch.setattr(module, first, lambda *args, _f=original, _n=first: calls.append(_n) or _f(*args))
    return calls


def forget_remembered_calls():
    for memo in (tritile_matmul._gemms, tritile_linear._linears, tritile_attention._forwards):
        memo.clear()


def test_a_repeated_gemm_runs_the_remembered_kernel_and_matches_a_fresh_call(first_calls):
    a, b = torch.randn(40, 48), torch.randn(48, 24)
    w = torch.randn(24, 48)  # w.t(): the transposed layout, another signature of the same shape
    strided = torch.randn(40, 96)[:, ::2]  # neither contiguous nor transposed: copied, every call
    batch_a, batch_b = torch.randn(3, 40, 48), torch.randn(3, 24, 48).transpose(1, 2)
    for _ in range(3):
        results = [torch.ops.tritile.mm(a, b), torch.ops.tritile.mm(a, w.t()), torch.ops.tritile.mm(strided, b),
                   torch.ops.tritile.bmm(batch_a, batch_b)]
        for got, want in zip(results, (a @ b, a @ w.t(), strided @ b, torch.bmm(batch_a, batch_b))):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert first_calls == ["_first_gemm"] * 4
    forget_remembered_calls()
    fresh = torch.ops.tritile.mm(a, w.t())
    assert first_calls == ["_first_gemm"] * 5
    torch.testing.assert_close(fresh, results[1], rtol=0, atol=0)


def test_an_empty_product_is_remembered_too(first_calls):
    a, b = torch.randn(5, 0), torch.randn(0, 7)
    for _ in range(2):
        out = torch.ops.tritile.mm(a, b)
        assert out.shape == (5, 7) and torch.count_nonzero(out) == 0
    assert first_calls == ["_first_gemm"]


def test_a_repeated_linear_runs_the_remembered_kernel_and_matches_a_fresh_call(first_calls):
    x, weight, bias = torch.randn(2, 20, 48), torch.randn(40, 48), torch.randn(40)
    residual = torch.randn(2, 20, 40)
    flat = torch.randn(20, 48)
    outs = []
    for _ in range(3):
        out, pre = torch.ops.tritile.linear(x, weight, bias, residual, "gelu", True)
        flat_out, empty = torch.ops.tritile.linear(flat, weight, None, None, "silu", False)
        expected_pre = F.linear(x, weight, bias)
        torch.testing.assert_close(pre, expected_pre, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out, activation_fn("gelu")(expected_pre) + residual, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(flat_out, F.silu(F.linear(flat, weight)), rtol=1e-4, atol=1e-4)
        assert empty.shape == (0,)
        outs.append(out)
    assert outs[0] is not outs[1] and outs[0].data_ptr() != outs[1].data_ptr()  # new outputs every call
    assert first_calls == ["_first_linear"] * 2
    forget_remembered_calls()
    torch.testing.assert_close(torch.ops.tritile.linear(x, weight, bias, residual, "gelu", True)[0], outs[-1],
                               rtol=0, atol=0)


def test_a_repeated_attention_runs_the_remembered_kernel_and_matches_a_fresh_call(first_calls):
    q = torch.randn(2, 4, 32, 16)
    k, v = torch.randn(2, 2, 48, 16), torch.randn(2, 2, 48, 16)
    for _ in range(3):
        out, lse = torch.ops.tritile.attention(q, k, v, False, 0.3)
        want = F.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True)
        torch.testing.assert_close(out, want, rtol=2e-4, atol=2e-4)
    causal = torch.ops.tritile.attention(q, q, q, True, None)[0]  # another signature and is_causal
    torch.testing.assert_close(causal, F.scaled_dot_product_attention(q, q, q, is_causal=True), rtol=2e-4, atol=2e-4)
    assert first_calls == ["_first_attention"] * 2
    forget_remembered_calls()
    fresh_out, fresh_lse = torch.ops.tritile.attention(q, k, v, False, 0.3)
    torch.testing.assert_close((fresh_out, fresh_lse), (out, lse), rtol=0, atol=0)


def test_remembered_signatures_still_refuse_bad_arguments(first_calls):
    a, b = torch.randn(8, 4), torch.randn(4, 8)
    torch.ops.tritile.mm(a, b)
    with pytest.raises(TypeError, match="'b' has dtype torch.float16"):
        torch.ops.tritile.mm(a, b.half())
    with pytest.raises(ValueError, match="'b' has shape"):
        torch.ops.tritile.mm(a, torch.randn(5, 8))
    with pytest.raises(TypeError, match="'a' has dtype torch.int64"):
        torch.ops.tritile.mm(torch.randint(0, 4, (8, 4)), torch.randint(0, 4, (4, 8)))
    torch.ops.tritile.bmm(a[None], b[None])
    with pytest.raises(ValueError, match="'a' must be 3-D"):
        torch.ops.tritile.bmm(a, b[None])

    x, weight, bias = torch.randn(6, 16), torch.randn(8, 16), torch.randn(8)
    torch.ops.tritile.linear(x, weight, bias, None, "relu", False)
    with pytest.raises(ValueError, match="'bias' has shape"):
        torch.ops.tritile.linear(x, weight, torch.randn(9), None, "relu", False)
    with pytest.raises(ValueError, match="'activation' must be one of"):
        torch.ops.tritile.linear(x, weight, bias, None, "tanh", False)
    with pytest.raises(TypeError, match="'weight' has dtype"):
        torch.ops.tritile.linear(x, weight.double(), bias, None, "relu", False)
    with pytest.raises(ValueError, match="'residual' has shape"):
        torch.ops.tritile.linear(x, weight, bias, torch.randn(6, 9), "relu", False)

    q = torch.randn(1, 4, 32, 16)
    torch.ops.tritile.attention(q, q, q, False, None)
    with pytest.raises(TypeError, match="'k'"):
        torch.ops.tritile.attention(q, q.half(), q, False, None)
    with pytest.raises(ValueError, match="causal attention with 32 queries and 16 keys"):
        torch.ops.tritile.attention(q, q[:, :, :16], q[:, :, :16], True, None)


def test_a_signature_is_what_the_checks_read():
    a = torch.randn(4, 6)
    assert signature(a, None) == ((torch.Tensor, torch.float32, torch.Size([4, 6]), (6, 1), a.device), None)
    assert signature(a) != signature(a.t().contiguous().t())  # same shape, transposed layout
    assert signature(a) != signature(torch.nn.Parameter(a))  # a subclass is another signature
    with pytest.raises(AttributeError):
        signature(a, 3)
    memo = Remembered(limit=2)
    for i in range(3):
        memo.remember(i, str(i))
    assert memo == {2: "2"}  # full: starts over


def test_a_warm_gemm_is_followed_by_other_signatures_with_their_own_answers(first_calls):
    """What a remembered call keeps (its kernel prepared for the signature's operands:
    `JITKernel.prepare`) is keyed by everything the kernel's checks read: a call of another shape,
    layout or dtype after a warm one runs its own kernel and matches torch."""
    a, b = torch.randn(40, 48), torch.randn(48, 24)
    for _ in range(2):
        torch.testing.assert_close(torch.ops.tritile.mm(a, b), a @ b, rtol=1e-4, atol=1e-4)
    others = [(torch.randn(33, 48), torch.randn(48, 24)),  # another M
              (a, torch.randn(48, 40)),  # another N
              (a, torch.randn(24, 48).t()),  # b's transpose: same shape, other strides
              (torch.randn(40, 96)[:, ::2], b),  # a strided view: same shape, copied
              (a.half(), b.half())]  # another dtype
    for x, y in others:
        want = (x.double() @ y.double()).to(x.dtype)
        tol = 1e-4 if x.dtype == torch.float32 else 1e-2
        torch.testing.assert_close(torch.ops.tritile.mm(x, y), want, rtol=tol, atol=tol)
        torch.testing.assert_close(torch.ops.tritile.mm(a, b), a @ b, rtol=1e-4, atol=1e-4)  # the warm one again
    assert first_calls == ["_first_gemm"] * (1 + len(others))


def test_a_prepared_call_runs_new_tensors_of_its_kind():
    """`JITKernel.prepare(*args)`: the call's checks once (their TypeError / ValueError, before
    anything runs), then a call per new tensors of that kind, each with a new output."""
    a, b = torch.randn(40, 48), torch.randn(48, 24)
    kernel = tritile_matmul.matmul.kernel_for(a, b, dtype="float32", block_M=16, block_N=16, block_K=16)
    prepared = kernel.prepare(a, b)
    outputs = []
    for _ in range(3):
        x, y = torch.randn(40, 48), torch.randn(48, 24)
        outputs.append(prepared(x, y))
        torch.testing.assert_close(outputs[-1], x @ y, rtol=1e-4, atol=1e-4)
    assert outputs[0].data_ptr() != outputs[1].data_ptr()
    with pytest.raises(TypeError, match="argument 'B'"):
        kernel.prepare(a, b.half())
    with pytest.raises(ValueError, match="argument 'B'"):
        kernel.prepare(a, torch.randn(40, 24))


def test_a_prepared_call_of_a_kernel_with_scalars_checks_every_call():
    """A kernel with scalar parameters: their values vary from call to call, so the prepared call
    binds (and checks) each call as the kernel does."""
    import tritile
    import tritile.language as T

    @tritile.jit(out_idx=[1])
    def shifted(n=64, dtype=T.float32):
        @T.prim_func
        def main(A: T.Tensor((n,), dtype), B: T.Tensor((n,), dtype), shift: T.float32):
            with T.Kernel(1, threads=64) as _:
                for i in T.Parallel(n):
                    B[i] = A[i] + shift

        return main

    a = torch.randn(64)
    prepared = shifted().prepare(a, 0.5)
    for shift in (1.5, -2.0):
        x = torch.randn(64)
        torch.testing.assert_close(prepared(x, shift), x + shift)
    with pytest.raises(TypeError, match="argument 'shift'"):
        prepared(a, "one")


def test_a_warm_attention_is_followed_by_other_signatures_with_their_own_answers(first_calls):
    """Contiguous q, k, v (a remembered call passes them as they are), then views of the same shapes
    sliced out of a fused projection (other strides: their own kernel, read in place), a shorter
    key length (contiguous, and sliced views), another dtype: each matches SDPA, every call of
    each signature."""
    batch, heads, seq, dim = 2, 2, 32, 16
    q, k, v = (torch.randn(batch, heads, seq, dim) for _ in range(3))
    qkv = torch.randn(batch, seq, 3 * heads * dim)
    views = tuple(qkv.view(batch, seq, 3, heads, dim).permute(2, 0, 3, 1, 4))
    short_k, short_v = k[:, :, :24], v[:, :, :24]
    calls = [(q, k, v), views, (q, short_k.contiguous(), short_v.contiguous()), (q, short_k, short_v),
             tuple(t.half() for t in (q, k, v))]
    for _ in range(2):
        for x, y, z in calls:
            want = F.scaled_dot_product_attention(x.float(), y.float(), z.float())
            tol = 2e-4 if x.dtype == torch.float32 else 2e-2
            torch.testing.assert_close(torch.ops.tritile.attention(x, y, z, False, None)[0].float(), want,
                                       rtol=tol, atol=tol)
    assert first_calls == ["_first_attention"] * len(calls)


def test_a_prepared_call_places_outputs_in_their_parameters_places():
    """Outputs before and after the input (out_idx [0, 2]), and trailing outputs of two shapes
    listed in reverse (out_idx [2, 1]): a prepared call allocates each at its parameter's place and
    returns them in out_idx order, as the kernel's own call does."""
    import tritile
    import tritile.language as T

    @T.prim_func
    def around(Neg: T.Tensor((64,), T.float32), A: T.Tensor((64,), T.float32), Twice: T.Tensor((64,), T.float32)):
        with T.Kernel(1, threads=64) as _:
            for i in T.Parallel(64):
                Neg[i] = -A[i]
                Twice[i] = A[i] * 2.0

    @T.prim_func
    def after(A: T.Tensor((64,), T.float32), Neg: T.Tensor((64,), T.float32), Head: T.Tensor((32,), T.float32)):
        with T.Kernel(1, threads=64) as _:
            for i in T.Parallel(64):
                Neg[i] = -A[i]
            for i in T.Parallel(32):
                Head[i] = A[i] * 2.0

    for func, out_idx, expected in ((around, [0, 2], lambda a: (-a, 2 * a)),
                                    (after, [2, 1], lambda a: (2 * a[:32], -a))):
        kernel = tritile.compile(func, out_idx=out_idx, target="cpu")
        prepared = kernel.prepare(torch.randn(64))
        for _ in range(2):
            a = torch.randn(64)
            got = prepared(a)
            assert [tuple(t.shape) for t in got] == [tuple(t.shape) for t in expected(a)]
            for g, want in zip(got, expected(a)):
                torch.testing.assert_close(g, want)
