"""TVM's `tvm.tirx` (its TIR expression module) as far as TileLang's example programs use it,
on tritile's expressions: what these build inside a kernel is what the T names below build.

* `const(value, dtype)`: a constant of that dtype (`tirx.const(3, T.uint16)` is a uint16, so bit
  operations with it stay 16 bits wide, as in TVM);
* `reinterpret(dtype, value)`: TVM's argument order of `T.reinterpret(value, dtype)`;
* `Select(condition, true_value, false_value)`: `T.Select`; `Cast(dtype, value)`: `T.Cast`;
  `Min(a, b)`: `T.min`;
* `PrimExpr`: the class of tritile's scalar expressions (for annotations and isinstance).
"""
from __future__ import annotations

from tritile import language as T
from tritile.language import _foldable  # a T-style expression helper: folds on numbers, lowers in kernels
from tritile.frontend.exprs import make_const
from tritile.ir import nodes as ir
from tritile.ir.dtypes import as_dtype

__all__ = ["const", "reinterpret", "Select", "Cast", "Min", "PrimExpr"]

PrimExpr = ir.Expr
Select = T.Select
Cast = T.Cast
Min = T.min
reinterpret = _foldable("reinterpret", lambda dtype, value: T.reinterpret.__wrapped__(value, dtype))


def const(value, dtype="int32") -> ir.Const:
    """A constant of `dtype` (TVM's default int32)."""
    return make_const(value, as_dtype(dtype))
