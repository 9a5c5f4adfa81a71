"""uniform_selects: branch once around a `T.Parallel` whose select has the same outcome on
every lane.

Assumes: any stage (the pass reads `T.Parallel` loops only); it runs after
`consumer_partitions`, so a split kernel's lanes are its partition's rows.

Guarantees: values are unchanged.  In a ``T.Parallel`` whose body selects with
``T.if_then_else(cond, a, b)``, where `cond` compares integer expressions whose difference is
affine in the loop's lane variables (through the body's `Let`s; its other terms lane-free),
or a conjunction / disjunction of such comparisons and lane-free conditions, the loop
becomes::

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
from tritile.ir.transform import Transformer, bound_var, substitute_vars, walk
from tritile.lowering.pipeline_injection import fold

_FLIPS = {">=": ("min", ">=", "max", "<"), ">": ("min", ">", "max", "<="),
          "<=": ("max", "<=", "min", ">"), "<": ("max", "<", "min", ">=")}
# a conjunction holds everywhere when both sides do, nowhere when either side does not; dually
# for a disjunction: op -> (combine "every lane", combine "no lane")
_JUNCTIONS = {"and": ("and", "or"), "&": ("and", "or"), "or": ("or", "and"), "|": ("or", "and")}


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
        # each version gets Vars of its own, so no lane index or Let is live across the branches
        version = [_replace(loop, select, select.args[k]) for k in (1, 2)] + [_renamed(loop)]
        if _never(none):
            inner = version[2]
        else:
            inner = ir.If(none, ir.Seq([version[1]]), ir.Seq([version[2]]), loc=loop.loc)
        if _never(every):
            return inner
        return ir.If(every, ir.Seq([version[0]]), ir.Seq([inner]), loc=loop.loc)


def _never(cond) -> bool:
    return isinstance(cond, ir.Const) and cond.value is False


def _replace(loop: ir.Parallel, select: ir.Call, value) -> ir.Parallel:
    class Sub(Transformer):
        def visit_Call(self, e):
            return value if e == select else e

    return _renamed(Sub().transform(loop))


def _renamed(loop: ir.Parallel) -> ir.Parallel:
    own = list(loop.vars) + [bound_var(s) for s in loop.body.stmts if bound_var(s) is not None]
    return substitute_vars(loop, {v: ir.Var(v.name, v.dtype) for v in own})


def _uniform_conditions(loop: ir.Parallel, cond):
    """(holds on every lane, holds on no lane) as lane-free Exprs, or None."""
    lets = {}
    for s in loop.body.stmts:
        if isinstance(s, ir.Let):
            lets[s.var] = substitute_vars(s.value, lets)
    lanes = dict(zip(loop.vars, loop.extents))
    found = _conditions(cond, lets, lanes)
    if found is None or not found[2]:
        return None  # not affine, or already the same on every lane
    return _simplified(found[0]), _simplified(found[1])


def _conditions(cond, lets: dict, lanes: dict):
    """(holds on every lane, holds on no lane, whether it varies across lanes), or None."""
    if not _uses_lanes(substitute_vars(cond, lets), lanes):
        return cond, ir.UnaryOp("not", cond, ir.bool_), False
    if isinstance(cond, ir.BinOp) and cond.op in _JUNCTIONS:
        sides = [_conditions(side, lets, lanes) for side in (cond.lhs, cond.rhs)]
        if None in sides:
            return None
        (every_l, none_l, varies_l), (every_r, none_r, varies_r) = sides
        both, either = _JUNCTIONS[cond.op]
        return (ir.BinOp(both, every_l, every_r, ir.bool_), ir.BinOp(either, none_l, none_r, ir.bool_),
                varies_l or varies_r)
    if not isinstance(cond, ir.BinOp) or cond.op not in _FLIPS:
        return None
    if cond.lhs.dtype.is_float or cond.rhs.dtype.is_float:
        return None  # rounding: no affine reasoning
    affine = _affine(substitute_vars(ir.BinOp("-", cond.lhs, cond.rhs), lets), lanes)
    if affine is None:
        return None
    rest, coefficients = affine
    low, high = rest, rest
    for var, c in coefficients.items():
        corner = c * (lanes[var] - 1)
        low, high = (low, ir.BinOp("+", high, ir.Const(corner))) if c > 0 else (ir.BinOp("+", low, ir.Const(corner)), high)
    bound = {"min": low, "max": high}
    every_side, every_op, none_side, none_op = _FLIPS[cond.op]
    return (ir.BinOp(every_op, bound[every_side], ir.Const(0), ir.bool_),
            ir.BinOp(none_op, bound[none_side], ir.Const(0), ir.bool_), bool(coefficients))


def _simplified(cond):
    """`cond` folded, with constant operands of and / or / not folded too."""
    class Logic(Transformer):
        def visit_BinOp(self, e):
            constants = [side.value for side in (e.lhs, e.rhs) if isinstance(side, ir.Const)]
            if e.op in ("and", "or") and constants:
                absorbing = e.op == "or"  # True absorbs an or, False an and
                if absorbing in constants:
                    return ir.Const(absorbing, ir.bool_)
                if len(constants) == 2:
                    return ir.Const(not absorbing, ir.bool_)
                return e.rhs if isinstance(e.lhs, ir.Const) else e.lhs
            return e

        def visit_UnaryOp(self, e):
            if e.op == "not" and isinstance(e.operand, ir.Const):
                return ir.Const(not e.operand.value, ir.bool_)
            return e

    return Logic().transform(fold(cond))


def _uses_lanes(e, lanes: dict) -> bool:
    return any(isinstance(n, ir.Var) and n in lanes for n in walk(e))


def _affine(e, lanes: dict):
    """(rest, {lane var: int coefficient}) with ``e == rest + sum(c * var)``, rest lane-free;
    None when `e` is not of that form."""
    if not _uses_lanes(e, lanes):
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
