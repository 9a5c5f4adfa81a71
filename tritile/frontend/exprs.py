"""Scalar expressions: constant folding, dtype promotion and static-extent arithmetic.

Inputs are Python numbers (compile-time constants) or IR `Expr`s.  Guarantees: an operation
on Python numbers stays a Python number (Python semantics, as TileLang's script parser
evaluates them); an operation involving an `Expr` builds IR whose operands already have
the result's dtype (Python numbers become `Const`s of the other side's type, mixed types
are promoted as TVM does: int -> float, narrower -> wider, float16 with bfloat16 ->
float32), so backends never need promotion rules of their own.
"""
from __future__ import annotations

import math
import operator
from typing import Optional

from tritile.errors import CompileError
from tritile.interpreter.values import round_scalar
from tritile.ir import nodes as ir
from tritile.ir.dtypes import DType, as_dtype, bool_, float32, int32
from tritile.ir.printer import expr_str

PYTHON_SCALARS = (bool, int, float)

PY_BINARY = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "<": operator.lt,
    "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
    "&": operator.and_, "|": operator.or_, "^": operator.xor, "<<": operator.lshift,
    ">>": operator.rshift, "max": max, "min": min,
    "and": lambda a, b: a and b, "or": lambda a, b: a or b,
}
_LOGIC = ("and", "or")


def is_python_scalar(value) -> bool:
    return isinstance(value, PYTHON_SCALARS)


def python_dtype(value) -> DType:
    return bool_ if isinstance(value, bool) else int32 if isinstance(value, int) else float32


def make_const(value, dtype: DType) -> ir.Const:
    if dtype.is_float:
        return ir.Const(float(value), dtype)
    if dtype.kind == "bool":
        return ir.Const(bool(value), dtype)
    return ir.Const(int(value), dtype)


def promote(a: DType, b: DType) -> DType:
    if a == b:
        return a
    if a.is_float and b.is_float:
        return a if a.bits > b.bits else b if b.bits > a.bits else float32
    if a.is_float or b.is_float:
        return a if a.is_float else b
    if a.kind == "bool" or b.kind == "bool":
        return b if a.kind == "bool" else a
    return a if a.bits >= b.bits else b


class LiteralRangeError(CompileError, ValueError):
    """A Python float literal beyond the finite range of the float type it is written as (TVM
    rejects these with a ValueError, which TileLang's programs and tests expect)."""


def _check_float_literal(value, dtype: DType, loc):
    if not dtype.is_float or isinstance(value, bool) or not math.isfinite(value) or dtype.bits > 32:
        return
    if dtype.name not in ("float16", "bfloat16", "float32"):
        return  # fp8 literals saturate on conversion (docs/semantics.md)
    low, high = dtype.min.value, dtype.max.value
    if value > high or value < low:
        side = "maximum" if value > high else "minimum"
        raise LiteralRangeError(f"literal value {value!r} exceeds {side} of {dtype}", loc)


def cast(value, dtype, loc=None):
    """`value` converted to `dtype` (a Const for Python numbers, a Cast when types differ).  A
    float literal outside a 16/32-bit float type's finite range is a `LiteralRangeError`."""
    dtype = as_dtype(dtype)
    if is_python_scalar(value):
        _check_float_literal(value, dtype, loc)
        return make_const(value, dtype)
    if not isinstance(value, ir.Expr):
        raise CompileError(f"cannot cast {value!r} to {dtype}", loc)
    if value.dtype == dtype:
        return value
    if isinstance(value, ir.Const):  # folded: the constant as its own type holds it, converted as a Cast would be
        return make_const(round_scalar(round_scalar(value.value, value.dtype), dtype), dtype)
    return ir.Cast(value, dtype)


def _as_expr(value, other_dtype: Optional[DType]):
    if isinstance(value, ir.Expr):
        return value
    if other_dtype is not None and not (isinstance(value, float) and not other_dtype.is_float):
        return make_const(value, other_dtype)
    return make_const(value, python_dtype(value))


