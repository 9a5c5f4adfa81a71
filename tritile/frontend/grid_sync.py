"""TileLang's `T.sync_grid()`: a barrier across every block of the grid, as a kernel boundary.

TileLang launches a kernel with `T.sync_grid()` cooperatively (a grid that fits the GPU at once)
and the call waits until every block reached it, their global writes before it visible after it.
tritile has no grid barrier: where the call is exactly a kernel boundary it splits the kernel
there into consecutive kernels of the same grid, threads, block variables and `T.use_swizzle`,
which the runtime launches one after another (the program becomes one of several kernels, as
with several `with T.Kernel` blocks, docs/tilelang_language.md).  The interpreter and both
backends then run it with no barrier machinery.  That is exact when

* the call is at the kernel body's own level (not inside a loop, an `if`, T.Parallel or
  `T.ws`): else a CompileError at it;
* no shared / fragment / local buffer or `T.alloc_var` is live across it - written before it
  (or allocated with an initial value read from memory) and read after it before being wholly
  overwritten (a `T.fill` / `T.clear` / `T.copy` / clearing reduce or gemm / cumsum into the
  whole buffer, or an assignment of a `T.alloc_var`, at the later kernel's own level): else a
  CompileError at the read naming the buffer; such values must go through global memory;
* every name bound before it and read after it is a `Let` (`x = <expression>` at the body's own
  level) of block indices, constants, kernel parameters and other such names: the later kernel
  recomputes it.  A name bound to a value read from memory (or an atomic's previous value) is
  a CompileError at the read.

On-chip buffers allocated before the call and used after it are allocated again (with their
initial value) at the start of the later kernel; mbarriers (`T.alloc_barrier`) are refused.
"""
from __future__ import annotations

from tritile.errors import CompileError
from tritile.ir import nodes as ir
from tritile.ir.transform import top_level, walk, written_buffer

MARKER = "sync_grid"


def sync_grid(p, a, loc):
    p.require_kernel("T.sync_grid", loc)
    if p.parallel_depth or len(p.blocks) != p.kernel_block_depth:
        raise CompileError("T.sync_grid() inside a loop, an `if`, T.Parallel or T.ws is not supported: tritile "
                           "splits the kernel at T.sync_grid() into kernels launched one after another, which "
                           "needs the call at the kernel body's own level", loc)
    p.emit(ir.Evaluate(MARKER, loc=loc))


HANDLERS = {"sync_grid": sync_grid}


def _is_marker(stmt) -> bool:
    return isinstance(stmt, ir.Evaluate) and stmt.name == MARKER


def split(kernel: ir.Kernel) -> list:
    """`kernel` split at its `T.sync_grid()` markers into consecutive kernels (itself if none)."""
    stmts = top_level(kernel.body)
    syncs = [i for i, s in enumerate(stmts) if _is_marker(s)]
    if not syncs:
        return [kernel]
    bounds = [-1, *syncs, len(stmts)]
    pieces = [stmts[bounds[k] + 1:bounds[k + 1]] for k in range(len(bounds) - 1)]
    kernels = [ir.Kernel(kernel.grid, kernel.block_vars, kernel.threads, ir.Seq(_prune(pieces[0])),
                         swizzle=kernel.swizzle, loc=kernel.loc)]
    for k in range(1, len(pieces)):
        sync = stmts[syncs[k - 1]]
        before = [s for piece in pieces[:k] for s in piece]
        after = [s for piece in pieces[k:] for s in piece]
        prelude = _prelude(before, after, pieces[k], sync.loc)
        body = ir.Seq(_prune(prelude + pieces[k]))
        kernels.append(ir.Kernel(kernel.grid, kernel.block_vars, kernel.threads, body, swizzle=kernel.swizzle,
                                 loc=sync.loc))
    # a piece that does nothing (the call first or last in the body, or two in a row) launches no kernel
    kept = [k for k in kernels if any(not isinstance(s, (ir.Alloc, ir.Let, ir.Evaluate)) for s in k.body.stmts)]
    return kept or kernels[:1]


