"""IR-building helpers for tests that construct tile IR by hand (no frontend needed).

Everything returns plain `tritile.ir.nodes` objects.  Python ints/floats/bools are accepted
wherever an expression is expected and become `Const`s; `add`, `mul`, ... build `BinOp`s
whose dtype follows the operands (float if either is float, bool for comparisons).

    bx, by = block_vars(2)
    A = global_buffer("A", (M, K), float16)
    A_s = shared("A_s", (64, 32), float16)
    body = seq(alloc(A_s), copy(region(A, (mul(by, 64), 64), (0, 32)), full(A_s)), ...)
    func = prim_func("f", [A, ...], grid=(2, 2), block_vars=(bx, by), body=body)
    run(func, a, ...)
"""
from __future__ import annotations

import torch

from tritile.interpreter import execute
from tritile.ir import dtypes as dt
from tritile.ir import nodes as ir

LOC = ir.SourceLoc("test_kernel.py", 1, 0, "")


def loc(line: int, text: str = "") -> ir.SourceLoc:
    return ir.SourceLoc("test_kernel.py", line, 0, text)


# ------------------------------------------------------------------------------- expressions

def ex(x) -> ir.Expr:
    """An Expr from an Expr or a Python scalar."""
    return x if isinstance(x, ir.Expr) else ir.const(x)


def _result_dtype(op: str, a: ir.Expr, b: ir.Expr) -> dt.DType:
    if op in ir.COMPARISONS or op in ("and", "or"):
        return dt.bool_
    for side in (a, b):
        if side.dtype.is_float:
            return side.dtype if side.dtype == dt.float64 else dt.float32
    return a.dtype


def binop(op: str, a, b, dtype: dt.DType = None) -> ir.BinOp:
    a, b = ex(a), ex(b)
    return ir.BinOp(op, a, b, dtype or _result_dtype(op, a, b))


def add(a, b):
    return binop("+", a, b)


def sub(a, b):
    return binop("-", a, b)


def mul(a, b):
    return binop("*", a, b)


def floordiv(a, b):
    return binop("//", a, b)


def mod(a, b):
    return binop("%", a, b)


def lt(a, b):
    return binop("<", a, b)


def ge(a, b):
    return binop(">=", a, b)


def call(fn: str, *args, dtype: dt.DType = dt.float32) -> ir.Call:
    return ir.Call(fn, tuple(ex(a) for a in args), dtype)


def cast(value, dtype: dt.DType) -> ir.Cast:
    return ir.Cast(ex(value), dtype)


def var(name: str, dtype: dt.DType = dt.int32) -> ir.Var:
    return ir.Var(name, dtype)


def block_vars(n: int) -> tuple:
    return tuple(ir.Var(name) for name in ("bx", "by", "bz")[:n])


# ------------------------------------------------------------------------------- buffers

def global_buffer(name: str, shape: tuple, dtype: dt.DType) -> ir.Buffer:
    return ir.Buffer(name, tuple(shape), dtype, "global")


def shared(name: str, shape: tuple, dtype: dt.DType, num_versions: int = 1, origin=None) -> ir.Buffer:
    return ir.Buffer(name, tuple(shape), dtype, "shared", origin=origin, num_versions=num_versions)


def fragment(name: str, shape: tuple, dtype: dt.DType) -> ir.Buffer:
    return ir.Buffer(name, tuple(shape), dtype, "fragment")


def var_buffer(name: str, dtype: dt.DType) -> ir.Buffer:
    return ir.Buffer(name, (), dtype, "var")


def region(buffer: ir.Buffer, *dims) -> ir.Region:
    """One entry per dimension: an index (extent 1), a ``(start, extent)`` pair, or ``None``
    for the whole dimension."""
    starts, extents = [], []
    for d, size in zip(dims, buffer.shape):
        if d is None:
            starts.append(ir.const(0))
            extents.append(size)
        elif isinstance(d, tuple):
            starts.append(ex(d[0]))
            extents.append(d[1])
        else:
            starts.append(ex(d))
            extents.append(1)
    return ir.Region(buffer, tuple(starts), tuple(extents))


def full(buffer: ir.Buffer) -> ir.Region:
    return ir.Region.full(buffer)


def load(buffer: ir.Buffer, *indices) -> ir.Load:
    return ir.Load(buffer, tuple(ex(i) for i in indices), buffer.dtype)


# ------------------------------------------------------------------------------- statements

def seq(*stmts) -> ir.Seq:
    out = []
    for s in stmts:
        out.extend(s.stmts if isinstance(s, ir.Seq) else [s])
    return ir.Seq(out)


def alloc(*buffers) -> ir.Seq:
    return ir.Seq([ir.Alloc(b, loc=LOC) for b in buffers])


def store(buffer: ir.Buffer, indices: tuple, value) -> ir.Store:
    return ir.Store(buffer, tuple(ex(i) for i in indices), ex(value), loc=LOC)


def copy(src: ir.Region, dst: ir.Region) -> ir.Copy:
    return ir.Copy(src, dst, loc=LOC)


def fill(dst, value) -> ir.Fill:
    return ir.Fill(dst if isinstance(dst, ir.Region) else full(dst), ex(value), loc=LOC)


def gemm(a, b, c, transpose_a=False, transpose_b=False, clear_accum=False, is_async=False, line=1) -> ir.Gemm:
    regions = [x if isinstance(x, ir.Region) else full(x) for x in (a, b, c)]
    return ir.Gemm(*regions, transpose_a=transpose_a, transpose_b=transpose_b, clear_accum=clear_accum,
                   is_async=is_async, loc=loc(line))


def for_(v: ir.Var, start, stop, *body, kind: str = "serial", num_stages: int = 0) -> ir.For:
    return ir.For(v, ex(start), ex(stop), seq(*body), kind=kind, num_stages=num_stages, loc=LOC)


def parallel(vars_: tuple, extents: tuple, *body) -> ir.Parallel:
    return ir.Parallel(tuple(vars_), tuple(extents), seq(*body), loc=LOC)


def if_(cond, then, otherwise=None) -> ir.If:
    return ir.If(ex(cond), seq(then), None if otherwise is None else seq(otherwise), loc=LOC)


def while_(cond, *body) -> ir.While:
    return ir.While(ex(cond), seq(*body), loc=LOC)


def prim_func(name: str, params: list, grid: tuple, block_vars: tuple, body, dynamic_vars=(),
              dim_bindings=None) -> ir.PrimFunc:
    kernel = ir.Kernel(tuple(ex(g) for g in grid), tuple(block_vars), 128, seq(body), loc=LOC)
    return ir.PrimFunc(name, list(params), kernel, dynamic_vars=list(dynamic_vars),
                       dim_bindings=dict(dim_bindings or {}), loc=LOC)


def run(func: ir.PrimFunc, *tensors: torch.Tensor, dims: dict = None):
    execute(func, list(tensors), dims or {})
