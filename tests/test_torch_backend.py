"""`torch.compile(..., backend="tritile")`: matmuls become tritile GEMMs (run by the reference
interpreter on CPU), everything else goes to inductor (or eager with fallback="eager"), results
match eager PyTorch, and `explain` says what went where."""
import pytest
import torch

from tritile.contrib import torch_backend
from tritile.ops import matmul as tritile_matmul

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}


class MatmulBiasRelu(torch.nn.Module):
    def __init__(self, k: int, n: int, dtype: torch.dtype):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(k, n, dtype=dtype) / k ** 0.5)
        self.bias = torch.nn.Parameter(torch.randn(n, dtype=dtype))

    def forward(self, x):
        return torch.relu(x @ self.weight + self.bias)


@pytest.fixture
def gemm_calls(monkeypatch) -> list:
    """The GEMM kernels `tritile.mm` / `tritile.bmm` run, one entry a call."""
    calls, run = [], tritile_matmul._gemm
    monkeypatch.setattr(tritile_matmul, "_gemm", lambda kernel_fn, a, b: calls.append(kernel_fn) or run(kernel_fn, a, b))
    return calls


def assert_close(actual, expected):
    tol = TOLERANCE[expected.dtype]
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype, fallback", [(torch.float32, "inductor"), (torch.float32, "eager"),
                                             (torch.float16, "eager")])
def test_compiled_matmul_bias_relu_matches_eager(dtype, fallback, gemm_calls):
    torch._dynamo.reset()
    model = MatmulBiasRelu(96, 128, dtype)
    x = torch.randn(64, 96, dtype=dtype)
    compiled = torch.compile(model, backend="tritile", options={"fallback": fallback})
    with torch.no_grad():
        actual = compiled(x)
        expected = torch.relu(x.float() @ model.weight.float() + model.bias.float()).to(dtype)
    assert gemm_calls == [tritile_matmul.matmul]
    assert_close(actual, expected)


