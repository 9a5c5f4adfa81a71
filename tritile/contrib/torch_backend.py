"""`torch.compile(model, backend="tritile")`: tritile's kernels for the ops it owns, inductor for the rest.

Contract:
* Two rewrites hand tritile's ops to tritile; the ops they leave alone are inductor's as without
  tritile.
* Before AOTAutograd, `rewrite_dynamo_graph` rewrites Dynamo's graph (torch-level calls, so the
  autograd formulas are the tritile ops' own):
    - `F.scaled_dot_product_attention(q, k, v, ...)` → `tritile.attention(q, k, v, is_causal,
      scale)[0]` (whose backward is `tritile.attention_backward`) without mask or dropout, for the
      tensors `tritile.ops.attention.attention_refusal` accepts (GQA: `enable_gqa` with K/V heads
      dividing the query heads);
    - `F.linear(x, w, b)` followed by its activation (gelu / gelu tanh / silu / relu, the
      linear's only user) and / or a residual add of the same shape → one
      `tritile.linear(x, w, b, residual, activation, keep_preactivation)[0]` (the GEMM with that
      epilogue; `keep_preactivation` when the graph needs gradients, for the activation's
      backward); a linear with no bias, activation or residual is left for the post-grad pass.
  Rewriting here rather than after AOTAutograd: there SDPA is already split into forward and
  backward ATen ops whose names and saved tensors differ by device and torch version, and GELU
  is decomposed into ten pointwise nodes whose pre-activation also feeds the backward.
* Inductor's post-grad pass (`TritileOpsPass`, an inductor `CustomGraphPass`) rewrites, in the
  functionalised ATen graphs (forward and backward) inductor is about to lower,
    - `aten.mm.default(a, b)`            → `tritile.mm(a, b)`
    - `aten.addmm.default(c, a, b)`      → `aten.add(c, tritile.mm(a, b))` (beta = alpha = 1 only)
    - `aten.bmm.default(a, b)`           → `tritile.bmm(a, b)`
    - `aten.baddbmm.default(c, a, b)`    → `aten.add(c, tritile.bmm(a, b))` (beta = alpha = 1 only)
  when `a` and `b` are 2-D (3-D for bmm) tensors of one supported dtype (fp16 / bf16 / fp32) on
  one device (read from the nodes' fake-tensor metadata).  Inductor then fuses everything around
  them (LayerNorm, softmax, residuals, casts) and calls tritile's kernels as extern kernels.
  Every tritile operator in these graphs (these and the ones the Dynamo-graph rewrite made)
  then calls its twin without the autograd formula (`tritile.mm_compiled`, ...:
  tritile/ops/registration.py), the graph being past autograd.  The
  pass's `uuid` covers this file and tritile's version, so inductor's FX graph cache never serves
  a graph rewritten by another one.
* On a GPU every rewrite of either stage happens only where tritile's kernel is not slower than
  the one it replaces on that shape and layout (`gemm_choice`: measured once, cached; static
  shapes only); `options={"gemms": "tritile"}` skips the measurement.
* On a GPU, with static shapes, a graph where the rewrites chose a tritile op is also compiled
  without them (inductor's own graph, on the graph's first call, once the backward's rewrite has
  run too), and the two are timed, step against step, the faster kept (`graph_choice`: ops each faster alone do not promise a faster step);
  `options={"graph_choice": "off"}` keeps tritile's graph untimed.
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
import copy
import itertools
import operator
import threading
import weakref
from dataclasses import dataclass, field
from typing import Optional

import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends import registry
from torch._dynamo.backends.common import aot_autograd
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils import _pytree as pytree

import tritile
from tritile.contrib import gemm_choice, graph_choice
from tritile.ops import attention as tritile_attention  # registers torch.ops.tritile.attention
from tritile.ops import linear as tritile_linear  # registers torch.ops.tritile.linear
from tritile.ops.matmul import SUPPORTED_DTYPES, is_transposed_contiguous  # registers tritile.mm, tritile.bmm
from tritile.ops.registration import COMPILED_TWINS

BACKEND_NAME = "tritile"
FALLBACKS = ("inductor", "eager")
GEMM_POLICIES = ("measured", "tritile")
GRAPH_POLICIES = ("measured", "off")

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
    """The (fake) tensor a node of an ATen graph ("val") or of Dynamo's graph ("example_value") holds."""
    if not isinstance(node, torch.fx.Node):
        return None
    value = node.meta.get("val", node.meta.get("example_value"))
    return value if isinstance(value, torch.Tensor) else None


