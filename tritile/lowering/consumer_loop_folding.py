"""consumer_loop_folding: run a warp-specialized pipeline's epilogue (or, in any kernel, that of
a loop with a large CUDA-core gemm) as more steps of its steady-state loop, so each gemm of the loop
is emitted once.

Assumes
-------
`pipeline_injection` ran (one `Seq` per pipelined loop: prologue, steady
``For(t, D, n, pipelined_from=S)``, epilogue, drains) and, but for loops of CUDA-core gemms
(below), `warp_specialization` planned a producer (``func.attrs["warp_specialization"]``).

Guarantees
----------
Every steady-state loop pipeline injection marked `foldable` (every unit but the async
copies runs at the last stage D, so the epilogue's D time steps ``t = n .. n+D-1`` run the
body's units for valid iterations and drop only its copies) whose copies all load one
iteration i (`_foldable`) becomes, in its `Seq`::

    <prologue>                                   # unchanged
    for t in range(D, n + D):                    # trips=n
        <the steady-state body, each run of its async copies under ``if i < n:``>
    <drains>                                     # the epilogue's time steps are gone

The values are unchanged: time step t runs the same units for the same iterations as
before (a copy of iteration ``i >= n`` ran in no step before either), every step still
commits its groups (an empty group past the end, as the epilogue committed), and the
body's waits hold for the extra steps: its gemms are all stage-D units, issued in every
step, so the ones it counts as in flight are; its group waits count committed groups, one
per producer run and step, as before.  ``For.trips`` keeps n for code generation (the
producer's groups, the waits past the end, the persistent tile's slot releases).

Why only under warp specialization: the producer partition runs ahead on its own ring,
so in the consumers the skewed prologue / steady / epilogue only duplicates the loop's
consumer step (its wgmmas) D times after the loop.  ptxas serializes or spills the
wgmmas of the copies at deeper pipelines (FP8 GEMM, 5 stages: 2376 bytes of spills and
C7512; folded: none, bench/NOTES.md).  The consumers' copies become slot releases; code
generation drops those of the steps past the end (groups the producer never fills).
A loop with a static trip count of at most D has no steady-state loop and keeps its form.

Without a producer, a loop whose gemms include one on CUDA cores (`instructions.gemm_engine`
"fma": a dtype pair the tensor cores lack) of more than `LARGE_FMA_DOT` multiply-adds folds
too, its copies guarded in the loop as above (the rings take the folded form in a kernel of
one partition, codegen/gluon/rings.py): such a gemm is unrolled into M*N*K / threads
multiply-adds, and each epilogue copy repeats them in one function (FP8 seed 3330 #103, a
128x128x128 fp8 x bfloat16 gemm over 3 stages: the loop and two epilogue copies, 24576 FMAs a
thread, compiled in 55-70 s on the CPU (LLVM 41 s, ptxas 26 s) against 8 s folded).  Smaller
CUDA-core gemms and loops of tensor-core gemms keep their unrolled epilogue
there (its slot indices constants; not measured folded).

When: ``TRITILE_FOLD_CONSUMER`` (read when the pass runs) ``0`` never; ``auto`` (the
default) and ``1``: every foldable loop of a warp-specialized kernel, and every foldable loop
with a large CUDA-core gemm of any other kernel.
"""
from __future__ import annotations

import dataclasses

from tritile.ir import instructions as isel
from tritile.ir import nodes as ir
from tritile.ir.dtypes import bool_
from tritile.ir.printer import expr_str
from tritile.ir.transform import Transformer, walk
from tritile.switches import schedule_switch


