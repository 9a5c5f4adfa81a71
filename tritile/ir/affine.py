"""Integer expressions as affine forms over their Vars.

`affine(e)`: ``({Var: coefficient}, constant)`` of an expression that is a sum of constant
multiples of Vars (``+``, ``-``, ``*`` by a constant), else None.  `solve_dim(dim, var, size)`:
the value of `var` that makes a tensor dimension `dim` - `var` itself, or affine in `var` alone
(TileLang's `T.Tensor((n * 4,), ...)`, `(n * 3 + 1,)`) - equal `size`, bound when a call's tensor
has that size.
"""
from __future__ import annotations

from tritile.ir import nodes as ir


def affine(e):
    """{Var: coefficient} and the constant of `e`, or None when `e` is not affine."""
    if isinstance(e, ir.Var):
        return {e: 1}, 0
    if isinstance(e, ir.Const) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return {}, e.value
    if isinstance(e, ir.BinOp) and e.op in ("+", "-", "*"):
        lhs, rhs = affine(e.lhs), affine(e.rhs)
        if lhs is None or rhs is None:
            return None
        if e.op == "*":
            if lhs[0] and rhs[0]:
                return None
            (terms, _), scale = (lhs, rhs[1]) if lhs[0] else (rhs, lhs[1])
            return {v: c * scale for v, c in terms.items()}, lhs[1] * rhs[1]
        sign = 1 if e.op == "+" else -1
        terms = dict(lhs[0])
        for v, c in rhs[0].items():
            terms[v] = terms.get(v, 0) + sign * c
        return {v: c for v, c in terms.items() if c}, lhs[1] + sign * rhs[1]
    return None


def solvable(dim, var: ir.Var) -> bool:
    """Is `dim` `var` itself or affine in `var` alone?"""
    form = affine(dim)
    return form is not None and list(form[0]) == [var]


def solve_dim(dim, var: ir.Var, size: int, label: str) -> int:
    """The value of `var` for which `dim` (see `solvable`) is `size`; a ValueError naming
    `label` (the argument) when no integer gives it."""
    if dim is var:
        return size
    (terms, offset) = affine(dim)
    scale = terms[var]
    value, rest = divmod(size - offset, scale)
    if rest:
        from tritile.ir.printer import expr_str

        raise ValueError(f"{label}: a dimension of size {size} is not {expr_str(dim)} for any integer {var.name}")
    return value