def _is_static(*tensors) -> bool:
    return all(isinstance(d, int) for t in tensors for d in t.shape)


def _measured_refusal(device: torch.device, tensors, choose) -> str:
    """On CUDA, why a measured choice keeps the op with the fallback ('' for tritile): `choose()`
    runs on real tensors, once per static shape."""
    if device.type == "cuda" and not _is_static(*tensors):
        return "a dynamic shape (tritile's kernels are measured per static shape; gemms='tritile' skips that)"
    try:
        with unset_fake_temporarily(), torch.no_grad():  # real operands, timed on the device
            return choose().reason
    except Exception as err:  # noqa: BLE001 - a kernel that fails to build or run here leaves the op to the rival
        first_line = (str(err).strip().splitlines() or [""])[0][:200]
        return f"tritile's kernel failed when measured on this shape ({type(err).__name__}: {first_line})"


def _gemm_refusal(a, b, measured: bool, rank: int = 2, bias=None) -> str:
    """'' when both operands are `rank`-D tensors (2: tritile.mm, 3: tritile.bmm) of one supported
    dtype on one device and (when `measured`) tritile's GEMM is not slower there than the one it
    replaces (`gemm_choice`; with `bias`, the node of an addmm / baddbmm: `bias + ` tritile's GEMM
    against that op), else why not."""
    a, b, bias = _tensor_meta(a), _tensor_meta(b), _tensor_meta(bias)
    op = "tritile.mm" if rank == 2 else "tritile.bmm"
    if a is None or b is None:
        return "an operand without tensor metadata"
    if a.dim() != rank or b.dim() != rank:
        return f"operands of rank {a.dim()} and {b.dim()} ({op} takes {rank}-D operands)"
    if a.dtype != b.dtype:
        return f"mixed dtypes {a.dtype} and {b.dtype}"
    if a.dtype not in SUPPORTED_DTYPES:
        return f"dtype {a.dtype} ({op} takes float16, bfloat16, float32)"
    if a.device != b.device:
        return f"operands on {a.device} and {b.device}"
    if not measured:
        return ""
    trans_a, trans_b = is_transposed_contiguous(a), is_transposed_contiguous(b)
    if bias is not None:
        batch = None if rank == 2 else a.shape[0]
        return _measured_refusal(a.device, (a, b, bias), lambda: gemm_choice.choose_product_sum(
            batch, a.shape[-2], b.shape[-1], a.shape[-1], a.dtype, trans_a, trans_b, tuple(bias.shape), a.device))
    if rank == 2:
        return _measured_refusal(a.device, (a, b), lambda: gemm_choice.choose(
            a.shape[0], b.shape[1], a.shape[1], a.dtype, trans_a, trans_b, a.device))
    return _measured_refusal(a.device, (a, b), lambda: gemm_choice.choose_bmm(
        a.shape[0], a.shape[1], b.shape[2], a.shape[2], a.dtype, trans_a, trans_b, a.device))


def _replace_with_product_sum(graph, node, product_op, bias, a, b) -> None:
    """node (addmm / baddbmm with beta = alpha = 1) -> bias + product_op(a, b)."""
    with graph.inserting_before(node):
        product = graph.call_function(product_op, (a, b))
        product.meta["val"] = node.meta.get("val")
        total = graph.call_function(aten.add.Tensor, (bias, product))
    total.meta.update(node.meta)
    node.replace_all_uses_with(total)
    graph.erase_node(node)


def _rewrite_product(rank: int, op):
    """The rule for mm (rank 2) / bmm (rank 3): retarget the node to tritile's `op`."""
    def rule(graph: torch.fx.Graph, node: torch.fx.Node, measured: bool) -> str:
        refusal = _gemm_refusal(*node.args, measured, rank)
        if not refusal:
            node.target = op
        return refusal

    return rule


def _rewrite_product_sum(rank: int, op):
    """The rule for addmm (rank 2) / baddbmm (rank 3), beta = alpha = 1: bias + tritile's `op`."""
    def rule(graph: torch.fx.Graph, node: torch.fx.Node, measured: bool) -> str:
        bias, a, b = node.args
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return f"{node.target.__name__.split('.')[0]} with beta or alpha other than 1"
        refusal = _gemm_refusal(a, b, measured, rank, bias)
        if not refusal:
            _replace_with_product_sum(graph, node, op, bias, a, b)
        return refusal

    return rule


