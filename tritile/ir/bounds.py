"""Static upper bounds of integer expressions: what a pass may rely on without knowing runtime values.

`upper_bound(e, bindings)` is an int that `e` never exceeds, or None when the expression gives
none (a runtime value without a constant cap); `bindings` ({id(Var): Expr}, from `let_bindings`)
lets it see through the scalars `Let` binds.  Only monotone rules are used: constants, `min`
(a bound of either operand bounds it), `max` / `+` (both operands), and `-`, `*`, `//`
by a constant (``- c``; ``* c`` and ``// c`` for c > 0 keep the order of their left operand).
`max_trip_count(loop)` bounds the iterations of a unit-step `For` starting at a constant.
"""
from __future__ import annotations

from typing import Optional

from tritile.ir import nodes as ir
from tritile.ir.transform import walk


def _const(e) -> Optional[int]:
    if isinstance(e, ir.Const) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return e.value
    return None


def let_bindings(func: ir.PrimFunc) -> dict:
    """{id(var): value} of every `Let` in `func` (a Let's var is bound once, immutable)."""
    return {id(s.var): s.value for s in walk(func.kernel.body) if isinstance(s, ir.Let)}


def upper_bound(e, bindings: dict = None) -> Optional[int]:
    """An int that `e` never exceeds, else None."""
    bindings = bindings or {}
    if isinstance(e, int) and not isinstance(e, bool):
        return e
    if _const(e) is not None:
        return _const(e)
    if isinstance(e, ir.Var):
        return upper_bound(bindings[id(e)], bindings) if id(e) in bindings else None
    if isinstance(e, ir.Call) and e.fn in ("min", "max") and len(e.args) == 2:
        op, lhs, rhs = e.fn, e.args[0], e.args[1]
    elif isinstance(e, ir.BinOp):
        op, lhs, rhs = e.op, e.lhs, e.rhs
    else:
        return None
    a, b = upper_bound(lhs, bindings), upper_bound(rhs, bindings)
    if op == "min":
        known = [x for x in (a, b) if x is not None]
        return min(known) if known else None
    if a is None:
        return None
    c = _const(rhs)
    if op in ("max", "+") and b is not None:
        return max(a, b) if op == "max" else a + b
    if op == "-" and c is not None:
        return a - c
    if op == "*" and c is not None and c > 0:
        return a * c
    if op == "//" and c is not None and c > 0:
        return a // c
    return None


def max_trip_count(loop: ir.For, bindings: dict = None) -> Optional[int]:
    """The most iterations `loop` can run (>= 0), or None when that is not known statically."""
    start, stop = _const(loop.start), upper_bound(loop.stop, bindings)
    if start is None or stop is None or _const(loop.step) != 1:
        return None
    return max(stop - start, 0)
