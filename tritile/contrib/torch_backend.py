"""`torch.compile(model, backend="tritile")`: tritile's kernels for the ops it owns, inductor for the rest.

Contract:
* By default the backend is inductor plus one post-grad pass (`TritileOpsPass`, an inductor
  `CustomGraphPass`): the pass rewrites, in the functionalised ATen graph inductor is about to
  lower,
    - `aten.mm.default(a, b)`         → `tritile.mm(a, b)`
    - `aten.addmm.default(c, a, b)`   → `aten.add(c, tritile.mm(a, b))` (default beta = alpha = 1 only)
  when `a` and `b` are 2-D tensors of one supported dtype (fp16 / bf16 / fp32) on one device
  (read from the nodes' fake-tensor metadata) and, on a GPU, tritile.mm is not slower than the
  cuBLAS call it replaces on that shape and layout (`gemm_choice`: measured once, cached;
  `options={"gemms": "tritile"}` skips the measurement).  Inductor then fuses everything around them
  (LayerNorm, GELU, residuals, casts) and calls tritile's kernels as extern kernels; the ops the
  pass leaves alone are inductor's as without tritile.  The pass's `uuid` covers this file and
  tritile's version, so inductor's FX graph cache never serves a graph rewritten by another one.
* `options={"fallback": "eager"}` runs the same rewrite in AOTAutograd and everything else in
  eager PyTorch (debugging a model without inductor); any other option is an inductor config
  patch (`options={"max_autotune": True}`), as with `backend="inductor"`.
* `explain(model, *inputs)` compiles `model` once and reports every candidate op: which ran as
  a tritile kernel and which stayed with inductor (or eager), and why.
* Importing this module registers the backend name "tritile" with Dynamo, unless Dynamo knows
  the name already (registered before, or found through the `torch_dynamo_backends` entry point,
  whose loading registers it).
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Optional

import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends import registry
from torch._dynamo.backends.common import aot_autograd
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch._subclasses.fake_tensor import unset_fake_temporarily

import tritile
from tritile.contrib import gemm_choice
from tritile.ops.matmul import SUPPORTED_DTYPES, is_transposed_contiguous  # also registers torch.ops.tritile.mm

BACKEND_NAME = "tritile"
FALLBACKS = ("inductor", "eager")
GEMM_POLICIES = ("measured", "tritile")

aten = torch.ops.aten


@dataclass
class Decision:
    """What the rewrite did with one candidate ATen op: `kernel` names the tritile op it became,
    or is None and `reason` says why the op stayed with the fallback."""

    op: str
    shapes: list
    dtypes: list
    kernel: Optional[str] = None
    reason: str = ""


def _tensor_meta(node):
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _gemm_refusal(a, b, measured: bool) -> str:
    """'' when both operands are 2-D tensors of one supported dtype on one device and (when
    `measured`) tritile.mm is not slower there than the GEMM it replaces (`gemm_choice`), else why not."""
    a, b = _tensor_meta(a), _tensor_meta(b)
    if a is None or b is None:
        return "an operand without tensor metadata"
    if a.dim() != 2 or b.dim() != 2:
        return f"operands of rank {a.dim()} and {b.dim()} (tritile.mm takes 2-D matrices)"
    if a.dtype != b.dtype:
        return f"mixed dtypes {a.dtype} and {b.dtype}"
    if a.dtype not in SUPPORTED_DTYPES:
        return f"dtype {a.dtype} (tritile.mm takes float16, bfloat16, float32)"
    if a.device != b.device:
        return f"operands on {a.device} and {b.device}"
    if not measured:
        return ""
    if a.device.type == "cuda" and not all(isinstance(d, int) for d in (*a.shape, *b.shape)):
        return "a dynamic shape (tritile.mm is measured against cuBLAS per static shape; gemms='tritile' skips that)"
    with unset_fake_temporarily(), torch.no_grad():  # real operands, timed on the device
        choice = gemm_choice.choose(a.shape[0], b.shape[1], a.shape[1], a.dtype, is_transposed_contiguous(a),
                                    is_transposed_contiguous(b), a.device)
    return choice.reason


def _rewrite_mm(graph: torch.fx.Graph, node: torch.fx.Node, measured: bool) -> str:
    refusal = _gemm_refusal(*node.args, measured)
    if not refusal:
        node.target = torch.ops.tritile.mm.default
    return refusal


def _rewrite_addmm(graph: torch.fx.Graph, node: torch.fx.Node, measured: bool) -> str:
    bias, a, b = node.args
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        return "addmm with beta or alpha other than 1"
    refusal = _gemm_refusal(a, b, measured)
    if refusal:
        return refusal
    with graph.inserting_before(node):
        product = graph.call_function(torch.ops.tritile.mm.default, (a, b))
        product.meta["val"] = node.meta.get("val")
        total = graph.call_function(aten.add.Tensor, (bias, product))
    total.meta.update(node.meta)
    node.replace_all_uses_with(total)
    graph.erase_node(node)
    return ""


# candidate ATen op -> (rule: (graph, node, measured) -> '' when rewritten, else the reason; the tritile op)
_REWRITES = {aten.mm.default: (_rewrite_mm, "tritile.mm"), aten.addmm.default: (_rewrite_addmm, "tritile.mm")}


def _describe(node: torch.fx.Node) -> tuple:
    metas = [_tensor_meta(a) for a in node.args]
    return [list(m.shape) for m in metas if m is not None], [str(m.dtype) for m in metas if m is not None]


def rewrite_graph(graph: torch.fx.Graph, measured: bool = True) -> list:
    """Rewrite the supported ops of an ATen graph into tritile ops, in place; one `Decision` per
    candidate op, rewritten or not.  `measured`: a GPU op goes to tritile only where it is not
    slower (`gemm_choice`); else every supported op does."""
    decisions = []
    for node in list(graph.nodes):
        entry = _REWRITES.get(node.target) if node.op == "call_function" else None
        if entry is None:
            continue
        rule, kernel = entry
        shapes, dtypes = _describe(node)
        op = str(node.target)
        reason = rule(graph, node, measured)
        decisions.append(Decision(op, shapes, dtypes, None if reason else kernel, reason))
    if any(d.kernel for d in decisions):
        graph.lint()
    with _recording_lock:
        if _recording is not None:  # `explain` is running (the backward compiles on autograd's threads)
            _recording.extend(decisions)
    return decisions


_recording = None  # the list `explain` collects decisions into, while it runs
_recording_lock = threading.Lock()


class TritileOpsPass(CustomGraphPass):
    """Inductor's post-grad pass that hands tritile's ops to tritile (`rewrite_graph`)."""

    def __init__(self, measured: bool = True):
        self.measured = measured

    def __call__(self, graph: torch.fx.Graph) -> None:
        rewrite_graph(graph, self.measured)

    def uuid(self):
        return (get_hash_for_files((__file__, gemm_choice.__file__)), tritile.__version__, self.measured)


def _eager_backend(measured: bool):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        """AOTAutograd's compiler for the eager fallback: rewrite, then run the graph eagerly."""
        if any(d.kernel for d in rewrite_graph(gm.graph, measured)):
            gm.recompile()
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=compile_graph)