def test_inductor_fuses_around_the_tritile_gemm():
    """The default composes with inductor: its generated code calls tritile.mm as an extern
    kernel and fuses the bias add and the ReLU into one kernel of its own."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    model = MatmulBiasRelu(64, 32, torch.float32)
    x = torch.randn(16, 64)
    with torch.no_grad():
        actual, code = run_and_get_code(torch.compile(model, backend="tritile"), x)
    assert_close(actual, model(x))
    source = "\n".join(code)
    assert "torch.ops.tritile.mm_compiled.default" in source  # tritile.mm past autograd
    assert "aten.mm" not in source and "extern_kernels.mm" not in source
    fused = [line for line in source.splitlines() if "def kernel" in line or "cpp_fused" in line]
    assert fused, source  # bias + relu: one inductor kernel


def test_explain_reports_what_went_where():
    linear = torch.nn.Linear(96, 48)
    model = torch.nn.Sequential(MatmulBiasRelu(64, 96, torch.float32), linear)
    x = torch.randn(80, 64)
    report = torch_backend.explain(model, x, fallback="eager", backward=False)
    # the Linear (with its bias epilogue) before AOTAutograd, then x @ weight in the ATen graph
    assert [(d.op, d.kernel) for d in report.tritile_ops] == [("linear+bias", "tritile.linear"),
                                                              ("aten.mm.default", "tritile.mm")]
    assert not report.fallback_ops
    assert "2 op(s) ran as tritile kernels" in str(report)
    ints = torch_backend.explain(lambda a, b: torch.mm(a, b) * 2, torch.randint(-8, 8, (32, 48)),
                                 torch.randint(-8, 8, (48, 16)), fallback="eager")
    (refused,) = ints.fallback_ops
    assert "dtype torch.int64" in refused.reason and "stayed with eager" in str(ints)


def test_explain_covers_the_backward_graph():
    model = MatmulBiasRelu(48, 32, torch.float32)
    x = torch.randn(16, 48, requires_grad=True)
    report = torch_backend.explain(model, x, fallback="eager")
    assert len(report.tritile_ops) == 3  # forward x @ W; backward dX = dY @ W^T, dW = X^T @ dY


def test_backward_through_compiled_model_matches_eager():
    torch._dynamo.reset()
    model = MatmulBiasRelu(96, 64, torch.float32)
    x = torch.randn(64, 96, requires_grad=True)
    grad_out = torch.randn(64, 64)
    actual = torch.compile(model, backend="tritile")(x)
    actual.backward(grad_out)
    grads = [x.grad, model.weight.grad, model.bias.grad]
    x.grad = model.weight.grad = model.bias.grad = None
    expected = model(x)
    expected.backward(grad_out)
    assert_close(actual, expected)
    for got, want in zip(grads, [x.grad, model.weight.grad, model.bias.grad]):
        assert_close(got, want)


@pytest.mark.parametrize("make_inputs", [
    lambda: (torch.randint(-8, 8, (32, 48)), torch.randint(-8, 8, (48, 16))),  # integer mm
    lambda: (torch.randn(3, 32, 48, dtype=torch.float64), torch.randn(3, 48, 16, dtype=torch.float64)),  # bmm
], ids=["int", "float64-bmm"])
def test_unsupported_matmul_falls_back(make_inputs, gemm_calls):
    a, b = make_inputs()
    report = torch_backend.explain(lambda a, b: torch.matmul(a, b) * 2, a, b, fallback="eager")
    actual = torch.compile(lambda a, b: torch.matmul(a, b) * 2, backend="tritile",
                           options={"fallback": "eager"})(a, b)
    expected = torch.matmul(a, b) * 2
    if a.is_floating_point():
        assert_close(actual, expected)
    else:
        assert torch.equal(actual, expected)
    assert not report.tritile_ops
    assert not gemm_calls


def test_backend_options_are_checked():
    gm = torch.fx.symbolic_trace(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="fallback"):
        torch_backend.tritile_backend(gm, [torch.randn(2, 4)], options={"fallback": "cuda-graphs"})
    with pytest.raises(ValueError, match="inductor options"):
        torch_backend.tritile_backend(gm, [torch.randn(2, 4)], options={"fallback": "eager", "max_autotune": True})


def test_backend_name_is_registered():
    assert torch._dynamo.backends.registry.lookup_backend("tritile") is torch_backend.tritile_backend


def test_tritile_mm_rejects_bad_arguments():
    a = torch.randn(8, 4)
    with pytest.raises(TypeError, match="'b'"):
        torch.ops.tritile.mm(a, torch.randn(4, 8, dtype=torch.float16))
    with pytest.raises(TypeError, match="'a'"):
        torch.ops.tritile.mm(torch.randint(0, 4, (8, 4)), torch.randint(0, 4, (4, 8)))
    with pytest.raises(ValueError, match="'a'"):
        torch.ops.tritile.mm(torch.randn(2, 8, 4), torch.randn(4, 8))
    with pytest.raises(ValueError, match="'b'"):
        torch.ops.tritile.mm(a, torch.randn(5, 8))


def test_an_operator_runs_behind_torch_compiler_disable_only_under_dynamo(monkeypatch):
    """tritile/ops/registration.py: with no Dynamo frame callback installed (eager code, compiled
    graphs) the implementation is called directly; with one, behind `torch.compiler.disable`."""
    from tritile.ops import registration

    wrapped = []
    monkeypatch.setattr(torch.compiler, "disable", lambda fn: lambda *args: wrapped.append(fn) or fn(*args))
    call = registration._not_traced(lambda a, b: a @ b)
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    torch.testing.assert_close(call(a, b), a @ b)
    assert wrapped == []
    monkeypatch.setattr(registration, "_frame_callback", lambda: object())  # as while Dynamo runs a frame
    torch.testing.assert_close(call(a, b), a @ b)
    assert len(wrapped) == 1


@pytest.mark.filterwarnings("error::UserWarning")  # e.g. Dynamo's for a C function it cannot trace
def test_an_operator_called_from_a_frame_dynamo_skips_runs_eagerly():
    """An operator called in a frame Dynamo runs without tracing it (its nested frames still
    evaluated by Dynamo): the implementation is not traced, the result matches."""
    a, b = torch.randn(16, 32), torch.randn(32, 8)

    @torch.compiler.disable(recursive=False)
    def product(x, y):
        return torch.ops.tritile.mm(x, y)

    compiled = torch.compile(lambda x, y: product(x, y) + 1, backend="eager")
    for _ in range(2):
        assert_close(compiled(a, b), a @ b + 1)


@pytest.mark.parametrize("trans_a, trans_b", [(True, False), (False, True), (True, True)])
def test_transposed_operands_are_read_in_place(trans_a, trans_b, gemm_kernel_requests):
    """The backward's `w.t()` reaches the kernel as the contiguous matrix and a transpose flag."""
    a = torch.randn(48, 40).t() if trans_a else torch.randn(40, 48)  # (40, 48)
    b = torch.randn(24, 48).t() if trans_b else torch.randn(48, 24)  # (48, 24)
    assert_close(torch.ops.tritile.mm(a, b), a @ b)
    assert_close(torch.ops.tritile.mm(a, b), a @ b)  # the second call reuses the compiled kernel
    assert gemm_kernel_requests == [(True, True, trans_a, trans_b)]


