"""The accumulator dtypes the GPU backends' `T.gemm` takes for its operands' dtypes.

The tensor cores accumulate 16- and 8-bit float operands into float32 (float16 and fp8 ones also
into float16) and 8-bit integers into int32; the FMA path that takes everything else computes in
the accumulator's dtype, 8-bit integers converted to float32 included.  Triton 3.6 rejects the
other combinations late - an MLIR pass failure (a bfloat16 accumulator, a float16 one of
bfloat16 operands, an int16 one of int8) - or aborts the Python process (a float64 or int32
accumulator of float16 operands in `tl.dot`; bench/NOTES.md, session 27).  The interpreter
computes any combination (in float32 or float64, rounded once into the accumulator), so on a GPU
target such a gemm is a `CompileError` at its line, before Triton sees it.
"""
from __future__ import annotations

from tritile.errors import CompileError
from tritile.ir import nodes as ir


def accepted(a_dtype, b_dtype) -> tuple:
    """The accumulator dtype names a gemm of `a_dtype` x `b_dtype` operands takes on the GPU
    (empty: any - the FMA path computes in the accumulator's dtype)."""
    operands = (a_dtype, b_dtype)
    if all(d.is_float and d.bits <= 16 for d in operands):
        return ("float32",) if "bfloat16" in (a_dtype.name, b_dtype.name) else ("float32", "float16")
    if all(d.bits == 8 and d.is_int for d in operands):
        return ("int32", "float32")
    return ()


def check(g: ir.Gemm, backend: str):
    """CompileError (at the gemm's line) unless `backend` can accumulate `g`'s operands into its C."""
    a, b, c = g.a.buffer, g.b.buffer, g.c.buffer
    takes = () if g.tf32 else accepted(a.dtype, b.dtype)
    if takes and c.dtype.name not in takes:
        operands = a.dtype if a.dtype == b.dtype else f"{a.dtype} x {b.dtype}"
        raise CompileError(f"T.gemm of {operands} operands accumulates into {' or '.join(takes)} on the {backend} "
                           f"backend, not {c.dtype} ({c.name}): accumulate into a {takes[0]} fragment and T.copy it "
                           f"into {c.name}", g.loc)