def tritile_backend(gm: torch.fx.GraphModule, example_inputs, options: Optional[dict] = None, mode=None):
    """Dynamo backend: inductor with `TritileOpsPass` (default), or `options={"fallback": "eager"}`."""
    options = dict(options or {})
    fallback = options.pop("fallback", "inductor")
    gemms = options.pop("gemms", "measured")
    for name, value, valid in (("fallback", fallback, FALLBACKS), ("gemms", gemms, GEMM_POLICIES)):
        if value not in valid:
            raise ValueError(f"torch.compile(backend='tritile'): options['{name}'] must be one of {valid}, "
                             f"got {value!r}")
    measured = gemms == "measured"
    if fallback == "eager":
        if options:
            raise ValueError(f"torch.compile(backend='tritile'): options {sorted(options)} are inductor options; "
                             f"they mean nothing with fallback='eager'")
        return _eager_backend(measured)(gm, example_inputs)
    from torch._inductor.compile_fx import compile_fx

    patches = dict(options, post_grad_custom_post_pass=TritileOpsPass(measured))
    if mode is not None:
        from torch._inductor import list_mode_options

        patches = {**list_mode_options(mode), **patches}
    return compile_fx(gm, example_inputs, config_patches=patches)


@dataclass
class Explanation:
    """`explain`'s report: every candidate op of the compiled graphs (forward and backward)."""

    decisions: list = field(default_factory=list)
    fallback: str = "inductor"

    @property
    def tritile_ops(self) -> list:
        return [d for d in self.decisions if d.kernel]

    @property
    def fallback_ops(self) -> list:
        return [d for d in self.decisions if not d.kernel]

    def __str__(self) -> str:
        lines = [f"{len(self.tritile_ops)} op(s) ran as tritile kernels, {len(self.fallback_ops)} stayed with "
                 f"{self.fallback}"]
        for d in self.decisions:
            where = d.kernel if d.kernel else f"{self.fallback}: {d.reason}"
            lines.append(f"  {d.op} {' x '.join(map(str, d.shapes))} {'/'.join(sorted(set(d.dtypes)))} -> {where}")
        return "\n".join(lines)


def explain(model, *inputs, fallback: str = "inductor", gemms: str = "measured", backward: bool = None) -> Explanation:
    """Compile `model` with backend="tritile" on `inputs` (running it once, and its backward when
    an output requires grad, unless `backward` says otherwise) and report what went where."""
    global _recording
    torch._dynamo.reset()  # a fresh compile, so every graph passes through the rewrite
    decisions = []
    with _recording_lock:
        _recording = decisions
    try:
        with _no_fx_graph_cache():
            compiled = torch.compile(model, backend=BACKEND_NAME, options={"fallback": fallback, "gemms": gemms})
            out = compiled(*inputs)
            outputs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]
            if backward is None:
                backward = any(o.requires_grad for o in outputs)
            if backward:
                sum(o.float().sum() for o in outputs if o.requires_grad).backward()
    finally:
        with _recording_lock:
            _recording = None
        torch._dynamo.reset()
    return Explanation(decisions, fallback)


@contextlib.contextmanager
def _no_fx_graph_cache():
    """A cached inductor graph skips the post-grad passes, so `explain` would see nothing."""
    from torch._inductor import config

    with config.patch(fx_graph_cache=False):
        yield


def _register() -> None:
    # A name in _BACKENDS with an entry point is being (or will be) loaded by Dynamo's lookup,
    # which registers it itself; registering here too would trip its duplicate-name assertion.
    if BACKEND_NAME in registry._COMPILER_FNS or registry._BACKENDS.get(BACKEND_NAME) is not None:
        return
    registry.register_backend(compiler_fn=tritile_backend, name=BACKEND_NAME)


_register()
