"""Expression evaluation of the reference interpreter, scalar and vectorised.

Contract
--------
`Evaluator.eval(expr)` returns a Python scalar when every input is a scalar and a torch
tensor when a `T.Parallel` lane variable (bound to an index tensor) or a lane-dependent
value takes part; the two paths share the operator tables below, so one `BinOp` has one
meaning.  Semantics: docs/semantics.md (TileLang's).  ``//`` and ``%`` are floor division /
floor modulo (floats: ``floor(a / b)`` and ``a - floor(a / b) * b``); ``/`` on integers
truncates toward zero; T.max / T.min of floats ignore NaN.  Every operation's result is
rounded to its dtype: integers wrap at their width, floats narrower than 32 bits round
(they compute in float32, float64 for float64; scalar results are rounded to float32 so
both paths agree bit for bit).  `Cast` rounds to its type.  The evaluator reads `env` (Var -> value),
`memory` (for `Load`), `mask` (active lanes) and `stmt` (the statement being executed,
for error locations), which the executor keeps current.
"""
from __future__ import annotations

import math

import torch

from tritile.errors import CompileError
from tritile.interpreter import philox
from tritile.interpreter import values as V
from tritile.interpreter.memory import Memory
from tritile.ir import nodes as ir
from tritile.ir.printer import format_node

# ---------------------------------------------------------------------------- scalar ops


def _scalar_div(a, b, dtype):
    if dtype.is_float:
        try:
            return a / b
        except ZeroDivisionError:
            return math.nan if a == 0 or a != a else math.copysign(math.inf, a)
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b > 0) else -quotient


def _scalar_floordiv(a, b, dtype):
    return _tensor_floordiv(a, b, dtype).item() if dtype.is_float else a // b


def _scalar_mod(a, b, dtype):
    return _tensor_mod(a, b, dtype).item() if dtype.is_float else a % b


def _fmax(a, b, d):  # fmaxf: a NaN operand is ignored
    return b if a != a else a if b != b else max(a, b)


def _fmin(a, b, d):
    return b if a != a else a if b != b else min(a, b)


def _logical_or_bitwise(logical, bitwise):
    return lambda a, b, dtype: logical(bool(a), bool(b)) if dtype.kind == "bool" else bitwise(a, b)


_SCALAR_BINOPS = {
    "+": lambda a, b, d: a + b,
    "-": lambda a, b, d: a - b,
    "*": lambda a, b, d: a * b,
    "/": _scalar_div,
    "//": _scalar_floordiv,
    "%": _scalar_mod,
    "**": lambda a, b, d: float(a) ** b if d.is_float else a ** b,
    "<": lambda a, b, d: a < b,
    "<=": lambda a, b, d: a <= b,
    ">": lambda a, b, d: a > b,
    ">=": lambda a, b, d: a >= b,
    "==": lambda a, b, d: a == b,
    "!=": lambda a, b, d: a != b,
    "and": lambda a, b, d: bool(a) and bool(b),
    "or": lambda a, b, d: bool(a) or bool(b),
    "&": _logical_or_bitwise(lambda a, b: a and b, lambda a, b: a & b),
    "|": _logical_or_bitwise(lambda a, b: a or b, lambda a, b: a | b),
    "^": _logical_or_bitwise(lambda a, b: a != b, lambda a, b: a ^ b),
    "<<": lambda a, b, d: a << b,
    ">>": lambda a, b, d: a >> b,
    "max": _fmax,
    "min": _fmin,
}

# ---------------------------------------------------------------------------- tensor ops
T = V.as_tensor


def _int_division(a, b, rounding_mode):
    """(quotient, floor remainder) of integer lanes.  A lane dividing by 0 (its value is
    unspecified: lanes a select discards compute it too) gets a, 0; by -1 it gets -a, 0
    without the CPU's trap on INT64_MIN / -1."""
    a, b = T(a), T(b)
    special = (b == 0) | (b == -1)
    safe = torch.where(special, torch.ones((), dtype=b.dtype), b)
    quotient = torch.div(a, safe, rounding_mode=rounding_mode)
    quotient = torch.where(b == -1, -a, quotient)
    remainder = torch.where(special, torch.zeros((), dtype=b.dtype), torch.remainder(a, safe))
    return quotient, remainder


def _tensor_div(a, b, dtype):
    if dtype.is_float:
        return torch.true_divide(T(a), T(b))
    return _int_division(a, b, "trunc")[0]


def _float_operands(a, b, dtype):
    compute = V.compute_dtype(dtype)
    return T(a, compute), T(b, compute)


def _tensor_floordiv(a, b, dtype):
    if dtype.is_float:
        a, b = _float_operands(a, b, dtype)
        return torch.floor(torch.true_divide(a, b))
    return _int_division(a, b, "floor")[0]


