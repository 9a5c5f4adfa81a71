"""release_ahead: a folded warp-specialized loop whose time step retires all its gemms before
its copies releases the ring slot it just read in that step, one step earlier than the copy
that refills it would.

Assumes
-------
`consumer_loop_folding` ran: a folded steady-state loop is ``For(t, D, n + D, trips=n,
pipelined_from=S)`` whose units but the async copies all run at stage D (`foldable`), whose
copies (all of iteration t, under ``if t < n:``) come after its other statements but the
`CommitGroup`, and which waits for iteration t - D at the top of its body.

Guarantees
----------
The IR is unchanged but for ``For.release_ahead = True`` on each such loop with D = S - 1
whose body ends its gemms with a top-level ``WaitMMA(0)`` before its copies (no gemm of the
step may still read a slot there) and reads no shared buffer after them.  The Gluon backend
(codegen/gluon/warp_specialize.py `emit_release`) then emits the consumers' release of the
copy of group t as that of group t + 1 - the slot of iteration t - D, read in this step and
retired - instead of group t's (iteration t - S = t - D - 1, retired a step before): the
same releases of the same slots, each one time step earlier, so the producer keeps S loads
ahead instead of S - 1.  Where codegen releases every group of the ring (its buffers used
before the loop) or the loop has no bound on its groups (neither persistent nor folded), it
releases as before.  Values are unchanged (a schedule of the same program); the flag is
printed with the loop, so it is part of the compile-cache key.

Why: FP8 GEMM's promoting schedules (examples/gemm_fp8.py, overlap_promotion) end each step
with ``wait(0)``; their 128x256 tiles hold 3-4 stages of 48 KB, where one slot held back is a
third or a quarter of the prefetch (bench/NOTES.md, session 21).  A loop that keeps a gemm
in flight across steps (the plain GEMM's ``wait(1)``) does not qualify.

When: ``TRITILE_RELEASE_AHEAD`` (read when the pass runs) ``1``: every qualifying loop;
``0`` and ``auto`` (the default, until measured): none.
"""
from __future__ import annotations

import dataclasses

from tritile.ir import nodes as ir
from tritile.ir.printer import expr_str
from tritile.ir.transform import Transformer, walk
from tritile.switches import schedule_switch


def mode() -> str:
    """"on", "off" or "auto" (the default: off), from TRITILE_RELEASE_AHEAD."""
    return schedule_switch("TRITILE_RELEASE_AHEAD")


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    if mode() != "on" or "warp_specialization" not in func.attrs:
        return func
    return _Marker().transform(func)


class _Marker(Transformer):
    def visit_For(self, loop):
        return dataclasses.replace(loop, release_ahead=True) if qualifies(loop) else loop


def qualifies(loop: ir.For) -> bool:
    """Whether folded steady-state `loop` may release the slot its step read at its copies."""
    if not (loop.pipelined_from > 0 and loop.foldable and loop.trips is not None
            and isinstance(loop.start, ir.Const) and loop.start.value == loop.pipelined_from - 1):
        return False
    stmts = loop.body.stmts
    at = next((i for i, s in enumerate(stmts) if any(isinstance(n, ir.AsyncCopy) for n in walk(s))), None)
    if at is None:
        return False
    this_step = expr_str(loop.var)
    copies = [n for s in stmts[at:] for n in walk(s) if isinstance(n, ir.AsyncCopy)]
    if any(expr_str(c.iteration) != this_step for c in copies):
        return False
    after = stmts[at + 1:]  # the copies' guard, then only the group's commit
    if not all(isinstance(s, ir.CommitGroup) or (isinstance(s, ir.If) and _only_copies(s)) for s in after):
        return False
    before = stmts[:at]
    last_gemm = max((i for i, s in enumerate(before) if any(isinstance(n, ir.Gemm) for n in walk(s))), default=None)
    if last_gemm is None:
        return False
    return any(isinstance(s, ir.WaitMMA) and s.pending == 0 for s in before[last_gemm + 1:])


def _only_copies(s: ir.If) -> bool:
    return s.else_body is None and all(isinstance(n, ir.AsyncCopy) for n in s.then_body.stmts)
