"""consumer_partitions: split a warp-specialized kernel's rows across its consumer
warpgroups, one partition each (sm_90; FlashAttention-3's layout of the work).

Assumes
-------
`warp_specialization` planned a producer (``func.attrs["warp_specialization"]``): every async
copy is issued once, by the producer, for every consumer.

Guarantees
----------
When the kernel qualifies (below) its body becomes::

    <the shared Allocs>                      # common to every partition
    for part in T.consumer_partitions(count):
        <the rest of the body, rewritten>

with ``count = threads // 128`` (one warpgroup per partition), ``R`` the rows of the gemms'
accumulators and ``rows = R // count``:

* every fragment ``[R, ...]`` is a private ``[rows, ...]`` fragment of each partition;
* every *row buffer* - a shared buffer that is a gemm's A operand or the other side of a
  fragment copy - ``[R, ...]`` becomes ``[count, rows, ...]`` (one version per partition),
  and partition ``part`` uses version ``part``;
* a tile copy between global memory and a fragment or row buffer moves the global side's
  first non-unit dimension to the partition's rows (``+ part * rows``, extent ``rows``);
* a ``T.Parallel`` over the R rows runs over ``rows``: fragment and row-buffer accesses take
  the local row, every other use of the row variable the kernel row ``local + part * rows``.

Values are unchanged: each output row is computed by exactly one partition, from its own
rows of the row buffers and from the other shared buffers, which only the producer's copies
write (the same data for every partition).  Each partition is a separate warpgroup with its
own barriers, so one partition's softmax overlaps the other's wgmma instead of running in
lock-step with it.

A kernel qualifies when
* a producer is planned, the kernel has ``count >= 2`` warpgroups and R is a multiple of
  ``64 * count`` (each partition keeps a whole m64 wgmma);
* every gemm accumulates into a whole fragment of R rows, reads A untransposed from a whole
  fragment or the whole rows of a row buffer, and B from a shared buffer no partition writes;
* every fragment has R rows and is used whole by tile ops (reductions and scans not along
  the rows);
* row buffers are unversioned, written by no async copy, and used whole along the rows;
  every other shared buffer is written only by async copies;
* a ``T.Parallel`` touching a fragment or row buffer iterates the R rows with its first
  variable and indexes them with exactly that variable;
* nothing else writes memory outside ``T.Parallel`` (no element stores, atomics) and every
  shared Alloc is at the kernel's top level.
Otherwise the function is returned unchanged but for ``func.attrs["consumer_partitions"]`` =
"not split: <why>", printed with the IR (its consumer warps then run together).
A gemm's A operand may also be a shared buffer only the producer's async copies write (a
GEMM's A tile, versioned by its pipeline): it stays one buffer, and each partition's gemm
reads its own ``rows`` of it in place (``part * rows``); B is read whole by every partition.
By default (``auto``) such a kernel is split only when a pipelined loop also computes on
registers (`_overlappable`, FP8 GEMM's promotion every n k-steps): there the two warpgroups,
no longer in lock-step (each partition's slot release is its own 128-thread barrier and
arrival), promote while the other's wgmmas run.
When: with warp specialization, unless ``TRITILE_CONSUMER_PARTITIONS=0``; ``=1`` also splits
the kernels ``auto`` leaves together (a plain GEMM with a producer-loaded A).
"""
from __future__ import annotations

import dataclasses

from tritile.ir import nodes as ir
from tritile.ir.transform import Transformer, substitute_buffers, substitute_vars, top_level, walk
from tritile.switches import schedule_switch

WARPGROUP_THREADS = 128
WGMMA_ROWS = 64  # one wgmma's M per warpgroup


def several_warpgroups(kernel: ir.Kernel) -> bool:
    """Whether a CTA of `kernel` has two or more warpgroups: registers, not the number of CTAs
    per SM, bound such a CTA, and its warpgroups can cover each other's waits."""
    return kernel.threads >= 2 * WARPGROUP_THREADS


def enabled() -> bool:
    return _switch() != "off"


def _switch() -> str:
    return schedule_switch("TRITILE_CONSUMER_PARTITIONS")