def mode() -> str:
    """"on", "off" or "auto" (the default), from TRITILE_FOLD_CONSUMER."""
    return schedule_switch("TRITILE_FOLD_CONSUMER")


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    if mode() == "off" or func.kernel is None:
        return func
    if "warp_specialization" in func.attrs:
        return _EpilogueFolder(lambda loop: True).transform(func)
    num_warps = max(1, func.kernel.partition_threads // 32)
    return _EpilogueFolder(lambda loop: _has_large_cuda_core_gemm(loop, target, num_warps)).transform(func)


# M * N * K past which Triton warns that a CUDA-core dot "may have slow compile times"
LARGE_FMA_DOT = 1 << 19


def _has_large_cuda_core_gemm(loop: ir.For, target, num_warps: int) -> bool:
    """Does `loop` run a gemm on CUDA cores (unrolled into multiply-adds by Triton) of more than
    `LARGE_FMA_DOT` multiply-adds?  Smaller ones (the library's float32 64x64x32 tiles) keep the
    unrolled epilogue, whose slot indices are constants."""
    def large(g):
        m, n, k = isel.padded_mnk(g)
        return isel.gemm_engine(g, target, num_warps) == "fma" and m * n * k > LARGE_FMA_DOT

    return any(isinstance(n, ir.Gemm) and large(n) for n in walk(loop.body))


class _EpilogueFolder(Transformer):
    def __init__(self, wanted):
        super().__init__()
        self.wanted = wanted  # which foldable loops to fold

    def visit_Seq(self, seq):
        at = next((j for j, s in enumerate(seq.stmts) if _foldable(s) and self.wanted(s)), None)
        if at is None:
            return seq
        loop = seq.stmts[at]
        drains = len(seq.stmts)
        while drains > at + 1 and _is_drain(seq.stmts[drains - 1]):
            drains -= 1
        if not _is_epilogue(loop, seq.stmts[at + 1:drains]) or drains == len(seq.stmts):
            return seq  # not the loop's own Seq as pipeline_injection left it
        return dataclasses.replace(seq, stmts=seq.stmts[:at] + [_fold(loop)] + seq.stmts[drains:])


def _foldable(s) -> bool:
    """A steady-state loop pipeline injection marked foldable whose copies, at the top of its
    body, all load one iteration: a commit group of several iterations (a manual schedule's
    copies at two stages) would need an expect per copy where the kernel falls back to its
    own copies (codegen/gluon/warp_specialize.py `plan`), which only runtime trip counts get."""
    if not (isinstance(s, ir.For) and s.pipelined_from > 0 and s.foldable and s.trips is None
            and isinstance(s.start, ir.Const) and s.start.value >= 1):
        return False
    copies = [n for n in walk(s.body) if isinstance(n, ir.AsyncCopy)]
    return bool(copies) and all(any(c is x for x in s.body.stmts) for c in copies) and \
        len({expr_str(c.iteration) for c in copies}) == 1


def _is_epilogue(loop: ir.For, stmts: list) -> bool:
    """Can `stmts` be the D time steps of `loop`'s epilogue (each commits its groups)?"""
    per_step = sum(isinstance(s, ir.CommitGroup) for s in loop.body.stmts)
    commits = sum(isinstance(s, ir.CommitGroup) for s in stmts)
    return per_step >= 1 and commits == loop.start.value * per_step and \
        not any(isinstance(n, ir.For) and n.pipelined_from for s in stmts for n in walk(s))


def _is_drain(s) -> bool:
    """pipeline_injection's drains after the epilogue: ``WaitMMA(0)``, ``WaitGroup(0)``."""
    return (isinstance(s, ir.WaitMMA) and s.pending == 0) or \
        (isinstance(s, ir.WaitGroup) and s.pending == 0 and s.iteration is None)


def _fold(loop: ir.For) -> ir.For:
    """The steady-state `loop` run D more steps, its copies guarded to the n iterations."""
    D, n = loop.start.value, loop.stop
    stop = ir.Const(n.value + D, n.dtype) if isinstance(n, ir.Const) else ir.BinOp("+", n, ir.Const(D), n.dtype)
    body, run = [], []

    def close():
        if run:
            guard = ir.BinOp("<", run[0].iteration, n, bool_)
            body.append(ir.If(guard, ir.Seq(list(run)), loc=run[0].loc))
            run.clear()

    for s in loop.body.stmts:
        if isinstance(s, ir.AsyncCopy):
            run.append(s)
            continue
        close()
        body.append(s)
    close()
    return dataclasses.replace(loop, stop=stop, body=ir.Seq(body), trips=n)