def _tensor_mod(a, b, dtype):
    if dtype.is_float:  # TileLang's a - floor(a / b) * b, the product rounded (no fma)
        a, b = _float_operands(a, b, dtype)
        product = torch.floor(torch.true_divide(a, b)) * b
        return a - product
    return _int_division(a, b, "floor")[1]


def normalize(value, dtype):
    """An operation's result rounded to its dtype: integers wrap in two's complement at the
    dtype's width, floats narrower than 32 bits round to nearest even (kept in the compute
    dtype), fp8 saturating.  Scalars stay Python scalars."""
    if dtype.kind == "bool" or dtype.is_float and dtype.bits >= 32 or dtype.bits == 64 and V.is_tensor(value):
        return value  # a Python int is unbounded: abs(INT64_MIN) wraps below
    if not V.is_tensor(value):
        if dtype.is_int:
            return V.wrap_int(int(value), dtype.bits, dtype.kind == "int")
        return V.round_scalar(value, dtype)
    if dtype.is_int:
        if dtype.kind == "uint" or dtype.bits not in (8, 16, 32):
            return value & ((1 << dtype.bits) - 1)
        return value.to(dtype.torch).to(torch.int64)
    if dtype.bits == 8:
        value = V.saturate_fp8(value, dtype)
    return value.to(dtype.torch).to(torch.float32)


def _tensor_bitwise(fn):
    return lambda a, b, d: fn(T(a), T(b))


_TENSOR_BINOPS = {
    "+": lambda a, b, d: a + b,
    "-": lambda a, b, d: a - b,
    "*": lambda a, b, d: a * b,
    "/": _tensor_div,
    "//": _tensor_floordiv,
    "%": _tensor_mod,
    "**": lambda a, b, d: torch.pow(T(a), b),
    "<": lambda a, b, d: a < b if V.is_tensor(a) else b > a,
    "<=": lambda a, b, d: a <= b if V.is_tensor(a) else b >= a,
    ">": lambda a, b, d: a > b if V.is_tensor(a) else b < a,
    ">=": lambda a, b, d: a >= b if V.is_tensor(a) else b <= a,
    "==": lambda a, b, d: T(a) == b,
    "!=": lambda a, b, d: T(a) != b,
    "and": _tensor_bitwise(torch.logical_and),
    "or": _tensor_bitwise(torch.logical_or),
    "&": _tensor_bitwise(torch.bitwise_and),
    "|": _tensor_bitwise(torch.bitwise_or),
    "^": _tensor_bitwise(torch.bitwise_xor),
    "<<": _tensor_bitwise(torch.bitwise_left_shift),
    ">>": _tensor_bitwise(torch.bitwise_right_shift),
    "max": lambda a, b, d: torch.fmax(T(a), T(b)) if d.is_float else torch.maximum(T(a), T(b)),
    "min": lambda a, b, d: torch.fmin(T(a), T(b)) if d.is_float else torch.minimum(T(a), T(b)),
}

# Float intrinsics, applied to float tensors (scalars are wrapped in 0-d tensors).
_FLOAT_CALLS = {
    "exp": torch.exp, "exp2": torch.exp2, "log": torch.log, "log2": torch.log2,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "tanh": torch.tanh, "sin": torch.sin,
    "cos": torch.cos, "sigmoid": torch.sigmoid, "floor": torch.floor, "ceil": torch.ceil,
    "abs": torch.abs, "pow": torch.pow, "fma": lambda x, y, z: x * y + z,
}

# float -> bool (T.isnan / T.isinf / T.isfinite)
_FLOAT_PREDICATES = {"isnan": torch.isnan, "isinf": torch.isinf, "isfinite": torch.isfinite}


def _unary(op: str, a):
    if op == "-":
        return -a
    if V.is_tensor(a):
        if op == "not" or a.dtype == torch.bool:
            return torch.logical_not(a)
        return torch.bitwise_not(a)
    if op == "not" or isinstance(a, bool):
        return not a
    return ~a


