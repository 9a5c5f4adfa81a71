"""Triton's `tt.divisibility` attributes of a generated kernel's arguments (both backends).

`divisibility_attrs(func, arg_names, signature)` -> ``{(index,): [["tt.divisibility", 16]]}``
for every pointer argument (the launch checks each tensor 16-byte aligned) and every runtime
dim whose Var is known to be a multiple of 16 (`tritile.ir.divisibility`: the variant the
runtime chose for the call's sizes), as Triton's own launcher specialises integer arguments;
its axis analysis then proves the row pitches aligned and vectorises loads, stores and
cp.async.  The runtime dims are the kernel's last arguments, in `func.dynamic_vars` order
(both kernel modules emit them so); `signature` maps a name to its Triton type ("*fp16", "i32";
None for a TMA descriptor).
"""
from __future__ import annotations

from tritile.ir import nodes as ir
from tritile.ir.divisibility import DIVISOR

_DIVISIBLE = [["tt.divisibility", DIVISOR]]


def divisibility_attrs(func: ir.PrimFunc, arg_names: list, signature: dict) -> dict:
    n_dims = len(func.dynamic_vars)
    dims = dict(zip(arg_names[len(arg_names) - n_dims:], func.dynamic_vars)) if n_dims else {}
    attrs = {}
    for i, name in enumerate(arg_names):
        var = dims.get(name)
        if (signature[name] or "").startswith("*") or (var is not None and var.multiple_of % DIVISOR == 0):
            attrs[(i,)] = _DIVISIBLE
    return attrs