def _prune(stmts: list) -> list:
    """`stmts` without the allocations of buffers nothing else in them names (a buffer the
    program uses only after a `T.sync_grid()`, allocated at the top of the body, is allocated
    in the later kernel only)."""
    used = [b for s in stmts if not isinstance(s, ir.Alloc) for b in _buffers(s)]
    return [s for s in stmts if not isinstance(s, ir.Alloc) or any(_storage(s.buffer) is b for b in used)]


def _storage(buf: ir.Buffer) -> ir.Buffer:
    return buf.view_of if buf.view_of is not None else buf


def _buffers(node) -> list:
    """The storages of the buffers `node` names (regions, loads, stores, allocations), in order."""
    out = []
    for n in walk(node):
        buf = getattr(n, "buffer", None)
        if isinstance(buf, ir.Buffer) and all(_storage(buf) is not b for b in out):
            out.append(_storage(buf))
    return out


def _uses(node, storage) -> bool:
    return any(isinstance(getattr(n, "buffer", None), ir.Buffer) and _storage(n.buffer) is storage
               for n in walk(node))


def _where(stmts, found) -> ir.SourceLoc:
    """The location of the innermost statement around the first node of `stmts` for which
    `found(node)` holds."""
    loc = None
    for n in walk(stmts):
        if isinstance(n, ir.Stmt) and not isinstance(n, ir.Seq) and getattr(n, "loc", None) is not None:
            loc = n.loc
        if found(n):
            return loc
    return loc


def _line(loc) -> str:
    return f"line {loc.lineno}" if loc is not None else "an unknown line"


def _full(region: ir.Region) -> bool:
    return (all(isinstance(s, ir.Const) and s.value == 0 for s in region.starts)
            and tuple(region.extents) == tuple(region.buffer.shape))


def _kills(stmt, storage) -> bool:
    """Whether `stmt` overwrites all of `storage` without reading it."""
    target = written_buffer(stmt)
    if target is None or target is not storage:
        return False
    if isinstance(stmt, ir.Store):
        return storage.scope == "var" and not _uses(stmt.value, storage)
    if isinstance(stmt, ir.Fill):
        return _full(stmt.dst) and not _uses(stmt.value, storage)
    if isinstance(stmt, (ir.Copy, ir.Cumsum, ir.CumExtremum)):
        return _full(stmt.dst) and not _uses(stmt.src, storage)
    if isinstance(stmt, ir.Reduce):
        return stmt.clear and _full(stmt.dst) and not _uses(stmt.src, storage)
    if isinstance(stmt, ir.Gemm):
        return stmt.clear_accum and _full(stmt.c) and not _uses((stmt.a, stmt.b), storage)
    return False


def _live_read(storage, after):
    """The location of the first read of `storage` in `after` before a statement overwrites all
    of it, or None (it is dead across the boundary)."""
    for stmt in after:
        if _kills(stmt, storage):
            return None
        if _uses(stmt, storage):
            return _where([stmt], lambda n: isinstance(getattr(n, "buffer", None), ir.Buffer)
                          and _storage(n.buffer) is storage) or stmt.loc
    return None


def _reads_memory(expr) -> bool:
    return any(isinstance(n, ir.Load) for n in walk(expr))