# candidate ATen op -> (rule: (graph, node, measured) -> '' when rewritten, else the reason; the tritile op)
_REWRITES = {
    aten.mm.default: (_rewrite_product(2, torch.ops.tritile.mm.default), "tritile.mm"),
    aten.addmm.default: (_rewrite_product_sum(2, torch.ops.tritile.mm.default), "tritile.mm"),
    aten.bmm.default: (_rewrite_product(3, torch.ops.tritile.bmm.default), "tritile.bmm"),
    aten.baddbmm.default: (_rewrite_product_sum(3, torch.ops.tritile.bmm.default), "tritile.bmm"),
}


def _describe(node: torch.fx.Node) -> tuple:
    metas = [_tensor_meta(a) for a in node.args]
    return [list(m.shape) for m in metas if m is not None], [str(m.dtype) for m in metas if m is not None]


def _record(decisions: list) -> None:
    with _recording_lock:
        if _recording is not None:  # `explain` is running (the backward compiles on autograd's threads)
            _recording.extend(decisions)


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
    _call_compiled_twins(graph)
    if any(d.kernel for d in decisions):
        graph.lint()
    _record(decisions)
    return decisions


def _call_compiled_twins(graph: torch.fx.Graph) -> None:
    """Every tritile operator of the graph (this pass's and the Dynamo-graph rewrite's) -> its twin
    without the autograd formula (`registration.COMPILED_TWINS`): past AOTAutograd the graph
    holds its own backward and runs with grad mode off, so the formula's Python layer (~5 us a
    call on the CPU machine) would only redispatch."""
    for node in graph.nodes:
        twin = COMPILED_TWINS.get(node.target) if node.op == "call_function" else None
        if twin is not None:
            node.target = twin


# ------------------------------------------------------------------------ before AOTAutograd

SDPA_PARAMETERS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
SDPA_DEFAULTS = dict(attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)


def _sdpa_refusal(node: torch.fx.Node, call: dict, measured: bool) -> str:
    if call["attn_mask"] is not None:
        return "an attn_mask (tritile.attention takes is_causal only)"
    if isinstance(call["dropout_p"], torch.fx.Node) or call["dropout_p"] != 0:
        return f"dropout_p={call['dropout_p']} (tritile.attention has no dropout)"
    for name in ("is_causal", "scale", "enable_gqa"):
        if isinstance(call[name], torch.fx.Node):
            return f"{name} is not a constant"
    q, k, v = (_tensor_meta(call[name]) for name in ("query", "key", "value"))
    if q is None or k is None or v is None:
        return "an operand without tensor metadata"
    if not call["enable_gqa"] and q.dim() == k.dim() == 4 and q.shape[1] != k.shape[1]:
        return "fewer K/V heads than query heads without enable_gqa"
    _, refusal = tritile_attention.attention_refusal(q, k, v, call["is_causal"])
    if refusal or not measured:
        return refusal
    out = _tensor_meta(node)
    backward = out is not None and out.requires_grad
    return _measured_refusal(q.device, (q, k), lambda: gemm_choice.choose_attention(
        q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3], q.dtype, call["is_causal"],
        call["scale"], backward, q.device))


def _set_pair_meta(pair: torch.fx.Node, first: torch.fx.Node, replaced: torch.fx.Node, make_second) -> None:
    """Dynamo's metadata for a tritile op returning (the replaced node's value, a second tensor)
    and for `first` = pair[0]: inductor's pre-grad passes read "example_value"."""
    first.meta.update(replaced.meta)
    value = _tensor_meta(replaced)
    if value is not None:
        pair.meta["example_value"] = (value, make_second(value))


