"""`torch.compile(..., backend="tritile")`: matmuls become tritile GEMMs (run by the reference
interpreter on CPU), everything else stays eager, and results match eager PyTorch."""
import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

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


def recording_backend(graphs: list):
    """The tritile compiler behind aot_autograd, keeping each rewritten ATen graph's call targets."""
    def compile_and_record(gm, example_inputs):
        compiled = torch_backend.compile_aten_graph(gm, example_inputs)
        graphs.append([n.target for n in gm.graph.nodes if n.op == "call_function"])
        return compiled

    return aot_autograd(fw_compiler=compile_and_record)


def assert_close(actual, expected):
    tol = TOLERANCE[expected.dtype]
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_compiled_matmul_bias_relu_matches_eager(dtype):
    model = MatmulBiasRelu(96, 128, dtype)
    x = torch.randn(64, 96, dtype=dtype)
    compiled = torch.compile(model, backend="tritile")
    calls = kernel_calls()
    with torch.no_grad():
        actual = compiled(x)
        expected = torch.relu(x.float() @ model.weight.float() + model.bias.float()).to(dtype)
    assert kernel_calls() == calls + 1
    assert_close(actual, expected)


def test_rewritten_graph_calls_tritile_mm():
    graphs = []
    linear = torch.nn.Linear(96, 48)
    model = torch.nn.Sequential(MatmulBiasRelu(64, 96, torch.float32), linear)
    x = torch.randn(80, 64)
    with torch.no_grad():
        actual = torch.compile(model, backend=recording_backend(graphs))(x)
        expected = model(x)
    targets = [t for graph in graphs for t in graph]
    assert targets.count(torch.ops.tritile.mm.default) == 2  # x @ weight, and the Linear's addmm
    assert torch.ops.aten.mm.default not in targets and torch.ops.aten.addmm.default not in targets
    assert_close(actual, expected)


def test_backward_through_compiled_model_matches_eager():
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
def test_unsupported_matmul_falls_back_to_eager(make_inputs):
    a, b = make_inputs()
    graphs = []
    calls = kernel_calls()
    actual = torch.compile(lambda a, b: torch.matmul(a, b) * 2, backend=recording_backend(graphs))(a, b)
    expected = torch.matmul(a, b) * 2
    if a.is_floating_point():
        assert_close(actual, expected)
    else:
        assert torch.equal(actual, expected)
    assert graphs and all(torch.ops.tritile.mm.default not in graph for graph in graphs)
    assert kernel_calls() == calls


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
