"""`graph_choice.GraphChoice`: the first call times tritile's compiled graph against inductor's own
and keeps the faster, without side effects on the inputs or the random stream; the backend's
wiring (`torch_backend`) withdraws the ops' decisions when inductor's graph wins."""
import time

import pytest
import torch

from tritile.contrib import graph_choice, torch_backend


def make_graph(delay_s: float, calls: list, name: str):
    """A stand-in for a compiled graph: (x @ w + noise,) with an in-place update of `counter`."""
    def graph(x, w, counter):
        calls.append(name)
        time.sleep(delay_s)
        counter.add_(1)
        return (x @ w + 0.0 * torch.rand(()),)
    return graph


def inputs():
    x = torch.randn(8, 16)
    w = torch.randn(16, 4, requires_grad=True)
    return x, w, torch.zeros(())


@pytest.mark.parametrize("tritile_delay, inductor_delay, kept", [(0.0, 0.004, "tritile"), (0.004, 0.0, "inductor")])
def test_the_faster_graph_is_kept_and_the_real_call_runs_once(tritile_delay, inductor_delay, kept):
    calls, settled = [], []
    choice = graph_choice.GraphChoice(make_graph(tritile_delay, calls, "tritile"),
                                      lambda: make_graph(inductor_delay, calls, "inductor"),
                                      lambda graphs: True, lambda kept, why: settled.append(kept))
    x, w, counter = inputs()
    torch.manual_seed(1)
    (out,) = choice(x, w, counter)
    after_choice = torch.rand(3)
    torch.manual_seed(1)
    torch.rand(())  # the real call's own draw
    assert torch.equal(after_choice, torch.rand(3)), "timing must not advance the random stream"
    assert counter.item() == 1, "the timed runs must not update the real inputs"
    assert calls[-1] == kept and choice.outcome.startswith(f"{kept}'s graph kept")
    assert settled == [kept == "tritile"]
    out.sum().backward()
    torch.testing.assert_close(out, x @ w.detach())
    torch.testing.assert_close(w.grad, x.t() @ torch.ones(8, 4))
    calls.clear()
    choice(x, w, counter)
    assert calls == [kept] and counter.item() == 2


def test_a_tie_goes_to_inductor(monkeypatch):
    monkeypatch.setattr(graph_choice, "_alternating_medians", lambda steps, device: {"tritile": 1.0, "inductor": 1.0})
    calls = []
    choice = graph_choice.GraphChoice(make_graph(0, calls, "tritile"), lambda: make_graph(0, calls, "inductor"),
                                      lambda graphs: True, lambda kept, why: None)
    choice(*inputs())
    assert calls[-1] == "inductor"


def test_no_timing_nor_second_compilation_when_no_op_went_to_tritile():
    calls, asked, compiled = [], [], []
    choice = graph_choice.GraphChoice(make_graph(0.004, calls, "tritile"),
                                      lambda: compiled.append(1) or make_graph(0, calls, "inductor"),
                                      lambda graphs: asked.append(graphs) or False,
                                      lambda kept, why: None)
    choice(*inputs())
    assert not compiled and "inductor" not in calls
    assert asked == [2]  # forward and backward compiled by the warm-up
    assert "no op went to tritile" in choice.outcome


def test_an_input_that_overlaps_itself_is_not_timed():
    calls = []
    choice = graph_choice.GraphChoice(make_graph(0.004, calls, "tritile"), lambda: make_graph(0, calls, "inductor"),
                                      lambda graphs: True, lambda kept, why: None)
    _, w, counter = inputs()
    choice(torch.randn(16).expand(8, 16), w, counter)  # stride 0: no copy can have its strides
    assert set(calls) == {"tritile"} and "untimed" in choice.outcome


