"""uniform_selects: branch once around a `T.Parallel` whose select has the same outcome on
every lane.

Assumes: any stage (the pass reads `T.Parallel` loops only); it runs after
`consumer_partitions`, so a split kernel's lanes are its partition's rows.

Guarantees: values are unchanged.  In a ``T.Parallel`` whose body selects with
``T.if_then_else(cond, a, b)``, where `cond` compares integer expressions whose difference is
affine in the loop's lane variables (through the body's `Let`s; its other terms lane-free),
the loop becomes::

    if <cond holds on every lane>:   <the loop with the select replaced by a>
    elif <cond holds on no lane>:    <the loop with the select replaced by b>
    else:                            <the loop>

The lane-free conditions are the affine difference's minimum and maximum over the lanes'
box (a coefficient's sign picks the box corner), so the first two branches are taken only
when they compute what the select would.  The first select of each loop is treated.  Why:
causal attention masks every key tile with ``if_then_else(q_idx >= k_idx, 0, -inf)``, but
only the tiles on the diagonal mix both outcomes; elsewhere the compare and select are work
on the softmax's critical path.
"""
from __future__ import annotations

import dataclasses

from tritile.ir import nodes as ir
from tritile.ir.transform import Transformer, substitute_vars, walk
from tritile.lowering.pipeline_injection import fold

_FLIPS = {">=": ("min", ">=", "max", "<"), ">": ("min", ">", "max", "<="),
          "<=": ("max", "<=", "min", ">"), "<": ("max", "<", "min", ">=")}


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    return dataclasses.replace(func, kernel=dataclasses.replace(func.kernel, body=_Versions().transform(func.kernel.body)))


class _Versions(Transformer):
    def visit_Parallel(self, loop: ir.Parallel):
        select = next((n for n in walk(loop.body) if isinstance(n, ir.Call) and n.fn == "if_then_else"), None)
        if select is None:
            return loop
        conditions = _uniform_conditions(loop, select.args[0])
        if conditions is None:
            return loop
        every, none = conditions
        taken = [_replace(loop, select, select.args[k]) for k in (1, 2)]
        mixed = ir.If(none, ir.Seq([taken[1]]), ir.Seq([loop]), loc=loop.loc)
        return ir.If(every, ir.Seq([taken[0]]), ir.Seq([mixed]), loc=loop.loc)


def _replace(loop: ir.Parallel, select: ir.Call, value) -> ir.Parallel:
    class Sub(Transformer):
        def visit_Call(self, e):
            return value if e == select else e

    return Sub().transform(loop)


def _uniform_conditions(loop: ir.Parallel, cond):
    """(holds on every lane, holds on no lane) as lane-free Exprs, or None."""
    if not isinstance(cond, ir.BinOp) or cond.op not in _FLIPS:
        return None
    if cond.lhs.dtype.is_float or cond.rhs.dtype.is_float:
        return None  # rounding: no affine reasoning
    lets = {}
    for s in loop.body.stmts:
        if isinstance(s, ir.Let):
            lets[s.var] = substitute_vars(s.value, lets)
    difference = substitute_vars(ir.BinOp("-", cond.lhs, cond.rhs), lets)
    lanes = dict(zip(loop.vars, loop.extents))
    affine = _affine(difference, lanes)
    if affine is None or not affine[1]:
        return None
    rest, coefficients = affine
    low, high = rest, rest
    for var, c in coefficients.items():
        corner = c * (lanes[var] - 1)
        low, high = (low, ir.BinOp("+", high, ir.Const(corner))) if c > 0 else (ir.BinOp("+", low, ir.Const(corner)), high)
    bound = {"min": low, "max": high}
    every_side, every_op, none_side, none_op = _FLIPS[cond.op]
    every = fold(ir.BinOp(every_op, bound[every_side], ir.Const(0), ir.bool_))
    none = fold(ir.BinOp(none_op, bound[none_side], ir.Const(0), ir.bool_))
    return every, none


def _affine(e, lanes: dict):
    """(rest, {lane var: int coefficient}) with ``e == rest + sum(c * var)``, rest lane-free;
    None when `e` is not of that form."""
    if not any(isinstance(n, ir.Var) and n in lanes for n in walk(e)):
        return e, {}
    if isinstance(e, ir.Var):
        return ir.Const(0), {e: 1}
    if isinstance(e, ir.Cast) and not e.dtype.is_float:
        return _affine(e.value, lanes)
    if not isinstance(e, ir.BinOp):
        return None
    if e.op in ("+", "-"):
        lhs, rhs = _affine(e.lhs, lanes), _affine(e.rhs, lanes)
        if lhs is None or rhs is None:
            return None
        sign = 1 if e.op == "+" else -1
        coefficients = dict(lhs[1])
        for var, c in rhs[1].items():
            coefficients[var] = coefficients.get(var, 0) + sign * c
        return ir.BinOp(e.op, lhs[0], rhs[0], e.dtype), {v: c for v, c in coefficients.items() if c}
    if e.op == "*":
        for scale, term in ((e.lhs, e.rhs), (e.rhs, e.lhs)):
            if isinstance(scale, ir.Const) and isinstance(scale.value, int) and not isinstance(scale.value, bool):
                inner = _affine(term, lanes)
                if inner is None:
                    return None
                return (ir.BinOp("*", inner[0], scale, e.dtype),
                        {v: c * scale.value for v, c in inner[1].items()})
    return None
