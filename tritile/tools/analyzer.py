"""`Analyzer`: a static estimate of a tile program's work (TileLang's `tilelang/tools/Analyzer.py`).

    result = Analyzer.analysis(kernel.get_tir(block_M=128, ...), CUDA("cuda"))
    result.total_flops, result.total_global_bytes, result.estimated_time, ...

It walks tritile's tile IR (`tritile.ir.nodes`, the frontend's `PrimFunc`; a `JITKernel`'s
frontend stage; every kernel of a function of several) and counts, per block, then times the
grid's block count:

* `T.gemm`: 2 * M * N * K (from the operand tiles' shapes);
* every tile op's region of a global tensor (`T.copy` from / to global memory, `T.fill` /
  `T.atomic_add` of a global region, ...): its elements times the tensor's element size - a copy
  between two global regions counts both;
* element reads / writes of global tensors (`A[i, j]` inside `T.Parallel`, `T.im2col`'s gather,
  a scalar read of an index table): the element size, times the `T.Parallel` extents around them;
* a loop multiplies what its body counts by its trip count (`T.Pipelined`, `T.serial`, `range`:
  compile-time counts only, else a ValueError); an `if` counts its larger branch; a `while`
  body counts once.

Mirrored: `Analyzer(fn, device)`, `.ir_pass()`, `.calculate()`, `Analyzer.analysis(fn, device)`, and
`AnalysisResult`'s fields.  Different from TileLang: TileLang counts only `tl.copy` (the global
side) and `tl.gemm` calls, and its peak comes from a small table of CUDA-core numbers (none for
sm_90) and a relative "bandwidth" constant.  Here `expected_tflops` / `expected_bandwidth_GBps` are
the device's `peak_tflops` (dense fp16 tensor cores) and `memory_bandwidth_GBps`
(`tritile.carver.arch`), and `estimated_time` = max(FLOPs / peak, bytes / bandwidth) seconds: a
roofline bound that ignores caches, latency and occupancy.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from tritile.ir import nodes as ir

__all__ = ["AnalysisResult", "Analyzer"]


@dataclass(frozen=True)
class AnalysisResult:
    """total_flops: floating-point operations; total_global_bytes: bytes read and written in global
    memory; estimated_time: seconds (the roofline bound); expected_tflops / expected_bandwidth_GBps:
    the device's peaks the estimate divides by."""

    total_flops: int
    total_global_bytes: int
    estimated_time: float
    expected_tflops: float
    expected_bandwidth_GBps: float


def _static_int(expr, what: str) -> int:
    if isinstance(expr, (int, bool)):
        return int(expr)
    if isinstance(expr, ir.Const) and isinstance(expr.value, (int, bool)):
        return int(expr.value)
    raise ValueError(f"Analyzer: {what} is not a compile-time integer ({expr}); the analysis needs static "
                     f"grids and trip counts")


def _is_global(buffer) -> bool:
    return isinstance(buffer, ir.Buffer) and buffer.scope == "global"


class _Counts:
    """What one walk counted: FLOPs and global bytes."""

    def __init__(self, flops: int = 0, bytes_: int = 0):
        self.flops, self.bytes = flops, bytes_

    def add(self, other: "_Counts", times: int = 1) -> None:
        self.flops += other.flops * times
        self.bytes += other.bytes * times