def _rewrite_sdpa(graph: torch.fx.Graph, node: torch.fx.Node, measured: bool) -> Decision:
    """F.scaled_dot_product_attention -> tritile.attention(...)[0] (its autograd formula is
    tritile.attention_backward), or the reason it stays."""
    call = dict(SDPA_DEFAULTS, **dict(zip(SDPA_PARAMETERS, node.args)), **node.kwargs)
    operands = [call["query"], call["key"], call["value"]]
    metas = [_tensor_meta(t) for t in operands]
    decision = Decision("scaled_dot_product_attention", [list(m.shape) for m in metas if m is not None],
                        [str(m.dtype) for m in metas if m is not None])
    decision.reason = _sdpa_refusal(node, call, measured)
    if decision.reason:
        return decision
    with graph.inserting_before(node):
        both = graph.call_function(torch.ops.tritile.attention.default, (*operands, call["is_causal"], call["scale"]))
        out = graph.call_function(operator.getitem, (both, 0))
    _set_pair_meta(both, out, node, lambda o: o.new_empty(o.shape[:3], dtype=torch.float32))
    node.replace_all_uses_with(out)
    graph.erase_node(node)
    decision.kernel = "tritile.attention"
    return decision


def _activation_of(node: torch.fx.Node, source: torch.fx.Node) -> Optional[str]:
    """The `tritile.linear` activation that `node` applies to `source` (its only tensor input), or None."""
    if node.op != "call_function" or not node.args or node.args[0] is not source or node.kwargs.get("inplace"):
        return None
    F = torch.nn.functional
    if node.target in (F.gelu, torch._C._nn.gelu):
        approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(approximate)
    if len(node.args) == 1 and node.target in (F.silu, torch._C._nn.silu):
        return "silu"
    if len(node.args) == 1 and node.target in (F.relu, torch.relu):
        return "relu"
    return None


def _residual_of(node: torch.fx.Node, source: torch.fx.Node):
    """The other operand when `node` is `source + residual` (or `residual + source`) of one
    shape and dtype (no broadcast, no alpha), else None."""
    if node.op != "call_function" or node.target not in (operator.add, torch.add) or node.kwargs \
            or len(node.args) != 2 or source not in node.args:
        return None
    other = node.args[1] if node.args[0] is source else node.args[0]
    mine, theirs = _tensor_meta(source), _tensor_meta(other)
    if other is source or theirs is None or mine is None or theirs.shape != mine.shape or theirs.dtype != mine.dtype:
        return None
    return other


def _single_user(node: torch.fx.Node) -> Optional[torch.fx.Node]:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _rewrite_linear(graph: torch.fx.Graph, node: torch.fx.Node, measured: bool) -> Optional[Decision]:
    """F.linear [-> relu / silu / gelu] [-> + residual] -> one tritile.linear (its epilogue); None
    when the linear has no epilogue to fuse (no bias, activation or residual: it stays a GEMM for
    the post-grad pass)."""
    x, weight, bias = (*node.args, *[None] * (3 - len(node.args)))[:3]
    bias = node.kwargs.get("bias", bias)
    chain, activation, residual = [node], "none", None
    user = _single_user(node)
    if user is not None and _activation_of(user, node):
        activation = _activation_of(user, node)
        chain.append(user)
    user = _single_user(chain[-1])
    if user is not None and _residual_of(user, chain[-1]) is not None:
        residual = _residual_of(user, chain[-1])
        chain.append(user)
    if bias is None and len(chain) == 1:
        return None
    parts = ["bias"] * (bias is not None) + [activation] * (activation != "none") + ["residual"] * (residual is not None)
    metas = [_tensor_meta(t) for t in (x, weight, bias, residual)]
    present = [m for m in metas if m is not None]
    decision = Decision("linear+" + "+".join(parts), [list(m.shape) for m in present], [str(m.dtype) for m in present])
    out = _tensor_meta(node)
    keep_pre = activation != "none" and out is not None and out.requires_grad
    decision.reason = _linear_refusal(x, weight, bias, residual, metas, activation, keep_pre, measured)
    if decision.reason:
        decision.reason = f"not fused ({decision.reason}); its GEMM is listed again below"
        return decision
    with graph.inserting_before(chain[-1]):
        both = graph.call_function(torch.ops.tritile.linear.default, (x, weight, bias, residual, activation, keep_pre))
        fused = graph.call_function(operator.getitem, (both, 0))
    _set_pair_meta(both, fused, chain[-1], lambda o: o.new_empty(o.shape if keep_pre else (0,)))
    chain[-1].replace_all_uses_with(fused)
    for done in reversed(chain):
        graph.erase_node(done)
    decision.kernel = "tritile.linear"
    return decision


