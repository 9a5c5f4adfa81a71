"""TileLang's hand-split thread ranges: `tx = T.get_thread_binding()` in a kernel of many threads,
read only in `if` conditions (`if tx < 128:` / `elif 128 <= tx < 256:` / `else:`,
examples/deepseek_mhc/example_mhc_pre.py, deepseek_mla/example_mla_decode_ws.py).

This is the parse of a kernel body that reads the thread index only in such conditions; one that
uses it as a value (an index, arithmetic stored somewhere) is per-thread code, rewritten into
tile statements by frontend/per_thread.py (`per_thread.detect` decides).  Here tritile's
statements act on whole tiles.  A branch taken by a
compile-time set of threads runs as a tile program of its own: a branch of whole warp groups (128
threads each) is an `ir.WarpGroups` section, as `with T.ws(...)` (its barrier protocol is checked
and serialized by lowering/warp_group_serialization.py); a branch of other threads (the first 32
of 96) runs in program order, which is correct as no barrier may order it against the other
threads' branch (a barrier operation there is a CompileError); a branch of every running thread
is spliced in; one of none is dropped.  `tx` is a `ThreadExpr` (integer arithmetic with
compile-time ints: `tx // 32`, `tx % 128`); comparing it with compile-time ints gives a
`ThreadSet` (`and` / `or` / `not` combine them); any other use (an index, a runtime value, a
store) is a CompileError at the user's line.  In a kernel of one thread `T.get_thread_binding()` is
0 and `T.tvm_warp_shuffle` gives the thread's own value (`require_one_thread`, also the rule of
the Philox builtins in random.py)."""
from __future__ import annotations

import operator

from tritile.errors import CompileError
from tritile.frontend import per_thread
from tritile.ir import nodes as ir
from tritile.ir.transform import walk

_MISUSE = ("T.get_thread_binding(): this kernel body reads the thread index only in `if` conditions, so tritile "
           "parses them as branches of compile-time thread ranges (`if tx < 128:`, whole warp groups as T.ws "
           "sections), and this use is not a comparison with a compile-time integer; a kernel body that uses the "
           "index as a value (an index, arithmetic stored somewhere) is parsed as per-thread code instead "
           "(frontend/per_thread.py): name it there (`tx = T.get_thread_binding()`), not only in a macro")


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class ThreadExpr:
    """An integer function of the thread index, known for each of the kernel's `threads`."""

    def __init__(self, threads: int, values: tuple):
        self.threads = threads
        self.values = values  # value at each thread index

    @classmethod
    def index(cls, threads: int) -> "ThreadExpr":
        return cls(threads, tuple(range(threads)))

    def _map(self, other, fn):
        if isinstance(other, ThreadExpr):
            return ThreadExpr(self.threads, tuple(fn(a, b) for a, b in zip(self.values, other.values)))
        if not _int(other):
            raise TypeError(_MISUSE)
        return ThreadExpr(self.threads, tuple(fn(a, other) for a in self.values))

    def _compare(self, other, fn):
        if isinstance(other, ThreadExpr):
            return ThreadSet(self.threads, frozenset(t for t, (a, b) in enumerate(zip(self.values, other.values))
                                                     if fn(a, b)))
        if not _int(other):
            raise TypeError(_MISUSE)
        return ThreadSet(self.threads, frozenset(t for t, a in enumerate(self.values) if fn(a, other)))

    def __add__(self, o): return self._map(o, operator.add)
    def __radd__(self, o): return self._map(o, lambda a, b: b + a)
    def __sub__(self, o): return self._map(o, operator.sub)
    def __rsub__(self, o): return self._map(o, lambda a, b: b - a)
    def __mul__(self, o): return self._map(o, operator.mul)
    def __rmul__(self, o): return self._map(o, lambda a, b: b * a)
    def __floordiv__(self, o): return self._map(o, operator.floordiv)
    def __mod__(self, o): return self._map(o, operator.mod)
    def __and__(self, o): return self._map(o, operator.and_)
    def __rshift__(self, o): return self._map(o, operator.rshift)
    def __lshift__(self, o): return self._map(o, operator.lshift)
    def __lt__(self, o): return self._compare(o, operator.lt)
    def __le__(self, o): return self._compare(o, operator.le)
    def __gt__(self, o): return self._compare(o, operator.gt)
    def __ge__(self, o): return self._compare(o, operator.ge)
    def __eq__(self, o): return self._compare(o, operator.eq)
    def __ne__(self, o): return self._compare(o, operator.ne)
    __hash__ = None

    def __bool__(self):
        raise TypeError(_MISUSE)

    def __repr__(self):
        return "T.get_thread_binding()" if self.values == tuple(range(self.threads)) else "a thread-index expression"


