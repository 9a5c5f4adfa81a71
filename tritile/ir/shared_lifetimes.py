"""Where each shared buffer of a kernel is allocated and which top-level statements it lives
through: the one model of shared-memory reuse.  The Gluon backend allocates the buffers where
this plan says (codegen/gluon/shared_lifetimes.py), and lowering/shared_memory_budget.py
counts the bytes live at once under it.

Triton places `gl.allocate_shared_memory` values by liveness: two buffers share bytes when one's
last use comes before the other's allocation.  Allocating every `T.alloc_shared` at the top of
the kernel keeps them all live at once.  FlashAttention's epilogue tile `O_shared` and its
`Q_shared` are never live together; with 64x128 tiles at head dim 64 they took 82 KB a CTA
(two CTAs an SM), 74 KB when the epilogue reused Q's bytes (three), 375 -> 424 TFLOP/s on an
H100 (bench/results/d64_smem_whatif_h100.txt).

The plan, `lifetimes(body, keep_on_top)`, over the statements of `top_level(body)`:

* each top-level shared `Alloc` is deferred to the first later top-level statement that touches
  its buffer (a buffer no statement touches keeps its place);
* gemm operands are the exception: they are all allocated before the kernel's first statement,
  so that no two of them share bytes.  On the H100 a wgmma read wrong values from a 64-byte
  swizzled operand tile placed over the bytes of an earlier loop's 128-byte swizzled operand
  (pipeline replay program 1056: a 1-stage GEMM loop, then a 2-stage one; 94 % of the outputs
  wrong, every fence and barrier tried left it wrong, operands that did not share bytes were
  right);
* with `keep_on_top` (a warp-specialized kernel allocates its buffers before the fork, a
  persistent one above its tile loop) every buffer stays where its `Alloc` is;
* a shared `Alloc` nested in a loop or branch is allocated in the top-level statement that
  holds it.

A buffer lives from the statement it is allocated before to the last top-level statement that
touches it (a loop that uses it keeps it live for all its iterations).  The model is at the
granularity of top-level statements, as Triton's liveness is at that of its operations: the
bytes `peak` counts are what Triton needs when it packs the buffers without gaps; its own
scratch (layout conversions, reductions) and the code generator's extra buffers (TMA-store
staging tiles) come on top.
"""
from __future__ import annotations

from dataclasses import dataclass

from tritile.ir import nodes as ir
from tritile.ir.transform import top_level, touches, walk


@dataclass(frozen=True)
class Lifetime:
    buffer: ir.Buffer
    first: int  # index in top_level(body) of the statement the buffer is allocated before
    last: int  # index of the last top-level statement that touches it (first when none later does)
    deferred: bool  # allocated before `first` rather than at its own Alloc statement

    def live_at(self, index: int) -> bool:
        return self.first <= index <= self.last


def gemm_operands(body) -> set:
    """ids of the shared buffers that some `T.gemm` in `body` reads."""
    return {id(region.buffer) for g in walk(body) if isinstance(g, ir.Gemm)
            for region in (g.a, g.b) if region.buffer.scope == "shared"}


def lifetimes(body: ir.Seq, keep_on_top: bool) -> list:
    """The `Lifetime` of every shared buffer allocated in `body`, in allocation order."""
    top = top_level(body)
    operands = gemm_operands(body)
    out = []
    for at, stmt in enumerate(top):
        for alloc in walk(stmt):
            if not (isinstance(alloc, ir.Alloc) and alloc.buffer.scope == "shared"):
                continue
            buf = alloc.buffer
            uses = [i for i in range(at, len(top)) if not isinstance(top[i], ir.Alloc) and touches(top[i], buf)]
            first, deferred = at, False
            if alloc is stmt and not keep_on_top:
                if id(buf) in operands:
                    first, deferred = 0, True
                elif uses:
                    first, deferred = uses[0], True
            out.append(Lifetime(buf, first, max([first] + uses), deferred))
    return out


def peak(spans: list, size) -> tuple:
    """(the most bytes live at once, the lifetimes live then): `size(buffer)` bytes each."""
    best, live_then = 0, []
    for index in sorted({s.first for s in spans}):  # the live set only grows at an allocation
        live = [s for s in spans if s.live_at(index)]
        total = sum(size(s.buffer) for s in live)
        if total > best:
            best, live_then = total, live
    return best, live_then