class _NotSplit(Exception):
    """The kernel does not qualify; the message says why (``func.attrs["consumer_partitions"]``)."""


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    if not enabled() or "warp_specialization" not in func.attrs:
        return func
    try:
        plan = _plan(func)
    except _NotSplit as why:  # recorded, and printed with the IR: why the consumers stay together
        return dataclasses.replace(func, attrs={**func.attrs, "consumer_partitions": f"not split: {why}"})
    return _split(func, *plan)


def qualifies(func: ir.PrimFunc) -> bool:
    """Will `run` split `func` (which carries a warp-specialization plan)?"""
    return _plan_if_split(func) is not None


def _plan_if_split(func: ir.PrimFunc):
    if not enabled() or "warp_specialization" not in func.attrs:
        return None
    try:
        return _plan(func)
    except _NotSplit:
        return None


# --------------------------------------------------------------------------------------
# qualification
# --------------------------------------------------------------------------------------


def _plan(func: ir.PrimFunc):
    """(count, R, fragments, row_buffers) when the kernel qualifies; raises _NotSplit."""
    kernel = func.kernel
    count = kernel.threads // WARPGROUP_THREADS
    if count < 2 or kernel.threads % WARPGROUP_THREADS:
        raise _NotSplit("fewer than two warpgroups")
    body_nodes = list(walk(kernel.body))
    gemms = [n for n in body_nodes if isinstance(n, ir.Gemm)]
    if not gemms or any(g.c.buffer.scope != "fragment" for g in gemms):
        raise _NotSplit("no gemm into a fragment")
    rows = {g.c.buffer.shape[0] for g in gemms}
    if len(rows) != 1:
        raise _NotSplit("gemms of different row counts")
    R = rows.pop()
    if not isinstance(R, int) or R % (WGMMA_ROWS * count):
        raise _NotSplit(f"{R} rows do not split into {count} whole wgmmas")

    allocs = [n for n in body_nodes if isinstance(n, ir.Alloc)]
    fragments = {n.buffer for n in allocs if n.buffer.scope == "fragment"}
    if any(b.shape[0] != R for b in fragments):
        raise _NotSplit("a fragment not of the gemms' rows")
    top_allocs = {id(s) for s in top_level(kernel.body) if isinstance(s, ir.Alloc)}
    if any(n.buffer.scope == "shared" and id(n) not in top_allocs for n in allocs):
        raise _NotSplit("a shared buffer allocated inside control flow")

    row_buffers = set()
    for n in body_nodes:
        if isinstance(n, ir.Copy) and {n.src.buffer.scope, n.dst.buffer.scope} == {"fragment", "shared"}:
            row_buffers.add(n.dst.buffer if n.dst.buffer.scope == "shared" else n.src.buffer)
    loaded = {g.a.buffer for g in gemms if g.a.buffer.scope == "shared" and g.a.buffer not in row_buffers
              and _loaded_by_producer(g.a.buffer, body_nodes)}
    if loaded and _switch() == "auto" and not _overlappable(kernel.body):
        raise _NotSplit("nothing in the loops for one partition's wgmmas to cover")
    row_buffers |= {g.a.buffer for g in gemms if g.a.buffer.scope == "shared"} - loaded
    for b in row_buffers:
        if b.num_versions != 1 or b.shape[0] != R:
            raise _NotSplit(f"row buffer {b.name} is versioned or not of R rows")

    split = fragments | row_buffers
    for n in body_nodes:
        _check_node(n, R, split, row_buffers)
    return count, R, fragments, row_buffers


def _overlappable(body) -> bool:
    """Whether a software-pipelined loop computes on registers besides its gemms (a
    T.Parallel: FP8 GEMM's promotion): work the other partitions' wgmmas run under once the
    warpgroups stop running in lock-step.  A plain GEMM loop has none, and keeps its warpgroups
    together (its 128x256 tile measured at cuBLAS's speed that way)."""
    return any(isinstance(loop, ir.For) and loop.pipelined_from and any(isinstance(n, ir.Parallel) for n in walk(loop))
               for loop in walk(body))


def _loaded_by_producer(buf: ir.Buffer, body_nodes: list) -> bool:
    """Whether only async copies (the producer's) write shared buffer `buf`: a gemm operand
    every partition can read its own rows of, in place."""
    writers = [n for n in body_nodes if (isinstance(n, (ir.Copy, ir.AsyncCopy, ir.Fill)) and n.dst.buffer is buf)
               or (isinstance(n, ir.Store) and n.buffer is buf)]
    return bool(writers) and all(isinstance(n, ir.AsyncCopy) for n in writers)


