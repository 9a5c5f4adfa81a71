"""Structural checks of the tile IR, run after the frontend and after every pass.

A failure here after the frontend is a user error (reported as `CompileError` at the
statement's location); after a pass it is a compiler bug, reported the same way with the
pass named, so it never surfaces as a bare traceback.
"""
from __future__ import annotations

from tritile.errors import CompileError
from tritile.ir import nodes as ir
from tritile.ir.transform import walk


def _region_ok(region: ir.Region, loc, where: str):
    buf = region.buffer
    if len(region.starts) != buf.ndim or len(region.extents) != buf.ndim:
        raise CompileError(f"{where}: region of {buf.name} has rank {len(region.starts)}, "
                           f"buffer has rank {buf.ndim}", loc)
    for extent, dim in zip(region.extents, buf.shape):
        if not isinstance(extent, int) or extent < 1:
            raise CompileError(f"{where}: region of {buf.name} has a non-static or empty extent {extent!r}", loc)
        if buf.scope != "global" and isinstance(dim, int) and extent > dim:
            raise CompileError(f"{where}: region extent {extent} exceeds {buf.name}'s dimension {dim}", loc)


def verify(func: ir.PrimFunc, stage: str = "tile") -> ir.PrimFunc:
    for part in func.parts:
        verify(part, stage)
    if func.parts:
        return func
    where = "frontend" if stage == "tile" else f"after pass {stage!r}"
    if func.kernel is None:  # host code only: nothing a pass or backend will see
        return func
    declared = {id(b) for b in func.params}
    lets = set()
    for node in walk(func.kernel.body):
        if isinstance(node, ir.Alloc):
            declared.add(id(node.buffer))
        elif isinstance(node, ir.Let):
            lets.add(id(node.var))
    for node in walk(func.kernel.body):  # a T.make_tensor tensor is declared by its address's Let
        buf = getattr(node, "buffer", None)
        if isinstance(buf, ir.Buffer) and buf.address is not None and id(buf.address) in lets:
            declared.add(id(buf))
    for node in walk(func.kernel.body):
        loc = getattr(node, "loc", None)
        if isinstance(node, ir.Region):
            if id(node.buffer) not in declared:
                raise CompileError(f"{where}: buffer {node.buffer.name} is used but never allocated", loc)
        if isinstance(node, ir.Stmt):
            for value in vars(node).values():
                if isinstance(value, ir.Region):
                    _region_ok(value, loc, where)
        if isinstance(node, (ir.Copy, ir.AsyncCopy)):
            if _numel(node.src.tile_shape) != _numel(node.dst.tile_shape):
                raise CompileError(f"{where}: T.copy shapes differ: {list(node.src.tile_shape)} vs "
                                   f"{list(node.dst.tile_shape)}", loc)
        if isinstance(node, ir.Gemm):
            _gemm_ok(node, where)
        if isinstance(node, (ir.Load, ir.Store)):
            if len(node.indices) != node.buffer.ndim:
                raise CompileError(f"{where}: {node.buffer.name} has rank {node.buffer.ndim} but is indexed "
                                   f"with {len(node.indices)} indices", getattr(node, "loc", None))
    return func


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def gemm_mnk(g: ir.Gemm):
    """(M, N, K) of a gemm, or raise CompileError when operand shapes disagree."""
    a, b, c = g.a.tile_shape, g.b.tile_shape, g.c.tile_shape
    if len(a) != 2 or len(b) != 2 or len(c) != 2:
        raise CompileError(f"T.gemm operands must be 2-D tiles, got A{list(a)} B{list(b)} C{list(c)}", g.loc)
    m, ka = (a[1], a[0]) if g.transpose_a else (a[0], a[1])
    kb, n = (b[1], b[0]) if g.transpose_b else (b[0], b[1])
    if ka != kb or c[0] != m or c[1] != n:
        raise CompileError(
            f"T.gemm shape mismatch: A{list(a)}{' (transposed)' if g.transpose_a else ''} @ "
            f"B{list(b)}{' (transposed)' if g.transpose_b else ''} -> C{list(c)}: "
            f"need A's K ({ka}) == B's K ({kb}) and C == [{m}, {n}]", g.loc)
    return m, n, ka


def _gemm_ok(g: ir.Gemm, where: str):
    gemm_mnk(g)
    if g.c.buffer.scope not in ("fragment", "local"):
        raise CompileError(f"{where}: T.gemm accumulator {g.c.buffer.name} must be a fragment "
                           f"(T.alloc_fragment), not {g.c.buffer.scope}", g.loc)
    for name, op in (("A", g.a), ("B", g.b)):
        if op.buffer.scope == "global":
            raise CompileError(f"T.gemm operand {name} ({op.buffer.name}) must be in shared memory or a "
                               f"fragment; copy it with T.copy first", g.loc)