def binary(op: str, lhs, rhs, loc=None):
    """``lhs op rhs`` with folding and promotion (`op` is a key of `ir.BINARY_OPS`)."""
    if is_python_scalar(lhs) and is_python_scalar(rhs):
        try:
            return PY_BINARY[op](lhs, rhs)
        except ArithmeticError as exc:
            raise CompileError(f"constant expression {lhs!r} {op} {rhs!r}: {exc}", loc) from None
    for side in (lhs, rhs):
        if not isinstance(side, (ir.Expr,) + PYTHON_SCALARS):
            raise CompileError(f"operator {op!r} needs scalar values, got {type(side).__name__} "
                               f"({side!r})", loc)
    a = _as_expr(lhs, getattr(rhs, "dtype", None))
    b = _as_expr(rhs, getattr(lhs, "dtype", None))
    simplified = _identity(op, a, b)
    if simplified is not None:
        return simplified
    if op in _LOGIC:
        return ir.BinOp(op, a, b, bool_)
    dtype = promote(a.dtype, b.dtype)
    a, b = cast(a, dtype), cast(b, dtype)
    if (op in ("/", "//", "%") and not dtype.is_float and isinstance(b, ir.Const)
            and round_scalar(b.value, dtype) == 0):
        # an unspecified value in every lane (docs/semantics.md), and Triton's LLVM lowering
        # failed on `x % 0` (a mutated FP8 GEMM's promotion test); a literal takes the other
        # operand's type, so an int8 `x / 256` divides by 0 as well (a mutated RMS norm)
        wrapped = "" if b.value == 0 else f" ({b.value!r} as {dtype.name} is 0)"
        raise CompileError(f"integer division by zero: {op} {b.value!r}{wrapped}", loc)
    return ir.BinOp(op, a, b, bool_ if op in ir.COMPARISONS else dtype)


def _is_const(e: ir.Expr, value) -> bool:
    return isinstance(e, ir.Const) and not isinstance(e.value, bool) and e.value == value


def _identity(op, a, b):
    """x + 0, 0 + x, x - 0, x * 1, 1 * x, x // 1: keep the IR readable.  Only where they are
    identities: for floats x + 0.0 is +0.0 at x = -0.0, x - (-0.0) likewise, and x // 1.0 is
    floor(x)."""
    if promote(a.dtype, b.dtype).is_float and op in ("+", "-", "//"):
        positive_zero = op == "-" and _is_const(b, 0) and math.copysign(1.0, b.value) > 0
        return a if positive_zero and promote(a.dtype, b.dtype) == a.dtype else None
    if op == "+" and _is_const(b, 0) and promote(a.dtype, b.dtype) == a.dtype:
        return a
    if op == "+" and _is_const(a, 0) and promote(a.dtype, b.dtype) == b.dtype:
        return b
    if op in ("-", "//") and _is_const(b, 0 if op == "-" else 1) and promote(a.dtype, b.dtype) == a.dtype:
        return a
    if op == "*" and _is_const(b, 1) and promote(a.dtype, b.dtype) == a.dtype:
        return a
    if op == "*" and _is_const(a, 1) and promote(a.dtype, b.dtype) == b.dtype:
        return b
    return None


def unary(op: str, value, loc=None):
    if is_python_scalar(value):
        return {"-": operator.neg, "+": operator.pos, "not": operator.not_, "~": operator.invert}[op](value)
    if not isinstance(value, ir.Expr):
        raise CompileError(f"operator {op!r} needs a scalar value, got {value!r}", loc)
    if op == "+":
        return value
    if op == "-" and isinstance(value, ir.Const):
        return ir.Const(-value.value, value.dtype)
    return ir.UnaryOp(op, value, bool_ if op == "not" else value.dtype)


