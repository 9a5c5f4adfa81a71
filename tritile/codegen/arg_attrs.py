"""Triton's `tt.divisibility` attributes of a generated kernel's arguments (both backends).

`divisibility_attrs(func, arg_names, signature)` -> ``{(index,): [["tt.divisibility", 16]]}``
for every pointer argument (the launch checks each tensor 16-byte aligned) and every runtime
integer (a `T.dynamic` dim or an integer scalar parameter) whose Var is known to be a multiple
of 16 (`tritile.ir.divisibility`: the variant the runtime chose for the call's values), as
Triton's own launcher specialises integer arguments; its axis analysis then proves the row
pitches aligned and vectorises loads, stores, masks and cp.async.  The runtime scalars are the
kernel's last arguments, in `func.runtime_vars` order (both kernel modules emit them so);
`signature` maps a name to its Triton type ("*fp16", "i32"; None for a TMA descriptor).
"""
from __future__ import annotations

from tritile.ir import nodes as ir
from tritile.ir.divisibility import DIVISOR

_DIVISIBLE = [["tt.divisibility", DIVISOR]]


def divisibility_attrs(func: ir.PrimFunc, arg_names: list, signature: dict) -> dict:
    runtime_vars = func.runtime_vars
    scalars = dict(zip(arg_names[len(arg_names) - len(runtime_vars):], runtime_vars)) if runtime_vars else {}
    attrs = {}
    for i, name in enumerate(arg_names):
        var = scalars.get(name)
        if (signature[name] or "").startswith("*") or (var is not None and var.multiple_of % DIVISOR == 0):
            attrs[(i,)] = _DIVISIBLE
    return attrs