class ThreadSet:
    """The threads for which a comparison of the thread index holds."""

    def __init__(self, threads: int, members: frozenset):
        self.threads = threads
        self.members = members

    def combine(self, op: str, other) -> "ThreadSet":
        if isinstance(other, bool):
            other = ThreadSet(self.threads, frozenset(range(self.threads)) if other else frozenset())
        if not isinstance(other, ThreadSet):
            raise TypeError("a condition on T.get_thread_binding() can be combined only with another one or with "
                            "a compile-time bool, not with runtime values")
        return ThreadSet(self.threads, self.members & other.members if op == "and" else self.members | other.members)

    def invert(self) -> "ThreadSet":
        return ThreadSet(self.threads, frozenset(range(self.threads)) - self.members)

    def __bool__(self):
        raise TypeError("a condition on T.get_thread_binding() may only be an `if` statement's condition")

    def __repr__(self):
        return f"threads {describe(self.members)}"


def describe(members) -> str:
    """`[0, 32)`, `[0, 32) + [64, 96)` or `{}`."""
    runs, start, prev = [], None, None
    for t in sorted(members):
        if start is None:
            start = prev = t
        elif t == prev + 1:
            prev = t
        else:
            runs.append((start, prev + 1))
            start = prev = t
    if start is not None:
        runs.append((start, prev + 1))
    return " + ".join(f"[{a}, {b})" for a, b in runs) or "{}"