@pytest.mark.gpu
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True), (True, True)])
def test_transposed_operands_on_the_gpu(trans_a, trans_b):
    m, n, k = 512, 384, 256
    a = (torch.randn(k, m, device="cuda").t() if trans_a else torch.randn(m, k, device="cuda")).half()
    b = (torch.randn(n, k, device="cuda").t() if trans_b else torch.randn(k, n, device="cuda")).half()
    torch.testing.assert_close(torch.ops.tritile.mm(a, b).float(), a.float() @ b.float(), rtol=1e-2, atol=5e-2)


def test_a_gemm_cublas_does_faster_stays_with_the_fallback(monkeypatch):
    from tritile.contrib import gemm_choice

    monkeypatch.setattr(gemm_choice, "choose", lambda *args: gemm_choice.Choice(False, 0.30, 0.20))
    model = MatmulBiasRelu(48, 32, torch.float32)
    report = torch_backend.explain(model, torch.randn(16, 48), fallback="eager", backward=False)
    (refused,) = report.fallback_ops
    assert "cuBLAS is faster on this shape (0.200 ms against tritile's 0.300 ms)" == refused.reason
    forced = torch_backend.explain(model, torch.randn(16, 48), fallback="eager", gemms="tritile", backward=False)
    assert len(forced.tritile_ops) == 1


def test_an_addmm_is_chosen_by_timing_the_sum_not_the_product_alone(monkeypatch):
    """addmm -> bias + tritile.mm moves the bias out of cuBLAS's epilogue into a pass of its own:
    the choice times that sum against torch.addmm, so a product faster alone does not decide."""
    from tritile.contrib import gemm_choice

    monkeypatch.setattr(gemm_choice, "choose_linear", lambda *args: gemm_choice.Choice(False, 0.3, 0.2, "cuBLAS"))
    monkeypatch.setattr(gemm_choice, "choose", lambda *args: gemm_choice.Choice(True, 0.19, 0.2))
    problems = []

    def choose_product_sum(*problem):
        problems.append(problem)
        return gemm_choice.Choice(False, 0.25, 0.2, "cuBLAS addmm")

    monkeypatch.setattr(gemm_choice, "choose_product_sum", choose_product_sum)
    model = torch.nn.Linear(48, 32)
    report = torch_backend.explain(model, torch.randn(16, 48), backward=False)
    (addmm,) = [d for d in report.fallback_ops if d.op == "aten.addmm.default"]
    assert addmm.reason == "cuBLAS addmm is faster on this shape (0.200 ms against tritile's 0.250 ms)"
    assert problems == [(None, 16, 32, 48, torch.float32, False, True, (32,), torch.device("cpu"))]