def math_call(fn: str, args, loc=None):
    """An intrinsic call on runtime values; integer arguments of float functions become float32."""
    exprs = [a if isinstance(a, ir.Expr) else make_const(a, python_dtype(a)) for a in args]
    if fn == "abs" and len(exprs) == 1:
        return ir.Call(fn, (exprs[0],), exprs[0].dtype)
    dtype = exprs[0].dtype
    for e in exprs[1:]:
        dtype = promote(dtype, e.dtype)
    if not dtype.is_float:
        dtype = float32
    return ir.Call(fn, tuple(cast(e, dtype, loc) for e in exprs), dtype)


def select(cond, true_value, false_value, loc=None):
    """``true_value if cond else false_value`` (T.if_then_else)."""
    if is_python_scalar(cond):
        return true_value if cond else false_value
    t_dtype = true_value.dtype if isinstance(true_value, ir.Expr) else None
    f_dtype = false_value.dtype if isinstance(false_value, ir.Expr) else None
    if t_dtype is None and f_dtype is None:
        dtype = promote(python_dtype(true_value), python_dtype(false_value))
    else:
        dtype = promote(t_dtype or f_dtype, f_dtype or t_dtype)
        for v in (true_value, false_value):
            if isinstance(v, float) and not dtype.is_float:
                dtype = float32
    true_value, false_value = cast(true_value, dtype, loc), cast(false_value, dtype, loc)
    if isinstance(true_value, ir.Const) and isinstance(false_value, ir.Const) and \
            _same_bits(true_value.value, false_value.value):
        # a constant whatever `cond` is: the IR's to fold, not left for LLVM to find (Gluon's run-time
        # conversion of such a constant to fp8 stored garbage: docs/semantics.md, fp8 constants)
        return true_value
    return ir.Call("if_then_else", (truth(cond), true_value, false_value), dtype)


def _same_bits(a, b) -> bool:
    """The same value, NaN as NaN and -0.0 apart from 0.0."""
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
        return (a != a and b != b) or (a == b and math.copysign(1.0, a) == math.copysign(1.0, b))
    return a == b


def truth(cond: ir.Expr) -> ir.Expr:
    """A condition as a bool expression."""
    if cond.dtype.kind == "bool":
        return cond
    return ir.BinOp("!=", cond, make_const(0, cond.dtype), bool_)


# --------------------------------------------------------------------------------------
# static extents: (stop - start) must fold to an integer, e.g. (bx + 1) * BM - bx * BM
# --------------------------------------------------------------------------------------


def _linear(e) -> dict:
    """{term key: coefficient}; key None is the constant part."""
    if isinstance(e, bool):
        return {None: int(e)}
    if isinstance(e, int):
        return {None: e}
    if isinstance(e, ir.Const) and isinstance(e.value, int):
        return {None: e.value}
    if isinstance(e, ir.Var):
        return {("var", e.uid): 1}
    if isinstance(e, ir.BinOp) and e.op in ("+", "-"):
        lhs, rhs = _linear(e.lhs), _linear(e.rhs)
        sign = 1 if e.op == "+" else -1
        out = dict(lhs)
        for k, v in rhs.items():
            out[k] = out.get(k, 0) + sign * v
        return out
    if isinstance(e, ir.BinOp) and e.op == "*":
        lhs, rhs = _linear(e.lhs), _linear(e.rhs)
        for scale, other in ((lhs, rhs), (rhs, lhs)):
            if set(scale) == {None}:
                return {k: v * scale[None] for k, v in other.items()}
    return {("term", expr_str(e) if isinstance(e, ir.Expr) else repr(e)): 1}


def static_difference(stop, start) -> Optional[int]:
    """``stop - start`` when it is the same integer for every runtime value, else None."""
    diff = dict(_linear(stop))
    for k, v in _linear(start).items():
        diff[k] = diff.get(k, 0) - v
    if any(v != 0 for k, v in diff.items() if k is not None):
        return None
    return diff.get(None, 0)
