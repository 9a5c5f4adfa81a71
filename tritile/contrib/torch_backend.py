"""`torch.compile(model, backend="tritile")`: matrix products of the model run as tritile GEMMs.

Contract:
* `tritile_backend(gm, example_inputs)` is an AOTAutograd backend: its compiler receives the
  functionalised ATen graphs (forward, backward or inference) and rewrites, in place,
    - `aten.mm.default(a, b)`         → `tritile.mm(a, b)`
    - `aten.addmm.default(c, a, b)`   → `aten.add(c, tritile.mm(a, b))` (default beta = alpha = 1 only)
  when `a` and `b` are 2-D tensors of one supported dtype (fp16 / bf16 / fp32) on one device
  (read from the nodes' fake-tensor metadata).  Every other node, including unsupported
  matmuls (integer dtypes, bmm, mixed dtypes), is left alone and runs in eager PyTorch.
* Importing this module registers the backend name "tritile" with Dynamo, unless Dynamo knows
  the name already (registered before, or found through the `torch_dynamo_backends` entry point,
  whose loading registers it).
"""
from __future__ import annotations

import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends import registry
from torch._dynamo.backends.common import aot_autograd

from tritile.ops.matmul import SUPPORTED_DTYPES  # also registers torch.ops.tritile.mm

BACKEND_NAME = "tritile"

aten = torch.ops.aten


def _tensor_meta(node):
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _is_supported_gemm(a, b) -> bool:
    """Both operands are 2-D tensors of one supported dtype on one device."""
    a, b = _tensor_meta(a), _tensor_meta(b)
    return (a is not None and b is not None and a.dim() == 2 and b.dim() == 2
            and a.dtype == b.dtype and a.dtype in SUPPORTED_DTYPES and a.device == b.device)


def _rewrite_mm(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    a, b = node.args
    if not _is_supported_gemm(a, b):
        return False
    node.target = torch.ops.tritile.mm.default
    return True


def _rewrite_addmm(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    bias, a, b = node.args
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1 or not _is_supported_gemm(a, b):
        return False
    with graph.inserting_before(node):
        product = graph.call_function(torch.ops.tritile.mm.default, (a, b))
        product.meta["val"] = node.meta.get("val")
        total = graph.call_function(aten.add.Tensor, (bias, product))
    total.meta.update(node.meta)
    node.replace_all_uses_with(total)
    graph.erase_node(node)
    return True


_REWRITES = {aten.mm.default: _rewrite_mm, aten.addmm.default: _rewrite_addmm}


def rewrite_matmuls(gm: torch.fx.GraphModule) -> int:
    """Rewrite the supported matmuls of an ATen graph into `tritile.mm` calls, in place; return
    how many were rewritten (the graph module is recompiled when any was)."""
    graph = gm.graph
    rewritten = 0
    for node in list(graph.nodes):
        rule = _REWRITES.get(node.target) if node.op == "call_function" else None
        if rule is not None and rule(graph, node):
            rewritten += 1
    if rewritten:
        graph.lint()
        gm.recompile()
    return rewritten


def compile_aten_graph(gm: torch.fx.GraphModule, example_inputs):
    """AOTAutograd's compiler: rewrite the matmuls, run the graph eagerly (boxed calling convention)."""
    rewrite_matmuls(gm)
    return make_boxed_func(gm.forward)


tritile_backend = aot_autograd(fw_compiler=compile_aten_graph)


def _register() -> None:
    # A name in _BACKENDS with an entry point is being (or will be) loaded by Dynamo's lookup,
    # which registers it itself; registering here too would trip its duplicate-name assertion.
    if BACKEND_NAME in registry._COMPILER_FNS or registry._BACKENDS.get(BACKEND_NAME) is not None:
        return
    registry.register_backend(compiler_fn=tritile_backend, name=BACKEND_NAME)


_register()