def test_a_sliced_input_is_timed_on_a_copy_with_its_strides():
    seen = []

    def graph(x, w, counter):
        seen.append(x.stride())
        return (x @ w,)

    choice = graph_choice.GraphChoice(graph, lambda: graph, lambda graphs: True, lambda kept, why: None)
    x, w, counter = inputs()
    wide = torch.randn(8, 40)
    (out,) = choice(wide[:, 3:19], w, counter)
    assert set(seen) == {(40, 1)}
    torch.testing.assert_close(out, wide[:, 3:19] @ w)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)

    def forward(self, x):
        return torch.nn.functional.layer_norm(x @ self.proj.weight.t(), (32,)).sum(-1)


def test_backend_times_both_graphs_and_withdraws_the_ops_when_inductor_wins(monkeypatch):
    """On CPU tritile's kernels run in the interpreter, far slower than inductor's C++: with the
    choice switched on here (it runs on CUDA only), inductor's own graph must be the one kept, the
    results and gradients eager's, and `explain` must no longer count the ops as tritile's."""
    monkeypatch.setattr(torch_backend, "_graph_choice_applies", lambda gm, example_inputs, patches: True)
    monkeypatch.setattr(graph_choice, "ROUNDS", 5)  # 3 once let a loaded CPU's samples pick tritile's graph
    model = Block()
    x = torch.randn(4, 32)
    report = torch_backend.explain(model, x)
    assert report.decisions and not report.tritile_ops
    assert len(report.graph_choices) == 1 and "inductor's graph kept" in str(report)
    assert all("inductor's graph kept" in d.reason for d in report.decisions if d.op.startswith("aten.mm"))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="tritile")
    out = compiled(x)
    out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    expected = model(x)
    expected.sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    for got, want in zip(grads, [p.grad for p in model.parameters() if p.grad is not None]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_graph_choice_option_is_checked():
    gm = torch.fx.symbolic_trace(Block())
    with pytest.raises(ValueError, match="graph_choice"):
        torch_backend.tritile_backend(gm, [torch.randn(2, 32)], options={"graph_choice": "sometimes"})


def test_backend_keeps_tritiles_graph_when_it_is_faster(monkeypatch):
    monkeypatch.setattr(torch_backend, "_graph_choice_applies", lambda gm, example_inputs, patches: True)
    monkeypatch.setattr(graph_choice, "_alternating_medians", lambda steps, device: {"tritile": 1.0, "inductor": 2.0})
    report = torch_backend.explain(Block(), torch.randn(4, 32))
    assert {d.kernel for d in report.decisions} == {"tritile.mm"}
    assert report.graph_choices == ["tritile's graph kept: 1.000 ms a step against inductor's own 2.000 ms"]


class Mlp(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(torch.nn.functional.layer_norm(x, x.shape[-1:]))))


@pytest.mark.gpu
def test_graph_choice_on_the_gpu():
    """Measured ops and the timed graph at a GPU-sized MLP: whichever graph is kept, the step
    matches eager's, and `explain` counts tritile's ops only where tritile's graph was kept."""
    torch.manual_seed(0)
    model = Mlp(1024).cuda().to(torch.bfloat16)
    x = torch.randn(8, 512, 1024, device="cuda", dtype=torch.bfloat16)
    report = torch_backend.explain(model, x)
    print(report)
    assert len(report.graph_choices) <= 1
    if any("inductor's graph kept" in outcome for outcome in report.graph_choices):
        assert not report.tritile_ops
    model.zero_grad()  # explain ran a backward
    torch._dynamo.reset()
    out = torch.compile(model, backend="tritile")(x)
    out.float().square().mean().backward()
    grads = [p.grad.float() for p in model.parameters()]
    model.zero_grad()
    expected = model(x)
    expected.float().square().mean().backward()
    torch.testing.assert_close(out.float(), expected.float(), rtol=5e-2, atol=5e-2)
    for got, param in zip(grads, model.parameters()):
        scale = param.grad.float().abs().max().item()
        torch.testing.assert_close(got, param.grad.float(), rtol=5e-2, atol=5e-2 * max(scale, 1e-3))