def warp_groups_of(members: frozenset):
    """The warp groups `members` consists of, or None when it is not whole warp groups."""
    size = ir.WARP_GROUP_THREADS
    groups = sorted({t // size for t in members})
    if len(members) != size * len(groups):
        return None
    return tuple(groups)


_BARRIERS = (ir.AllocBarrier, ir.BarrierArrive, ir.BarrierWait, ir.WarpGroups)


def emit_branches(p, cond: ThreadSet, node, loc) -> None:
    """`if cond: body else: orelse` where `cond` is a ThreadSet: each branch a tile program of its
    threads (the enclosing branch's threads only)."""
    if p.parallel_depth:
        raise CompileError("an `if` on T.get_thread_binding() inside T.Parallel is not supported", loc)
    running = p.thread_set if p.thread_set is not None else frozenset(range(cond.threads))
    p._promote_assigned(node.body + node.orelse, loc)
    for body, members in ((node.body, cond.members & running), (node.orelse, running - cond.members)):
        if not body or not members:
            continue
        saved, p.thread_set = p.thread_set, members
        try:
            block = p._scoped_block(body)
        finally:
            p.thread_set = saved
        if members == running:
            for s in block.stmts:
                p.emit(s)
            continue
        groups = warp_groups_of(members)
        if groups is not None:  # a nested branch's section stays its own (`elif 128 <= tx < 256:`)
            run = []
            for s in [*block.stmts, None]:
                if s is None or isinstance(s, ir.WarpGroups):
                    if run:
                        p.emit(ir.WarpGroups(groups, ir.Seq(run), loc=loc))
                    run = []
                    if s is not None:
                        p.emit(s)
                else:
                    run.append(s)
            continue
        for s in block.stmts:
            for n in walk(s):
                if isinstance(n, _BARRIERS):
                    raise CompileError(f"the branch of threads {describe(members)} is not whole warp groups of "
                                       f"{ir.WARP_GROUP_THREADS} threads: a barrier "
                                       f"operation or T.ws inside it is not supported", getattr(n, "loc", None) or loc)
        for s in block.stmts:
            p.emit(s)


_SIMT_THREADS = ("its statements act on whole tiles, so TileLang's per-thread indexing and warp shuffles are "
                 "modelled only with threads=1 (the one thread is thread 0, lane 0 of its warp)")


def require_one_thread(p, what, loc, why=_SIMT_THREADS):
    """A CompileError at `loc` unless the kernel has exactly one thread (`why`: what needs it)."""
    if p.kernel_threads != 1:
        raise CompileError(f"{what} in a kernel of threads={p.kernel_threads}: tritile has no per-thread code; "
                           f"{why}", loc)


def get_thread_binding(p, a, loc):
    """TileLang's `T.get_thread_binding(dim)`: a `ThreadExpr` for `if tx < 128:` branches in a kernel
    of many threads, 0 in a kernel of one thread."""
    p.require_kernel("T.get_thread_binding", loc)
    dim = a.get("dim", 0)
    dim = dim.value if isinstance(dim, ir.Const) else dim
    if getattr(p, "per_thread", None) is not None:  # per-thread code (frontend/per_thread.py)
        if not isinstance(dim, int) or isinstance(dim, bool) or not 0 <= dim <= 2:
            raise CompileError(f"T.get_thread_binding(dim): dim must be 0, 1 or 2, got {dim!r}", loc)
        return p.per_thread.var(dim, p.name_hint)
    if p.kernel_threads != 1 and dim == 0 and isinstance(p.kernel_threads, int):
        return ThreadExpr.index(p.kernel_threads)
    require_one_thread(p, "T.get_thread_binding()", loc)
    return ir.Const(0)


def thread_binding(p, a, loc):
    """TVM's launch-thread form `tx = T.thread_binding(0, n, thread="threadIdx.x")`: the thread index
    of that dimension, as `T.get_thread_binding(dim)`; it must span the kernel's whole dimension."""
    dims = {"threadIdx.x": 0, "threadIdx.y": 1, "threadIdx.z": 2}
    thread, begin, end = a["thread"], a["begin"], a["end"]
    begin, end = (v.value if isinstance(v, ir.Const) else v for v in (begin, end))
    if thread not in dims:
        raise CompileError(f"T.thread_binding(thread={thread!r}): tritile binds only threadIdx.x / y / z", loc)
    threads = per_thread.thread_dims(p.kernel_threads)
    extent = threads[dims[thread]] if dims[thread] < len(threads) else 1
    if begin != 0 or end != extent:
        raise CompileError(f"T.thread_binding({begin}, {end}, thread={thread!r}) in a kernel of threads="
                           f"{p.kernel_threads}: it must span the dimension (0 to {extent})", loc)
    return get_thread_binding(p, {"dim": dims[thread]}, loc)


def tvm_warp_shuffle(p, a, loc):
    """TVM's `T.tvm_warp_shuffle(mask, value, lane, width, warp_size)` (`__shfl_sync`): `value` as held
    by lane `lane % width` of the caller's group.  In a kernel of one thread that thread is its
    warp's only lane, so the result is its own `value` (CUDA leaves a read of an absent lane
    undefined; tritile gives the own value there too)."""
    p.require_kernel("T.tvm_warp_shuffle", loc)
    if getattr(p, "per_thread", None) is not None:
        raise CompileError("T.tvm_warp_shuffle in per-thread code is not supported: tritile runs per-thread "
                           "statements as tiles (frontend/per_thread.py) and has no mapping of one thread reading "
                           "another's register", loc)
    require_one_thread(p, "T.tvm_warp_shuffle", loc)
    for name in ("mask", "lane", "width", "warp_size"):
        p.scalar(a[name], loc)  # evaluated for their errors; one lane makes them irrelevant
    return p.scalar(a["value"], loc)
