"""How tritile's torch operators are defined: `torch.library.Library` definitions, not
`torch.library.custom_op`.

Contract: `define(schema, impl, fake, backward=None, setup_context=None)` defines the operator
`tritile::<name>` of `schema` ("mm(Tensor a, Tensor b) -> Tensor", tagged pt2-compliant as
`custom_op` tags its operators) and returns its overload `torch.ops.tritile.<name>.default`:
* `impl` runs it on every device (the CompositeExplicitAutograd key: CPU tensors reach the
  interpreter, CUDA tensors the compiled kernels), never traced by Dynamo (wrapped in
  `torch.compiler.disable`, as `custom_op` wraps its implementations: an eager call from a frame
  Dynamo is processing would otherwise be compiled, launcher and all);
* `fake` is its fake implementation (`torch.library.register_fake`: Dynamo and AOTAutograd trace
  the operator with it, dynamic shapes included);
* `backward` / `setup_context`, when given, are its autograd formula
  (`torch.library.register_autograd`, the formula `custom_op`'s `register_autograd` takes).
What `custom_op` checked on every call is the callers' contract here: `impl` returns new
tensors, never an input or a view of one (the aliasing `torch.library` assumes of an operator
without alias annotations).

Why not `custom_op`: its per-call Python besides the autograd formula's (a wrapper that checks
the outputs' aliasing, `torch._disable_dynamo`'s lazy wrapper) is ~12 us of a warm call on the
CPU machine, where the whole host path of a small GEMM was ~90 us (bench/host_overhead.py,
bench/NOTES.md session 18).  Only public `torch.library` / `torch.compiler` APIs are used
(torch 2.4 and later).
"""
from __future__ import annotations

import torch

NAMESPACE = "tritile"
# one fragment for every tritile operator; it must stay alive (a destroyed Library unregisters)
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")


def define(schema: str, impl, fake, backward=None, setup_context=None) -> torch._ops.OpOverload:
    """Define `tritile::<name>` (see the module docstring); its `.default` overload."""
    name = schema.split("(", 1)[0]
    _LIBRARY.define(schema, tags=(torch.Tag.pt2_compliant_tag,))
    _LIBRARY.impl(name, torch.compiler.disable(impl), "CompositeExplicitAutograd")
    qualname = f"{NAMESPACE}::{name}"
    torch.library.register_fake(qualname, fake, lib=_LIBRARY)
    if backward is not None:
        torch.library.register_autograd(qualname, backward, setup_context=setup_context, lib=_LIBRARY)
    return getattr(torch.ops.tritile, name).default