def _linear_refusal(x, weight, bias, residual, metas, activation, keep_pre, measured) -> str:
    if any(m is None for m, n in zip(metas, (x, weight, bias, residual)) if n is not None):
        return "an operand without tensor metadata"
    x_meta, w_meta, b_meta, r_meta = metas
    try:
        tritile_linear.check_linear_arguments(x_meta, w_meta, b_meta, r_meta, activation)
    except (TypeError, ValueError) as err:
        return str(err).removeprefix("tritile.linear: ")
    if not measured:
        return ""
    k, n = w_meta.shape[1], w_meta.shape[0]
    return _measured_refusal(x_meta.device, (x_meta, w_meta), lambda: gemm_choice.choose_linear(
        x_meta.numel() // k, n, k, x_meta.dtype, bias is not None, activation, residual is not None, keep_pre,
        x_meta.device))


# candidate call of Dynamo's graph -> rule: (graph, node, measured) -> a Decision, or None (no candidate)
_PRE_GRAD_REWRITES = {torch.nn.functional.scaled_dot_product_attention: _rewrite_sdpa,
                      torch._C._nn.linear: _rewrite_linear}


def rewrite_dynamo_graph(gm: torch.fx.GraphModule, measured: bool = True) -> list:
    """Before AOTAutograd (so the autograd formulas are tritile's): F.scaled_dot_product_attention
    -> tritile.attention, F.linear with its bias / activation / residual -> tritile.linear, in
    Dynamo's graph, in place; one `Decision` per candidate."""
    decisions = []
    for node in list(gm.graph.nodes):
        rule = _PRE_GRAD_REWRITES.get(node.target) if node.op == "call_function" else None
        decision = rule(gm.graph, node, measured) if rule is not None else None
        if decision is not None:
            decisions.append(decision)
    if any(d.kernel for d in decisions):
        gm.graph.lint()
        gm.recompile()
    _record(decisions)
    return decisions


_recording = None  # the list `explain` collects decisions into, while it runs
_recording_graphs = None  # and the graphs' timed choices
_recording_lock = threading.Lock()


class GraphRewrites:
    """What the rewrites chose in one Dynamo graph: its own rewrite's decisions and those of each
    run of the post-grad pass on the ATen graphs inductor made of it (the pass finds this object
    by `key`: inductor may copy the pass with its config for the backward's compilation)."""

    _next_key = itertools.count()
    _live: "weakref.WeakValueDictionary[int, GraphRewrites]" = weakref.WeakValueDictionary()

    def __init__(self, dynamo_graph_decisions: list):
        self.key = next(GraphRewrites._next_key)
        self.dynamo_graph_decisions = dynamo_graph_decisions
        self.post_grad_runs: list = []
        GraphRewrites._live[self.key] = self

    @classmethod
    def of(cls, key) -> Optional["GraphRewrites"]:
        return cls._live.get(key) if key is not None else None

    def decisions(self) -> list:
        return self.dynamo_graph_decisions + [d for run in self.post_grad_runs for d in run]

    def chosen(self, graphs: int) -> Optional[bool]:
        """Whether a tritile op was chosen, once `graphs` ATen graphs were compiled (None: unknown,
        the pass did not see them all - an FX graph cache hit)."""
        if any(d.kernel for d in self.decisions()):
            return True
        return False if len(self.post_grad_runs) >= graphs else None

    def settle(self, kept_tritile: bool, why: str) -> None:
        """The graph's timed choice (`graph_choice`): when inductor's own graph runs instead, no
        decision of this graph ran as a tritile kernel; `explain` lists the outcome."""
        if not kept_tritile:
            for decision in self.decisions():
                if decision.kernel:
                    decision.kernel, decision.reason = None, f"{why}; alone it went to {decision.kernel}"
        with _recording_lock:
            if _recording_graphs is not None:
                _recording_graphs.append(why)