def _whole_rows(region: ir.Region, R: int) -> bool:
    start = region.starts[0]
    return region.extents[0] == R and isinstance(start, ir.Const) and start.value == 0


def _whole(region: ir.Region) -> bool:
    return (tuple(region.extents) == tuple(region.buffer.shape)
            and all(isinstance(s, ir.Const) and s.value == 0 for s in region.starts))


def _row_dim(region: ir.Region, R: int) -> int:
    """The global side of a row copy: its first non-unit dimension, which must hold R rows."""
    dims = [k for k, e in enumerate(region.extents) if e != 1]
    if not dims or region.extents[dims[0]] != R:
        raise _NotSplit(f"a copy of {region.buffer.name} whose first non-unit extent is not {R}")
    return dims[0]


def _row_start(region: ir.Region, R: int):
    """The static start of a region's R rows (its first non-unit dimension), or None."""
    start = region.starts[_row_dim(region, R)]
    return start.value if isinstance(start, ir.Const) else None


def _check_node(n, R: int, split: set, row_buffers: set):  # noqa: C901 - one case per node kind
    if isinstance(n, ir.Gemm):
        if n.transpose_a or not _whole(n.c) or n.b.buffer in split or n.b.buffer.scope != "shared":
            raise _NotSplit("a gemm the partitions cannot share")
        if n.a.buffer.scope == "shared" and n.a.buffer not in split:  # loaded by the producer
            if _row_start(n.a, R) != 0:
                raise _NotSplit("a gemm reading part of its A rows")
        elif (n.a.buffer.scope == "fragment" and not _whole(n.a)) or not _whole_rows(n.a, R):
            raise _NotSplit("a gemm reading part of its A rows")
    elif isinstance(n, ir.Copy):
        sides = [r for r in (n.src, n.dst) if r.buffer in split]
        if not sides:
            if n.dst.buffer.scope in ("shared", "global"):
                raise _NotSplit("a copy every partition would repeat")
            return
        for r in sides:
            if not _whole_rows(r, R) or (r.buffer.scope == "fragment" and not _whole(r)):
                raise _NotSplit(f"a copy of part of {r.buffer.name}'s rows")
        other = [r for r in (n.src, n.dst) if r.buffer not in split]
        if other:
            if other[0].buffer.scope != "global":
                raise _NotSplit("a copy between a row buffer and another shared buffer")
            _row_dim(other[0], R)
    elif isinstance(n, ir.AsyncCopy):
        if n.dst.buffer in split:
            raise _NotSplit("an async copy into a row buffer")
    elif isinstance(n, ir.Fill):
        if n.dst.buffer not in split or not _whole_rows(n.dst, R):
            raise _NotSplit("a fill every partition would repeat")
    elif isinstance(n, (ir.Reduce, ir.Cumsum)):
        if n.src.buffer.scope != "fragment" or n.dst.buffer.scope != "fragment":
            raise _NotSplit("a reduction outside fragments")
        if n.dim == 0 or not (_whole(n.src) and _whole(n.dst)):
            raise _NotSplit("a reduction along the rows")
    elif isinstance(n, ir.AtomicAdd):
        raise _NotSplit("an atomic")
    elif isinstance(n, ir.Parallel):
        _check_parallel(n, R, split)
    elif isinstance(n, ir.ConsumerPartitions):
        raise _NotSplit("already split")


def _check_parallel(p: ir.Parallel, R: int, split: set):
    accesses = [n for n in walk(p.body) if isinstance(n, (ir.Load, ir.Store))]
    touched = [a for a in accesses if a.buffer in split]
    writes_memory = any(isinstance(a, ir.Store) and a.buffer.scope in ("shared", "global") for a in accesses)
    if not touched and not writes_memory:
        return  # registers and locals only: every partition runs it alike
    row = p.vars[0]
    if p.extents[0] != R or not touched:
        raise _NotSplit("a T.Parallel not over the rows")
    for a in accesses:
        if a.buffer in split:
            if a.indices[0] is not row or any(_uses(i, row) for i in a.indices[1:]):
                raise _NotSplit(f"{a.buffer.name} indexed other than by the row variable")
        elif isinstance(a, ir.Store) and a.buffer.scope == "shared":
            raise _NotSplit("a T.Parallel writing a shared buffer every partition reads")