class Analyzer:
    def __init__(self, fn, device=None):
        from tritile.runtime.kernel import JITKernel

        if isinstance(fn, JITKernel):
            fn = fn.stages[0][1]
        if not isinstance(fn, ir.PrimFunc):
            raise TypeError(f"Analyzer expects a tritile PrimFunc (a @T.prim_func, f.get_tir(...)) or a JITKernel, "
                            f"got {type(fn).__name__}")
        if device is None:
            from tritile.carver.arch import auto_infer_current_arch

            device = auto_infer_current_arch()
        self.fn = fn
        self.device = device
        self.total_flops = 0
        self.total_global_bytes = 0

    # -- the walk ----------------------------------------------------------------------------

    def ir_pass(self) -> "Analyzer":
        """Count the FLOPs and global bytes of every kernel of the function."""
        self.total_flops = self.total_global_bytes = 0
        for kernel in self.fn.kernels:
            blocks = math.prod(_static_int(extent, "the grid extent") for extent in kernel.grid)
            counts = self._stmt(kernel.body)
            self.total_flops += counts.flops * blocks
            self.total_global_bytes += counts.bytes * blocks
        return self

    def _stmt(self, stmt) -> _Counts:
        counts = _Counts()
        if isinstance(stmt, ir.Seq):
            for s in stmt.stmts:
                counts.add(self._stmt(s))
        elif isinstance(stmt, ir.For):
            start = _static_int(stmt.start, f"the start of loop {stmt.var.name}")
            stop = _static_int(stmt.stop, f"the end of loop {stmt.var.name}")
            step = _static_int(stmt.step, f"the step of loop {stmt.var.name}")
            counts.add(self._stmt(stmt.body), max(0, -(-(stop - start) // step)))
        elif isinstance(stmt, ir.Parallel):
            extents = math.prod(_static_int(e, "a T.Parallel extent") for e in stmt.extents)
            counts.add(self._stmt(stmt.body), extents)
        elif isinstance(stmt, ir.If):
            counts.add(self._expr(stmt.cond))
            then = self._stmt(stmt.then_body)
            other = self._stmt(stmt.else_body) if stmt.else_body is not None else _Counts()
            counts.add(_Counts(max(then.flops, other.flops), max(then.bytes, other.bytes)))
        elif isinstance(stmt, ir.Gemm):
            m, n = (int(e) for e in stmt.c.extents[-2:])
            a_rows, a_cols = (int(e) for e in stmt.a.extents[-2:])
            k = a_rows if stmt.transpose_a else a_cols
            counts.flops += 2 * m * n * k
        elif isinstance(stmt, ir.Store):
            if _is_global(stmt.buffer):
                counts.bytes += stmt.buffer.dtype.itemsize
            counts.add(self._expr((stmt.indices, stmt.value)))
        else:  # any other statement: its global regions, its expressions' global reads, nested bodies
            for f in dataclasses.fields(stmt):
                counts.add(self._operand(getattr(stmt, f.name)))
        return counts

    def _operand(self, value) -> _Counts:
        counts = _Counts()
        if isinstance(value, ir.Region):
            if _is_global(value.buffer):
                counts.bytes += math.prod(int(e) for e in value.extents) * value.buffer.dtype.itemsize
            counts.add(self._expr(value.starts))
        elif isinstance(value, ir.Seq):
            counts.add(self._stmt(value))
        elif isinstance(value, (ir.Expr, tuple, list)):
            counts.add(self._expr(value))
        return counts

    def _expr(self, expr) -> _Counts:
        """Global element reads in an expression (or a tuple / list of them)."""
        counts = _Counts()
        stack = [expr]
        while stack:
            node = stack.pop()
            if isinstance(node, (tuple, list)):
                stack.extend(node)
            elif isinstance(node, ir.Load):
                if _is_global(node.buffer):
                    counts.bytes += node.buffer.dtype.itemsize
                stack.extend(node.indices)
            elif isinstance(node, ir.Expr) and dataclasses.is_dataclass(node) and not isinstance(node, ir.Var):
                stack.extend(getattr(node, f.name) for f in dataclasses.fields(node))
        return counts

    # -- the estimate ------------------------------------------------------------------------

    def calculate(self) -> AnalysisResult:
        peak = float(getattr(self.device, "peak_tflops", 0.0) or 0.0)
        bandwidth = float(getattr(self.device, "memory_bandwidth_GBps", 0.0) or 0.0)
        mem_time = self.total_global_bytes / (bandwidth * 1e9) if bandwidth else 0.0
        compute_time = self.total_flops / (peak * 1e12) if peak else 0.0
        return AnalysisResult(total_flops=self.total_flops, total_global_bytes=self.total_global_bytes,
                              estimated_time=max(mem_time, compute_time), expected_tflops=peak,
                              expected_bandwidth_GBps=bandwidth)

    @classmethod
    def analysis(cls, fn, device=None) -> AnalysisResult:
        return cls(fn, device).ir_pass().calculate()
