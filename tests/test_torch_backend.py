"""`torch.compile(..., backend="tritile")`: matmuls become tritile GEMMs (run by the reference
interpreter on CPU), everything else goes to inductor (or eager with fallback="eager"), results
match eager PyTorch, and `explain` says what went where."""
import pytest
import torch

from tritile.contrib import torch_backend
from tritile.ops import matmul as tritile_matmul

TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}


class MatmulBiasRelu(torch.nn.Module):
    def __init__(self, k: int, n: int, dtype: torch.dtype):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(k, n, dtype=dtype) / k ** 0.5)
        self.bias = torch.nn.Parameter(torch.randn(n, dtype=dtype))

    def forward(self, x):
        return torch.relu(x @ self.weight + self.bias)


def kernel_calls() -> int:
    info = tritile_matmul.matmul.cache_info()
    return info.hits + info.misses


def assert_close(actual, expected):
    tol = TOLERANCE[expected.dtype]
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype, fallback", [(torch.float32, "inductor"), (torch.float32, "eager"),
                                             (torch.float16, "eager")])
def test_compiled_matmul_bias_relu_matches_eager(dtype, fallback):
    torch._dynamo.reset()
    model = MatmulBiasRelu(96, 128, dtype)
    x = torch.randn(64, 96, dtype=dtype)
    compiled = torch.compile(model, backend="tritile", options={"fallback": fallback})
    calls = kernel_calls()
    with torch.no_grad():
        actual = compiled(x)
        expected = torch.relu(x.float() @ model.weight.float() + model.bias.float()).to(dtype)
    assert kernel_calls() == calls + 1
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
    assert "torch.ops.tritile.mm.default" in source
    assert "aten.mm" not in source and "extern_kernels.mm" not in source
    fused = [line for line in source.splitlines() if "def kernel" in line or "cpp_fused" in line]
    assert fused, source  # bias + relu: one inductor kernel


def test_explain_reports_what_went_where():
    linear = torch.nn.Linear(96, 48)
    model = torch.nn.Sequential(MatmulBiasRelu(64, 96, torch.float32), linear)
    x = torch.randn(80, 64)
    report = torch_backend.explain(model, x, fallback="eager", backward=False)
    assert [d.kernel for d in report.tritile_ops] == ["tritile.mm", "tritile.mm"]  # x @ weight, the addmm
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
    lambda: (torch.randn(3, 32, 48), torch.randn(3, 48, 16)),                   # 3-D: bmm
], ids=["int", "bmm"])
def test_unsupported_matmul_falls_back(make_inputs):
    a, b = make_inputs()
    calls = kernel_calls()
    report = torch_backend.explain(lambda a, b: torch.matmul(a, b) * 2, a, b, fallback="eager")
    actual = torch.compile(lambda a, b: torch.matmul(a, b) * 2, backend="tritile",
                           options={"fallback": "eager"})(a, b)
    expected = torch.matmul(a, b) * 2
    if a.is_floating_point():
        assert_close(actual, expected)
    else:
        assert torch.equal(actual, expected)
    assert not report.tritile_ops
    assert kernel_calls() == calls


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


@pytest.mark.parametrize("trans_a, trans_b", [(True, False), (False, True), (True, True)])
def test_transposed_operands_are_read_in_place(trans_a, trans_b, monkeypatch):
    """The backward's `w.t()` reaches the kernel as the contiguous matrix and a transpose flag."""
    a = torch.randn(48, 40).t() if trans_a else torch.randn(40, 48)  # (40, 48)
    b = torch.randn(24, 48).t() if trans_b else torch.randn(48, 24)  # (48, 24)
    seen = []
    kernel = tritile_matmul.matmul

    def spy(x, y, **kwargs):
        seen.append((x.is_contiguous(), y.is_contiguous(), kwargs["trans_A"], kwargs["trans_B"]))
        return kernel(x, y, **kwargs)

    monkeypatch.setattr(tritile_matmul, "matmul", spy)
    assert_close(torch.ops.tritile.mm(a, b), a @ b)
    assert seen == [(True, True, trans_a, trans_b)]


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