class TritileOpsPass(CustomGraphPass):
    """Inductor's post-grad pass that hands tritile's ops to tritile (`rewrite_graph`), telling
    the graph's `GraphRewrites` (`rewrites_key`) what it chose."""

    def __init__(self, measured: bool = True, rewrites_key: Optional[int] = None):
        self.measured = measured
        self.rewrites_key = rewrites_key

    def __call__(self, graph: torch.fx.Graph) -> None:
        decisions = rewrite_graph(graph, self.measured)
        rewrites = GraphRewrites.of(self.rewrites_key)
        if rewrites is not None:
            rewrites.post_grad_runs.append(decisions)

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
    """Dynamo backend: inductor with `TritileOpsPass` (default), or `options={"fallback": "eager"}`;
    on CUDA the graph with tritile's ops is timed against inductor's own on its first call
    (`graph_choice`) unless `options={"graph_choice": "off"}`."""
    options = dict(options or {})
    fallback = options.pop("fallback", "inductor")
    gemms = options.pop("gemms", "measured")
    graph_policy = options.pop("graph_choice", "measured")
    for name, value, valid in (("fallback", fallback, FALLBACKS), ("gemms", gemms, GEMM_POLICIES),
                               ("graph_choice", graph_policy, GRAPH_POLICIES)):
        if value not in valid:
            raise ValueError(f"torch.compile(backend='tritile'): options['{name}'] must be one of {valid}, "
                             f"got {value!r}")
    measured = gemms == "measured"
    if fallback == "eager":
        rewrite_dynamo_graph(gm, measured)
        if options:
            raise ValueError(f"torch.compile(backend='tritile'): options {sorted(options)} are inductor options; "
                             f"they mean nothing with fallback='eager'")
        return _eager_backend(measured)(gm, example_inputs)
    from torch._inductor.compile_fx import compile_fx

    inductor_patches = dict(options)
    if mode is not None:
        from torch._inductor import list_mode_options

        inductor_patches = {**list_mode_options(mode), **inductor_patches}
    timed = graph_policy == "measured" and measured and _graph_choice_applies(gm, example_inputs, inductor_patches)
    inductor_gm = _copy_graph_module(gm) if timed else None
    rewrites = GraphRewrites(rewrite_dynamo_graph(gm, measured))
    tritile_graph = compile_fx(gm, example_inputs, config_patches=dict(
        inductor_patches, post_grad_custom_post_pass=TritileOpsPass(measured, rewrites.key)))
    if not timed or (rewrites.chosen(graphs=1) is False and not _needs_backward(gm)):
        return tritile_graph
    choice = graph_choice.GraphChoice(
        tritile_graph, lambda: compile_fx(inductor_gm, example_inputs, config_patches=inductor_patches),
        rewrites.chosen, rewrites.settle)
    choice.rewrites = rewrites  # kept alive with the graph: the backward's pass finds it by key
    return choice


def _graph_choice_applies(gm: torch.fx.GraphModule, example_inputs, inductor_patches: dict) -> bool:
    """Timing both graphs needs a CUDA input, static shapes (one choice per compiled graph) and
    no CUDA graphs (their recorded input addresses would not be the timed copies')."""
    if inductor_patches.get("triton.cudagraphs"):
        return False
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    if not any(t.device.type == "cuda" for t in tensors):
        return False
    metas = [_tensor_meta(node) for node in gm.graph.nodes]
    return _is_static(*tensors, *[m for m in metas if m is not None])


def _needs_backward(gm: torch.fx.GraphModule) -> bool:
    outputs = next(node for node in reversed(gm.graph.nodes) if node.op == "output").args[0]
    metas = [_tensor_meta(node) for node in pytree.tree_leaves(outputs)]
    return any(m is not None and m.requires_grad for m in metas)


def _copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A second GraphModule of Dynamo's graph (its nodes copied, their metadata and the module's
    attributes shared), which the rewrites leave alone."""
    copy_ = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    copy_.meta = dict(gm.meta)
    return copy_


@dataclass
class Explanation:
    """`explain`'s report: every candidate op of the compiled graphs (forward and backward)."""

    decisions: list = field(default_factory=list)
    fallback: str = "inductor"
    graph_choices: list = field(default_factory=list)  # each timed graph's outcome (`graph_choice`)

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
        lines += [f"  graph: {outcome}" for outcome in self.graph_choices]
        return "\n".join(lines)


def explain(model, *inputs, fallback: str = "inductor", gemms: str = "measured", backward: bool = None) -> Explanation:
    """Compile `model` with backend="tritile" on `inputs` (running it once, and its backward when
    an output requires grad, unless `backward` says otherwise) and report what went where."""
    global _recording, _recording_graphs
    torch._dynamo.reset()  # a fresh compile, so every graph passes through the rewrite
    decisions, graph_choices = [], []
    with _recording_lock:
        _recording, _recording_graphs = decisions, graph_choices
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
            _recording = _recording_graphs = None
        torch._dynamo.reset()
    return Explanation(decisions, fallback, graph_choices)


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
