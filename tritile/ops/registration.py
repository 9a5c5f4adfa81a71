"""How tritile's torch operators are defined: `torch.library.Library` definitions, not
`torch.library.custom_op`.

Contract: `define(schema, impl, fake, backward=None, setup_context=None)` defines the operator
`tritile::<name>` of `schema` ("mm(Tensor a, Tensor b) -> Tensor", tagged pt2-compliant as
`custom_op` tags its operators) and returns its overload `torch.ops.tritile.<name>.default`:
* `impl` runs it on every device (the CompositeExplicitAutograd key: CPU tensors reach the
  interpreter, CUDA tensors the compiled kernels), never traced by Dynamo (called behind
  `torch.compiler.disable`, as `custom_op` wraps its implementations, whenever Dynamo's frame
  evaluation is on: an eager call from a frame Dynamo is processing would otherwise be
  compiled, launcher and all; directly when it is off, where the wrapper changes nothing);
* `fake` is its fake implementation (`torch.library.register_fake`: Dynamo and AOTAutograd trace
  the operator with it, dynamic shapes included);
* `backward` / `setup_context`, when given, are its autograd formula
  (`torch.library.register_autograd`, the formula `custom_op`'s `register_autograd` takes); the
  operator then has a twin, `tritile::<name>_compiled` (`COMPILED_TWINS[op]`): the same schema,
  implementation and fake, without the autograd formula.  Graphs past AOTAutograd (what inductor
  lowers: autograd is already in them, and they run with grad mode off) call the twin, which
  skips the formula's Python layer (tritile/contrib/torch_backend.py retargets them).
What `custom_op` checked on every call is the callers' contract here: `impl` returns new
tensors, never an input or a view of one (the aliasing `torch.library` assumes of an operator
without alias annotations).

Why not `custom_op`: its per-call Python besides the autograd formula's (a wrapper that checks
the outputs' aliasing, `torch._disable_dynamo`'s lazy wrapper) costs ~2-3 us a call on the CPU
machine; the formula's layer (a Python autograd kernel that redispatches to the Python
implementation) another ~5 us, which the twins save compiled graphs (bench/host_overhead.py,
bench/NOTES.md session 18).  Only public `torch.library` / `torch.compiler` APIs are used
(torch 2.4 and later), and `torch._C._dynamo.eval_frame.get_eval_frame_callback` (what
`torch.compiler.disable` itself reads) where torch has it.
"""
from __future__ import annotations

import torch

NAMESPACE = "tritile"
# one fragment for every tritile operator; it must stay alive (a destroyed Library unregisters)
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")


# each operator with an autograd formula -> its twin without one, for graphs past autograd
COMPILED_TWINS: dict = {}


def define(schema: str, impl, fake, backward=None, setup_context=None) -> torch._ops.OpOverload:
    """Define `tritile::<name>` (see the module docstring); its `.default` overload."""
    op = _define(schema, impl, fake)
    if backward is not None:
        torch.library.register_autograd(op._name, backward, setup_context=setup_context, lib=_LIBRARY)
        name, rest = schema.split("(", 1)
        COMPILED_TWINS[op] = _define(f"{name}_compiled({rest}", impl, fake)
    return op


def _define(schema: str, impl, fake) -> torch._ops.OpOverload:
    name = schema.split("(", 1)[0]
    _LIBRARY.define(schema, tags=(torch.Tag.pt2_compliant_tag,))
    _LIBRARY.impl(name, _not_traced(impl), "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIBRARY)
    return getattr(torch.ops.tritile, name).default


def _not_traced(impl):
    """`impl` kept from Dynamo's frame evaluation: called directly where no frame evaluation
    callback is installed (eager code, and the graphs Dynamo compiled, which it runs behind
    `disable`), else behind `torch.compiler.disable` (the eager code between graph breaks of a
    frame Dynamo is processing), made on the first such call: importing Dynamo takes ~1.3 s,
    which importing tritile's operators should not cost (`custom_op` defers it too).  Where no
    callback is installed the wrapper would only set it to None and back around `impl`: ~3-4 us
    a call, the most of it Python (bench/NOTES.md session 21)."""
    disabled = None

    def call(*args, **kwargs):
        nonlocal disabled
        # `is_compiling` first: it is True where Dynamo traces this frame (which it reads as a
        # constant), so Dynamo never meets the C function
        if not torch.compiler.is_compiling() and _frame_callback() is None and not torch.compiler.is_exporting():
            return impl(*args, **kwargs)
        if disabled is None:
            disabled = torch.compiler.disable(impl)
        return disabled(*args, **kwargs)

    return call


try:  # the C function Dynamo's own `disable` reads; no Dynamo import
    from torch._C._dynamo.eval_frame import get_eval_frame_callback as _frame_callback
except ImportError:  # a torch without it: every call behind `torch.compiler.disable`
    def _frame_callback():
        return True