def _prelude(before: list, after: list, piece: list, sync_loc) -> list:
    """The statements the kernel of `piece` (the statements after a `T.sync_grid()` up to the
    next) starts with: the `Let`s and `Alloc`s of `before` it uses, checked as the module says."""
    lets, allocs, barriers, others = {}, {}, {}, {}  # id(Var) / storage -> its binding statement
    for stmt in before:
        if isinstance(stmt, ir.Let):
            lets[id(stmt.var)] = stmt
        elif isinstance(stmt, ir.AtomicAdd) and stmt.prev is not None:
            others[id(stmt.prev)] = stmt
        elif isinstance(stmt, ir.Alloc):
            allocs.setdefault(_storage(stmt.buffer), []).append(stmt)
        elif isinstance(stmt, ir.AllocBarrier):
            barriers[stmt.buffer] = stmt
    written = set()
    for n in walk(before):
        target = written_buffer(n)
        if target is not None and target.scope != "global":
            written.add(id(_storage(target)))

    def recomputable(let, seen=()):
        if _reads_memory(let.value):
            return False
        for v in walk(let.value):
            if isinstance(v, ir.Var) and id(v) in others:
                return False
            if isinstance(v, ir.Var) and id(v) in lets and id(v) not in seen:
                if not recomputable(lets[id(v)], (*seen, id(v))):
                    return False
        return True

    # the buffers: allocated before the boundary, live across it, used in this piece
    for storage in [b for b in _buffers(after) if b in allocs or b in barriers]:
        if storage in barriers:
            loc = _where(after, lambda n: getattr(n, "buffer", None) is storage)
            raise CompileError(f"the mbarrier {storage.name} (T.alloc_barrier at {_line(barriers[storage].loc)}) is "
                               f"used after T.sync_grid() at {_line(sync_loc)}: tritile splits the kernel there into "
                               f"kernels launched one after another, and an mbarrier does not outlive its kernel",
                               loc)
        init = allocs[storage][0].init
        initialised = init is not None and (_reads_memory(init) or any(
            isinstance(v, ir.Var) and (id(v) in others or (id(v) in lets and not recomputable(lets[id(v)])))
            for v in walk(init)))
        if id(storage) in written or initialised:
            loc = _live_read(storage, after)
            if loc is not None:
                what = "written" if id(storage) in written else "initialised from memory"
                raise CompileError(f"{storage.scope} buffer {storage.name} (allocated at "
                                   f"{_line(allocs[storage][0].loc)}) is {what} before T.sync_grid() at "
                                   f"{_line(sync_loc)} and read after it: tritile splits the kernel at "
                                   f"T.sync_grid() into kernels launched one after another, and on-chip buffers do "
                                   f"not keep their values between kernels; pass the values through global memory "
                                   f"(a T.alloc_global workspace or a tensor parameter)", loc)
    needed_buffers = [b for b in _buffers(piece) if b in allocs]
    needed_allocs = [s for s in before if isinstance(s, ir.Alloc) and _storage(s.buffer) in needed_buffers]

    # the names: Lets of before that this piece (or a re-made allocation's initial value) reads
    needed = set()

    def need(node, uses):
        for v in walk(node):
            if not isinstance(v, ir.Var) or id(v) in needed:
                continue
            if id(v) in others or (id(v) in lets and not recomputable(lets[id(v)])):
                bound = others.get(id(v)) or lets[id(v)]
                loc = _where(uses, lambda n: n is v)
                source = "an atomic's previous value" if id(v) in others else "a value read from memory"
                raise CompileError(f"{v.name!r} (bound at {_line(bound.loc)} to {source}) is read after "
                                   f"T.sync_grid() at {_line(sync_loc)}: tritile splits the kernel there into "
                                   f"kernels launched one after another and recomputes in the later kernel only "
                                   f"names bound to expressions of block indices, constants and kernel "
                                   f"parameters; pass the value through global memory", loc)
            if id(v) in lets:
                needed.add(id(v))
                need(lets[id(v)].value, uses)

    need(piece, piece)
    for alloc in needed_allocs:
        if alloc.init is not None:
            need(alloc.init, [alloc])
    needed_lets = [s for s in before if isinstance(s, ir.Let) and id(s.var) in needed]
    # a re-made allocation's initial value may read a Let bound after it: keep the original order
    return [s for s in before if any(s is t for t in needed_lets) or any(s is t for t in needed_allocs)]
