"""Hand-built tile IR for the pipeline pass tests: blocked GEMMs whose K dimension is split
over one or more sibling `T.Pipelined` loops sharing `A_shared` / `B_shared`.

`gemm_program(loops, ...)` returns a `Program`: the frontend-level `PrimFunc`, a factory of
fresh random arguments and the torch reference of the outputs.  Every knob the property test
draws (stage counts, trip counts - static or runtime-dynamic -, block-sparse guards, an outer
serial loop, a read of `A_shared` after the loops, a shared buffer used only outside the
pipelines) maps to one argument here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from tritile.ir import nodes as ir
from tritile.ir.dtypes import bool_, float16, float32, int32

LOC = ir.SourceLoc("pipeline_programs.py", 1, 0, "for k in T.Pipelined(...)")


@dataclass
class LoopSpec:
    num_stages: int
    trips: int
    guarded: bool = False  # body is `if mask[k] != 0: copy; copy; gemm`
    dynamic: bool = False  # trip count is a runtime `T.dynamic` value
    order: Optional[list] = None
    stage: Optional[list] = None
    bind_offset: bool = False  # `kk = k * BK` as a replayed scalar Let


@dataclass
class Program:
    func: ir.PrimFunc
    loops: list
    dims: dict = field(default_factory=dict)  # {Var: int} for execute()
    grid: tuple = (1, 1)
    tiles: tuple = (16, 16, 16)
    outer: int = 1
    read_after: bool = False
    staged_store: bool = False

    def __repr__(self) -> str:  # what a failing hypothesis example prints
        return (f"gemm_program({self.loops!r}, tiles={self.tiles}, grid={self.grid}, outer={self.outer}, "
                f"read_after={self.read_after}, staged_store={self.staged_store})")

    def make_args(self, seed: int):
        gen = torch.Generator().manual_seed(seed)
        bm, bn, bk = self.tiles
        gx, gy = self.grid
        m, n = gy * bm, gx * bn
        k = max(1, sum(spec.trips for spec in self.loops)) * bk
        a = torch.randn(m, k, generator=gen).to(torch.float16)
        b = torch.randn(k, n, generator=gen).to(torch.float16)
        mask = (torch.rand(max(1, sum(spec.trips for spec in self.loops)), generator=gen) < 0.6).to(torch.int32)
        c = torch.randn(m, n, generator=gen)  # overwritten by the kernel
        d = torch.randn(m, gx * bk, generator=gen)
        return [a, b, mask, c, d]

    def reference(self, args):
        a, b, mask, _, _ = args
        bm, bn, bk = self.tiles
        gx, gy = self.grid
        c = torch.zeros(gy * bm, gx * bn)
        last_tile = None  # global k-tile index of the last executed iteration
        base = 0
        for spec in self.loops:
            for kt in range(spec.trips):
                if spec.guarded and mask[base + kt] == 0:
                    continue
                cols = slice((base + kt) * bk, (base + kt + 1) * bk)
                c += a[:, cols].float() @ b[cols, :].float()
                last_tile = base + kt
            base += spec.trips
        c *= self.outer
        d = torch.zeros(gy * bm, gx * bk)
        if last_tile is not None:
            tile = a[:, last_tile * bk:(last_tile + 1) * bk].float()
            d = tile.repeat(1, gx)
        return c, d


def _region(buf, starts, extents):
    return ir.Region(buf, tuple(s if isinstance(s, ir.Expr) else ir.Const(s) for s in starts), tuple(extents))


def _add(a, b):
    return ir.BinOp("+", a, b if isinstance(b, ir.Expr) else ir.Const(b))


def _mul(a, b):
    return ir.BinOp("*", a, b if isinstance(b, ir.Expr) else ir.Const(b))


def gemm_program(loops, tiles=(16, 16, 16), grid=(1, 1), outer: int = 1, read_after: bool = False,
                 staged_store: bool = False) -> Program:
    """C = A @ B over the K tiles of `loops` (masked where guarded), times `outer`; with
    `read_after`, D[block] = the A tile of the last executed iteration (0 when none ran);
    with `staged_store`, C goes through a shared buffer used only outside the pipelines."""
    bm, bn, bk = tiles
    gx, gy = grid
    total = max(1, sum(spec.trips for spec in loops))
    A = ir.Buffer("A", (gy * bm, total * bk), float16, "global")
    B = ir.Buffer("B", (total * bk, gx * bn), float16, "global")
    mask = ir.Buffer("mask", (total,), int32, "global")
    C = ir.Buffer("C", (gy * bm, gx * bn), float32, "global")
    D = ir.Buffer("D", (gy * bm, gx * bk), float32, "global")
    bx, by = ir.Var("bx"), ir.Var("by")
    A_s = ir.Buffer("A_shared", (bm, bk), float16, "shared")
    B_s = ir.Buffer("B_shared", (bk, bn), float16, "shared")
    C_l = ir.Buffer("C_local", (bm, bn), float32, "fragment")
    body = [ir.Alloc(A_s), ir.Alloc(B_s), ir.Alloc(C_l), ir.Fill(ir.Region.full(C_l), ir.Const(0.0, float32))]
    if read_after:
        body.append(ir.Fill(ir.Region.full(A_s), ir.Const(0.0, float16)))
    dims, inner, base = {}, [], 0
    for idx, spec in enumerate(loops):
        k = ir.Var(f"k{idx}")
        stop = ir.Const(spec.trips)
        if spec.dynamic:
            stop = ir.Var(f"n{idx}")
            dims[stop] = spec.trips
        kt = _add(k, base)
        stmts = []
        if spec.bind_offset:
            kk = ir.Var(f"kk{idx}")
            stmts.append(ir.Let(kk, _mul(kt, bk)))
            col = kk
        else:
            col = _mul(kt, bk)
        stmts += [
            ir.Copy(_region(A, (_mul(by, bm), col), (bm, bk)), ir.Region.full(A_s), loc=LOC),
            ir.Copy(_region(B, (col, _mul(bx, bn)), (bk, bn)), ir.Region.full(B_s), loc=LOC),
            ir.Gemm(ir.Region.full(A_s), ir.Region.full(B_s), ir.Region.full(C_l), loc=LOC),
        ]
        if spec.guarded:
            cond = ir.BinOp("!=", ir.Load(mask, (kt,), int32), ir.Const(0), bool_)
            stmts = [ir.If(cond, ir.Seq(stmts), loc=LOC)]
        inner.append(ir.For(k, ir.Const(0), stop, ir.Seq(stmts), kind="pipelined", num_stages=spec.num_stages,
                            order=spec.order, stage=spec.stage, loc=LOC))
        base += spec.trips
    if outer > 1:
        body.append(ir.For(ir.Var("r"), ir.Const(0), ir.Const(outer), ir.Seq(inner), loc=LOC))
    else:
        body += inner
    if staged_store:
        S_s = ir.Buffer("C_shared", (bm, bn), float32, "shared")
        body += [ir.Alloc(S_s), ir.Copy(ir.Region.full(C_l), ir.Region.full(S_s)),
                 ir.Copy(ir.Region.full(S_s), _region(C, (_mul(by, bm), _mul(bx, bn)), (bm, bn)))]
    else:
        body.append(ir.Copy(ir.Region.full(C_l), _region(C, (_mul(by, bm), _mul(bx, bn)), (bm, bn))))
    if read_after:
        body.append(ir.Copy(ir.Region.full(A_s), _region(D, (_mul(by, bm), _mul(bx, bk)), (bm, bk))))
    kernel = ir.Kernel((ir.Const(gx), ir.Const(gy)), (bx, by), 128, ir.Seq(body))
    # runtime trip counts are the kernel's dynamic scalars (launch arguments on CUDA)
    func = ir.PrimFunc("pipelined_gemm", [A, B, mask, C, D], kernel, out_idx=[3, 4], loc=LOC,
                       dynamic_vars=list(dims))
    return Program(func, list(loops), dims, grid, tiles, outer, read_after, staged_store)