def _uses(e, var: ir.Var) -> bool:
    return isinstance(e, ir.Expr) and any(n is var for n in walk(e))


# --------------------------------------------------------------------------------------
# the rewrite
# --------------------------------------------------------------------------------------


def _split(func: ir.PrimFunc, count: int, R: int, fragments: set, row_buffers: set) -> ir.PrimFunc:
    rows = R // count
    part = ir.Var("part")
    offset = ir.BinOp("*", part, ir.Const(rows))
    split = fragments | row_buffers

    def region(r: ir.Region) -> ir.Region:
        if r.buffer in row_buffers:
            return ir.Region(r.buffer, (part, ir.Const(0)) + tuple(r.starts[1:]), (1, rows) + tuple(r.extents[1:]))
        if r.buffer in fragments:
            return dataclasses.replace(r, extents=(rows,) + tuple(r.extents[1:]))
        return r

    def global_rows(r: ir.Region) -> ir.Region:
        k = _row_dim(r, R)
        starts, extents = list(r.starts), list(r.extents)
        starts[k], extents[k] = ir.BinOp("+", starts[k], offset), rows
        return ir.Region(r.buffer, tuple(starts), tuple(extents))

    class Rewrite(Transformer):
        def visit_Copy(self, s):
            if s.src.buffer not in split and s.dst.buffer not in split:
                return s
            src, dst = (global_rows(r) if r.buffer.scope == "global" else region(r) for r in (s.src, s.dst))
            return dataclasses.replace(s, src=src, dst=dst)

        def visit_Gemm(self, s):
            if s.a.buffer.scope == "shared" and s.a.buffer not in split:  # the partition's rows, in place
                k = _row_dim(s.a, R)
                starts, extents = list(s.a.starts), list(s.a.extents)
                starts[k], extents[k] = offset, rows
                return dataclasses.replace(s, a=ir.Region(s.a.buffer, tuple(starts), tuple(extents)), c=region(s.c))
            return dataclasses.replace(s, a=region(s.a), c=region(s.c))

        def visit_Fill(self, s):
            return dataclasses.replace(s, dst=region(s.dst))

        def visit_Reduce(self, s):
            return dataclasses.replace(s, src=region(s.src), dst=region(s.dst))

        visit_Cumsum = visit_Reduce

        def visit_Parallel(self, s):
            if not any(isinstance(n, (ir.Load, ir.Store)) and n.buffer in split for n in walk(s.body)):
                return s
            row = s.vars[0]
            local = ir.Var(row.name, row.dtype)

            class LocalRow(Transformer):
                def _index(self, n):
                    if n.buffer not in split:
                        return n
                    lead = (part,) if n.buffer in row_buffers else ()
                    return dataclasses.replace(n, indices=lead + (local,) + tuple(n.indices[1:]))

                visit_Load = visit_Store = _index

            body = substitute_vars(LocalRow().transform(s.body), {row: ir.BinOp("+", local, offset)})
            return dataclasses.replace(s, vars=(local,) + tuple(s.vars[1:]), extents=(rows,) + tuple(s.extents[1:]),
                                       body=body)

    mapping = {b: dataclasses.replace(b, shape=(rows,) + tuple(b.shape[1:]), origin=b) for b in fragments}
    mapping.update({b: dataclasses.replace(b, shape=(count, rows) + tuple(b.shape[1:]), num_versions=count, origin=b)
                    for b in row_buffers})
    body = substitute_buffers(Rewrite().transform(func.kernel.body), mapping)
    shared = [s for s in top_level(body) if isinstance(s, ir.Alloc) and s.buffer.scope == "shared"]
    partitions = ir.ConsumerPartitions(part, count, _without(body, {id(s) for s in shared}), loc=func.kernel.loc)
    kernel = dataclasses.replace(func.kernel, body=ir.Seq(shared + [partitions]))
    return dataclasses.replace(func, kernel=kernel)


def _without(seq: ir.Seq, removed: set) -> ir.Seq:
    """`seq` without the statements whose ids are in `removed` (searched through nested Seqs,
    whose structure - a software pipeline's prologue, loop and epilogue - is kept)."""
    stmts = [(_without(s, removed) if isinstance(s, ir.Seq) else s) for s in seq.stmts if id(s) not in removed]
    return dataclasses.replace(seq, stmts=stmts)