def test_gemm_choices_are_measured_once_and_kept_on_disk(monkeypatch, tmp_path):
    from tritile.contrib import gemm_choice

    monkeypatch.setenv("TRITILE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gemm_choice, "_memory", {})
    monkeypatch.setattr(gemm_choice, "_key", lambda device, *problem: f"gpu|{problem}")
    measured = []

    def measure(*problem):
        measured.append(problem)
        return gemm_choice.Choice(True, 0.1, 0.2)

    monkeypatch.setattr(gemm_choice, "measure", measure)
    problem = (4096, 1024, 1024, torch.bfloat16, False, True)
    assert gemm_choice.choose(*problem, "cuda") == gemm_choice.Choice(True, 0.1, 0.2)
    monkeypatch.setattr(gemm_choice, "_memory", {})  # a new process: read back from disk
    assert gemm_choice.choose(*problem, "cuda").tritile and len(measured) == 1
    assert (tmp_path / "torch_backend" / "gemm_choice.json").exists()
    assert gemm_choice.choose(*problem, "cpu") == gemm_choice.Choice(True) and len(measured) == 1


def test_dynamic_shapes_compile_once_and_match_eager():
    """dynamic=True: one graph for every batch size (the CPU path takes tritile.mm on symbolic
    shapes; a GPU's measured choice leaves symbolic shapes to inductor, see gemm_choice)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = MatmulBiasRelu(32, 48, torch.float32)
    compiled = torch.compile(model, backend="tritile", dynamic=True, options={"fallback": "eager"})
    with torch.no_grad():
        for rows in (8, 13, 21):
            x = torch.randn(rows, 32)
            assert_close(compiled(x), model(x))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2


# ---------------------------------------------------------------- attention, bmm, fused epilogues


class Block(torch.nn.Module):
    """A pre-LN transformer block (causal SDPA, GELU MLP with biases, residuals) with a token mixer
    written with batched matmuls (3-D torch.matmul: aten.bmm forward and backward)."""

    def __init__(self, d_model: int = 32, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d_model), torch.nn.LayerNorm(d_model)
        self.qkv, self.proj = torch.nn.Linear(d_model, 3 * d_model), torch.nn.Linear(d_model, d_model)
        self.fc1, self.fc2 = torch.nn.Linear(d_model, 2 * d_model), torch.nn.Linear(2 * d_model, d_model)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(o.transpose(1, 2).reshape(b, t, d))
        x = x + torch.matmul(torch.softmax(torch.matmul(x, x.transpose(1, 2)) / d, dim=-1), x) / 4
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


def compiled_and_eager(model, x, grad_out, options=None):
    """(output, gradients of x and every parameter) of `model` compiled with the tritile backend,
    then eager's output, its gradients left in x.grad / the parameters' .grad."""
    torch._dynamo.reset()
    actual = torch.compile(model, backend="tritile", options=options)(x)
    actual.backward(grad_out)
    grads = [x.grad] + [p.grad for p in model.parameters()]
    x.grad = None
    model.zero_grad()
    expected = model(x)
    expected.backward(grad_out)
    return actual, grads, expected


def test_transformer_block_compiles_to_tritile_kernels_and_matches_eager():
    """Inductor with tritile's attention, bmm and fused-epilogue GEMMs: output and every
    parameter's gradient equal eager's (fp32: the CPU interpreter)."""
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(2, 16, 32, requires_grad=True)
    actual, grads, expected = compiled_and_eager(model, x, torch.randn(2, 16, 32))
    assert_close(actual, expected)
    for got, (name, param) in zip(grads, [("x", x), *model.named_parameters()]):
        assert got is not None, name
        torch.testing.assert_close(got, param.grad, rtol=1e-4, atol=1e-4, msg=name)

    report = torch_backend.explain(model, x, fallback="eager")
    kernels = [(d.op, d.kernel) for d in report.decisions]
    assert ("scaled_dot_product_attention", "tritile.attention") in kernels
    assert kernels.count(("linear+bias", "tritile.linear")) == 1                # qkv
    assert kernels.count(("linear+bias+residual", "tritile.linear")) == 2       # proj, fc2
    assert kernels.count(("linear+bias+gelu", "tritile.linear")) == 1           # fc1
    assert kernels.count(("aten.bmm.default", "tritile.bmm")) == 6              # 2 forward, 4 backward
    assert kernels.count(("aten.mm.default", "tritile.mm")) == 8                # the Linears' dX and dW
    assert not report.fallback_ops


def sdpa_model(**sdpa):
    return lambda q, k, v, *mask: torch.nn.functional.scaled_dot_product_attention(q, k, v, *mask, **sdpa) * 2


@pytest.mark.parametrize("dtype, heads_kv, sdpa", [
    (torch.float16, 1, dict(is_causal=True, enable_gqa=True)),
    (torch.float32, 4, dict(scale=0.3)),
], ids=["fp16-gqa-causal", "fp32-scale"])
def test_sdpa_becomes_tritile_attention_with_its_gradients(dtype, heads_kv, sdpa):
    q = torch.randn(1, 4, 32, 16, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(1, heads_kv, 32, 16, dtype=dtype, requires_grad=True) for _ in range(2))
    grad_out = torch.randn(1, 4, 32, 16, dtype=dtype)
    report = torch_backend.explain(sdpa_model(**sdpa), q, k, v, fallback="eager", backward=False)
    assert [d.kernel for d in report.decisions] == ["tritile.attention"]
    torch._dynamo.reset()
    actual = torch.compile(sdpa_model(**sdpa), backend="tritile", options={"fallback": "eager"})(q, k, v)
    actual.backward(grad_out)
    grads = [t.grad for t in (q, k, v)]
    q2, k2, v2 = (t.detach().float().requires_grad_() for t in (q, k, v))
    expected = sdpa_model(**sdpa)(q2, k2, v2)
    expected.backward(grad_out.float())
    tol = 2e-2 if dtype == torch.float16 else 2e-4
    for got, want in zip([actual, *grads], [expected, q2.grad, k2.grad, v2.grad]):
        torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("make_inputs, sdpa, reason", [
    (lambda: [torch.randn(1, 2, 16, 16) for _ in range(3)] + [torch.randn(16, 16) > 0], {}, "an attn_mask"),
    (lambda: [torch.randn(1, 2, 16, 16) for _ in range(3)], dict(dropout_p=0.5), "dropout_p=0.5"),
    (lambda: [torch.randn(1, 2, 16, 24) for _ in range(3)], {}, "head dim 24"),
    (lambda: [torch.randn(1, 2, 8, 16), torch.randn(1, 2, 16, 16), torch.randn(1, 2, 16, 16)],
     dict(is_causal=True), "causal attention with 8 queries and 16 keys"),
    (lambda: [torch.randn(1, 2, 16, 16, dtype=torch.float64) for _ in range(3)], {}, "dtype torch.float64"),
], ids=["mask", "dropout", "head-dim", "causal-cross", "float64"])
def test_attention_tritile_cannot_take_stays_with_pytorch(make_inputs, sdpa, reason):
    inputs = make_inputs()
    model = sdpa_model(**sdpa)
    report = torch_backend.explain(model, *inputs, fallback="eager")
    (refused,) = report.fallback_ops
    assert refused.op == "scaled_dot_product_attention" and reason in refused.reason, refused.reason
    assert "tritile.attention" not in [d.kernel for d in report.decisions]  # (PyTorch's CPU dropout path: bmms)
    if not sdpa.get("dropout_p"):
        torch._dynamo.reset()
        actual = torch.compile(model, backend="tritile", options={"fallback": "eager"})(*inputs)
        assert_close(actual, model(*inputs))


class Epilogues(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(24, 40), torch.nn.Linear(40, 40, bias=False)
        self.c = torch.nn.Linear(40, 40)

    def forward(self, x):
        h = torch.nn.functional.silu(self.a(x))                      # bias + silu
        h = h + torch.relu(self.b(h))                                # relu + residual, no bias
        return self.c(h) + h, torch.nn.functional.gelu(self.c(h), approximate="tanh")  # bias + residual; gelu_tanh


def test_fused_epilogues_through_compile():
    torch.manual_seed(0)
    model = Epilogues()
    x = torch.randn(3, 8, 24, requires_grad=True)
    torch._dynamo.reset()
    actual = torch.compile(model, backend="tritile", options={"fallback": "eager"})(x)
    sum(o.square().sum() for o in actual).backward()
    grads = [x.grad] + [p.grad for p in model.parameters()]
    x.grad = None
    model.zero_grad()
    expected = model(x)
    sum(o.square().sum() for o in expected).backward()
    for got, want in zip(actual, expected):
        assert_close(got, want)
    for got, want in zip(grads, [x.grad] + [p.grad for p in model.parameters()]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
    report = torch_backend.explain(model, x, fallback="eager")
    fused = [d.op for d in report.decisions if d.kernel == "tritile.linear"]
    assert sorted(fused) == ["linear+bias+gelu_tanh", "linear+bias+residual", "linear+bias+silu", "linear+relu+residual"]


def test_baddbmm_becomes_bias_plus_tritile_bmm():
    c, a, b = torch.randn(2, 24, 16), torch.randn(2, 24, 40), torch.randn(2, 40, 16)
    report = torch_backend.explain(lambda c, a, b: torch.baddbmm(c, a, b), c, a, b, fallback="eager")
    assert [(d.op, d.kernel) for d in report.decisions] == [("aten.baddbmm.default", "tritile.bmm")]
    scaled = torch_backend.explain(lambda c, a, b: torch.baddbmm(c, a, b, alpha=2), c, a, b, fallback="eager")
    assert "beta or alpha" in scaled.fallback_ops[0].reason
    torch._dynamo.reset()
    actual = torch.compile(lambda c, a, b: torch.baddbmm(c, a, b), backend="tritile", options={"fallback": "eager"})
    assert_close(actual(c, a, b), torch.baddbmm(c, a, b))


def test_attention_sdpa_does_faster_stays_with_the_fallback(monkeypatch):
    from tritile.contrib import gemm_choice

    monkeypatch.setattr(gemm_choice, "choose_attention",
                        lambda *args: gemm_choice.Choice(False, 0.5, 0.25, "SDPA"))
    inputs = [torch.randn(1, 2, 16, 16) for _ in range(3)]
    report = torch_backend.explain(sdpa_model(is_causal=True), *inputs, fallback="eager")
    (refused,) = report.fallback_ops
    assert refused.reason == "SDPA is faster on this shape (0.250 ms against tritile's 0.500 ms)"
    assert "scaled_dot_product_attention [1, 2, 16, 16] x [1, 2, 16, 16] x [1, 2, 16, 16] torch.float32 -> eager: " \
           "SDPA is faster" in str(report)


def test_a_kernel_that_fails_when_measured_leaves_the_op_to_the_fallback(monkeypatch):
    from tritile.contrib import gemm_choice

    def fail(*args):
        raise RuntimeError("out of shared memory\nmore detail")

    monkeypatch.setattr(gemm_choice, "choose_attention", fail)
    inputs = [torch.randn(1, 2, 16, 16) for _ in range(3)]
    report = torch_backend.explain(sdpa_model(), *inputs, fallback="eager")
    (refused,) = report.fallback_ops
    assert refused.reason == "tritile's kernel failed when measured on this shape (RuntimeError: out of shared memory)"


@pytest.mark.gpu
def test_transformer_block_on_the_gpu():
    """bf16 at a realistic shape, measured choices (each op tritile's only where not slower)."""
    torch.manual_seed(0)
    model = Block(d_model=1024, heads=16).cuda().to(torch.bfloat16)
    x = torch.randn(4, 1024, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    actual, grads, expected = compiled_and_eager(model, x, torch.randn_like(x), {"gemms": "tritile"})
    torch.testing.assert_close(actual.float(), expected.float(), rtol=5e-2, atol=5e-2)
    for got, param in zip(grads, [x, *model.parameters()]):
        scale = param.grad.float().abs().max().item()
        torch.testing.assert_close(got.float(), param.grad.float(), rtol=5e-2, atol=5e-2 * max(scale, 1))
    print(torch_backend.explain(model, x))


@pytest.mark.parametrize("measure, problem, rival", [
    ("measure_bmm", (2, 24, 16, 40, torch.float32, True, True), "cuBLAS"),
    ("measure_linear", (24, 16, 40, torch.float32, True, "gelu", True, True), "cuBLAS + torch epilogue"),
    ("measure_product_sum", (None, 24, 16, 40, torch.float32, False, True, (16,)), "cuBLAS addmm"),
    ("measure_product_sum", (3, 24, 16, 40, torch.float32, True, False, (3, 24, 16)), "cuBLAS baddbmm"),
    ("measure_attention", (1, 4, 2, 32, 32, 16, torch.float32, True, None, True), "SDPA"),
], ids=["bmm", "linear", "addmm", "baddbmm", "attention"])
def test_measurements_run_both_sides(measure, problem, rival, monkeypatch):
    """The GPU measurements' own code, run on the CPU with a stand-in clock (each side runs; the
    backend measures under no_grad, the attention's backward included)."""
    from tritile.contrib import gemm_choice

    runs = []

    def clock(fn):
        runs.append(fn())
        return 0.5 if len(runs) == 1 else 0.25

    monkeypatch.setattr(gemm_choice, "_median_ms", clock)
    with torch.no_grad():
        choice = getattr(gemm_choice, measure)(*problem, "cpu")
    assert choice == gemm_choice.Choice(False, 0.5, 0.25, rival)
    assert len(runs) == 2


def test_tritile_must_be_faster_by_the_margin(monkeypatch):
    """A kernel faster by less than `MARGIN` stays with the rival (an op timed alone misses the
    step's effects), and the reason says so."""
    from tritile.contrib import gemm_choice

    times = iter([0.198, 0.2, 0.19, 0.2])
    monkeypatch.setattr(gemm_choice, "_median_ms", lambda fn: next(times))
    close = gemm_choice._timed(None, None, "cuBLAS")
    assert not close.tritile
    assert close.reason == "tritile is faster on this shape by less than the 3% margin (0.198 ms against cuBLAS's 0.200 ms)"
    assert gemm_choice._timed(None, None, "cuBLAS").tritile


def test_a_linear_tritile_cannot_fuse_is_counted_and_its_gemm_listed():
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).double()
    x = torch.randn(4, 16, dtype=torch.float64)
    report = torch_backend.explain(model, x, fallback="eager", backward=False)
    linear, addmm = report.fallback_ops
    assert linear.op == "linear+bias+relu" and "not fused (argument 'x' has dtype torch.float64" in linear.reason
    assert addmm.op == "aten.addmm.default" and "dtype torch.float64" in addmm.reason
    torch._dynamo.reset()
    assert torch.equal(torch.compile(model, backend="tritile", options={"fallback": "eager"})(x), model(x))


def test_dynamic_shapes_with_attention_and_fused_linear():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    fc = torch.nn.Linear(16, 16)

    def model(x):
        h = torch.nn.functional.gelu(fc(x))  # [b, 2, t, 16]
        return torch.nn.functional.scaled_dot_product_attention(h, h, h, is_causal=True)

    compiled = torch.compile(model, backend="tritile", dynamic=True, options={"fallback": "eager"})
    with torch.no_grad():
        for batch, seq in ((1, 8), (2, 13), (3, 21)):
            x = torch.randn(batch, 2, seq, 16)
            assert_close(compiled(x), model(x))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2


def test_a_fused_linears_rival_leaves_the_residual_add_to_the_next_kernel(monkeypatch):
    """In a compiled step inductor folds a residual add into the kernel that reads the sum next,
    so the rival timed against `tritile.linear` with a residual is the linear and its activation
    only (with the add, out-projection linears were chosen and slowed the train step)."""
    from tritile.contrib import gemm_choice
    from tritile.ops.linear import activation_fn

    runs = []
    monkeypatch.setattr(gemm_choice, "_median_ms", lambda fn: runs.append(fn()) or 1.0)
    with torch.no_grad():
        gemm_choice.measure_linear(24, 16, 40, torch.float32, True, "gelu", True, True, "cpu")
    (fused, preactivation), rival = runs
    torch.testing.assert_close(rival, activation_fn("gelu")(preactivation))
    assert not torch.allclose(fused, rival, atol=1e-3)  # the fused side adds the residual