class Evaluator:
    def __init__(self, env: dict, memory: Memory):
        self.env = env
        self.memory = memory
        self.mask = None  # active lanes inside T.Parallel
        self.stmt = None  # statement being executed

    def error(self, message: str) -> CompileError:
        return CompileError(message, getattr(self.stmt, "loc", None))

    def eval(self, e):
        if isinstance(e, (int, float, bool)):  # shapes and extents may be plain Python ints
            return e
        method = self._EXPRS.get(type(e))
        if method is None:
            raise self.error(f"the interpreter cannot evaluate {type(e).__name__} {e!r}")
        return method(self, e)

    def scalar(self, e):
        """Evaluate an expression that must not depend on T.Parallel lanes."""
        value = self.eval(e)
        if not V.is_tensor(value):
            return value
        if value.dim() == 0:
            return value.item()
        raise self.error(f"{format_node(e).strip()} depends on a T.Parallel loop variable where a scalar "
                         f"is required")

    def truth(self, value) -> bool:
        return bool(value.item()) if V.is_tensor(value) else bool(value)

    # ------------------------------------------------------------------ node kinds
    def _var(self, e: ir.Var):
        try:
            return self.env[e]
        except KeyError:
            raise self.error(f"variable {e.name} is used before it is bound") from None

    def _const(self, e: ir.Const):
        """The constant rounded to its dtype (a folded cast may have left it outside)."""
        return V.round_scalar(e.value, e.dtype)

    def _binop(self, e: ir.BinOp):
        return self._apply(e.op, self.eval(e.lhs), self.eval(e.rhs), e)

    def _apply(self, op: str, a, b, e: ir.Expr):
        if V.is_tensor(a) or V.is_tensor(b):  # scalars join in the operands' compute dtype
            compute = V.compute_dtype(e.lhs.dtype if isinstance(e, ir.BinOp) else e.args[0].dtype)
            a, b = (x if V.is_tensor(x) else T(x, compute) for x in (a, b))
            return normalize(_TENSOR_BINOPS[op](a, b, e.dtype), e.dtype)
        if op in ("/", "//", "%") and b == 0 and not e.dtype.is_float:
            raise self.error(f"integer division by zero in {format_node(e).strip()}")
        result = _SCALAR_BINOPS[op](a, b, e.dtype)
        if isinstance(result, float) and e.dtype.is_float and e.dtype.bits < 64:
            result = V.to_float32(result)
        return normalize(result, e.dtype)

    def _unaryop(self, e: ir.UnaryOp):
        return normalize(_unary(e.op, self.eval(e.operand)), e.dtype)

    def _call(self, e: ir.Call):
        if e.fn == "infinity":
            return math.inf
        args = [self.eval(a) for a in e.args]
        if e.fn == "if_then_else":
            cond, then, other = args
            if not V.is_tensor(cond):
                return then if cond else other
            compute = V.compute_dtype(e.dtype)  # a float64 branch's constant must not pass through float32
            return torch.where(cond.to(torch.bool), T(then, compute), T(other, compute))
        if e.fn in ("max", "min"):
            if len(args) != 2:
                raise self.error(f"T.{e.fn} takes 2 arguments, got {len(args)}")
            return self._apply(e.fn, args[0], args[1], e)
        if e.fn == "reinterpret":
            return V.reinterpret_bits(args[0], e.args[0].dtype, e.dtype)
        if e.fn == "philox":  # uint32 values in int64, as the interpreter keeps uint32
            word = philox.curand_word(*args)
            return word if any(V.is_tensor(a) for a in args) else int(word)
        if e.fn in _FLOAT_PREDICATES:
            value = _FLOAT_PREDICATES[e.fn](T(args[0], torch.float32 if e.args[0].dtype.bits < 64 else torch.float64))
            return value if V.is_tensor(args[0]) else bool(value.item())
        if e.fn in ("floor", "ceil", "abs") and not e.dtype.is_float:
            return normalize(abs(args[0]), e.dtype) if e.fn == "abs" else args[0]
        fn = _FLOAT_CALLS.get(e.fn)
        if fn is None:
            raise self.error(f"unknown intrinsic T.{e.fn}")
        dtype = V.compute_dtype(e.dtype) if e.dtype.is_float else torch.float32
        result = normalize(fn(*(T(a, dtype) for a in args)), e.dtype)
        return result if any(V.is_tensor(a) for a in args) else result.item()

    def _cast(self, e: ir.Cast):
        value = self.eval(e.value)
        if V.is_tensor(value):
            return V.convert_tensor(value, e.dtype)
        return V.round_scalar(value, e.dtype)

    def _load(self, e: ir.Load):
        indices = [self.eval(i) for i in e.indices]
        return self.memory.load(e.buffer, indices, self.mask, self.stmt)

    def _table_read(self, e: ir.TableRead):
        index = self.scalar(e.index)
        if not 0 <= index < len(e.table.values):
            raise self.error(f"{format_node(e).strip()}: index {index} outside a table of {len(e.table.values)}")
        return e.table.values[index]

    _EXPRS = {ir.Var: _var, ir.Const: _const, ir.BinOp: _binop, ir.UnaryOp: _unaryop, ir.Call: _call,
              ir.Cast: _cast, ir.Load: _load, ir.TableRead: _table_read}
