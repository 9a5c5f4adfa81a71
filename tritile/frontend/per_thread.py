"""Per-thread (SIMT) kernel bodies as tile programs, by lockstep vectorization.

TileLang lets a kernel be written per thread: ``tn = T.get_thread_binding(0)`` (threadIdx.x;
``T.get_thread_binding(1)`` threadIdx.y of ``threads=(X, Y)``) used as an index, `T.alloc_local`
arrays and `T.alloc_var`s private to each thread, serial loops (examples/gemv/example_gemv.py).
tritile's statements act on whole tiles; this module rewrites such a body, statement by
statement, into tile statements.

Contract
--------
*Assumed*: the program is race-free CUDA - no thread reads shared or global memory that another
thread writes without a barrier or an atomic between the two, and threads that write one
element without an atomic write the same value.  Such a program gives the same result under
every schedule of its threads, lockstep included: every thread runs statement 1, then every
thread statement 2, ...  That schedule is what this module builds.

*Guaranteed*: for such a program, the rewritten kernel computes what the CUDA kernel computes.
Whatever cannot be mapped soundly is a CompileError at the user's line, never a silent change.

The rewrite
-----------
The parser runs a kernel in *per-thread mode* when the thread index is used as a value (an index,
arithmetic stored somewhere; `detect`); a thread index read only in `if` conditions keeps
thread_ranges.py's warp-group branches.  In per-thread mode `T.get_thread_binding(d)` is a free
`Var` of dimension d (0 where that dimension has one thread) and the body is parsed as usual;
`lower` then rewrites the kernel body's IR:

* *varying* values: the thread Vars, `Let`s bound to varying values, and loads of per-thread
  buffers.  A `T.alloc_local` / `T.alloc_var` (or a name the parser keeps in a "var" buffer) is
  per-thread when some thread writes it a varying value or under a varying condition (a
  fixpoint); it becomes a fragment of shape ``(*thread_dims, n)`` (``n`` its flattened size,
  dropped when 1) read and written at ``[lanes..., i]``.  A local every thread writes alike stays
  one local.
* a statement that reads or writes anything varying runs inside
  ``T.Parallel(*thread_dims)``, its lanes standing for the thread index: only over the dims it
  uses (every thread of a dim it does not use does the same thing); a store into an on-chip
  buffer that is not per-thread runs the lanes of the dims its indices use in parallel and the
  other dims it uses in a serial loop (so each lane of the T.Parallel writes its own element; the
  race-free contract makes the order of equal writes irrelevant).
* a statement with no varying value (and not under a varying `if`) runs once: every thread
  would do the same thing.  Tile operations (`T.copy`, `T.gemm`, ...) are such statements.
* a `Let` of a varying value: inlined where it is used when its value reads no memory, else
  stored to a per-thread fragment where it is bound (its value at that point).
* serial loops (and `while`s) must have uniform bounds: they stay outside the lanes, so a
  loop-carried per-thread value is a fragment updated in each iteration.  A varying bound is a
  CompileError.
* an `if` on a varying condition masks each statement under it (the condition is evaluated
  once, at the `if`: stored per thread first when it reads memory); conjuncts
  ``thread_index == uniform`` pin that thread dimension instead of masking it (``if tk == 0:``
  runs the lanes of the other dims only).  An `if` on a uniform condition stays outside.
* `T.sync_threads()` orders nothing new under lockstep and is dropped; under a varying `if` it
  is a CompileError (CUDA requires every thread to reach it).  A named barrier
  `T.sync_threads(barrier_id, arrive_count)` is dropped too where exactly `arrive_count` threads
  reach it, counted over the thread index where the conditions around it depend on it alone
  (`if tx < RADIX:` around `T.sync_threads(3, RADIX)`, deepseek_v32/topk_selector.py); else a
  CompileError.
* a scalar `T.atomic_add` / `atomic_max` / `atomic_min` is one atomic per thread (also where
  address and value are uniform, as in CUDA).  Into global memory it stays an atomic per lane
  (a T.Parallel atomic, which both backends have); into an on-chip buffer (which no backend has
  atomics for) the lanes' values are combined: the values of every thread, masked lanes giving
  the identity, reduced (`T.reduce_*`) over the thread dims the address does not use, then
  added / maxed into the element by one lane per element.  That needs each index of the
  address to be uniform or one thread dim plus a uniform offset (each lane of the remaining
  dims its own element); other addresses, `return_prev` into on-chip memory and
  `T.atomic_store` of several threads are CompileErrors.
* `T.fill` / `T.clear` / `T.copy` of a per-thread buffer, or under a varying `if`, or at a
  varying place, become element stores in serial loops over the region (then the rules
  above).  Other tile operations on per-thread buffers or under a varying `if`, a `T.Parallel`
  that uses a varying value, and warp shuffles are CompileErrors.
"""
from __future__ import annotations

import ast
import dataclasses
import itertools
import math
from typing import Optional

from tritile.errors import CompileError
from tritile.frontend import exprs, reducers
from tritile.ir import nodes as ir
from tritile.ir.transform import Transformer, substitute_vars, walk

_BINDINGS = ("get_thread_binding", "thread_binding")
_NAMES = ("tx", "ty", "tz")


class PerThread:
    """A kernel in per-thread mode: its thread extents and the Var of each dimension of more
    than one thread (created at the first `T.get_thread_binding` of it)."""

    def __init__(self, extents: tuple, loc):
        self.extents = tuple(extents)
        self.loc = loc
        self.vars = [None] * len(self.extents)

    @property
    def active(self) -> list:
        """The dimensions of more than one thread, in order."""
        return [d for d, e in enumerate(self.extents) if e > 1]

    def var(self, dim: int, hint=None):
        """`T.get_thread_binding(dim)`: the dimension's Var (a fragment's lane), 0 in a dimension of
        one thread (CUDA's threadIdx.y of a one-dimensional block)."""
        if dim >= len(self.extents) or self.extents[dim] == 1:
            return ir.Const(0)
        if self.vars[dim] is None:
            self.vars[dim] = ir.Var(hint or _NAMES[dim])
        return self.vars[dim]


def thread_dims(threads) -> tuple:
    """`T.Kernel(threads=...)` as a tuple of extents."""
    return tuple(threads) if isinstance(threads, (tuple, list)) else (threads,)


def detect(body: list, dims: tuple, loc):
    """A `PerThread` when the kernel body (its AST statements) uses the thread index as a value,
    else None: `T.get_thread_binding(dim)` with dim other than a literal 0, called other than as
    ``name = T.get_thread_binding(...)``, or such a name read outside an `if` statement's
    condition (thread_ranges.py's warp-group branches read it only there).  A kernel of one thread
    is never per-thread (the index is 0)."""
    if math.prod(dims) <= 1:
        return None
    found = _Scan()
    for stmt in body:
        found.visit(stmt, False)
    value_use = found.value_use or any(not in_test for name, in_test in found.reads if name in found.names)
    if value_use or (found.names and any(e > 1 for e in dims[1:])):
        return PerThread(dims, loc)
    return None


def _is_binding_call(node) -> bool:
    """`T.get_thread_binding(...)`, or TVM's launch-thread form `T.thread_binding(0, n, thread=...)`."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    return name in _BINDINGS


class _Scan:
    def __init__(self):
        self.names = set()
        self.reads = []  # (name, inside an `if` test)
        self.value_use = False

    def _dim_zero(self, call) -> bool:
        if (call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id) == "thread_binding":
            thread = [k.value for k in call.keywords if k.arg == "thread"] + list(call.args[2:3])
            return not thread or (isinstance(thread[0], ast.Constant) and thread[0].value == "threadIdx.x")
        args = list(call.args) + [k.value for k in call.keywords if k.arg == "dim"]
        return not args or (isinstance(args[0], ast.Constant) and args[0].value == 0)

    def _thread_arithmetic(self, node) -> bool:
        """Integer arithmetic of thread-range names and literals that names one of them."""
        parts = list(ast.walk(node))
        allowed = (ast.BinOp, ast.UnaryOp, ast.Name, ast.Constant, ast.expr_context, ast.operator, ast.unaryop)
        return all(isinstance(n, allowed) for n in parts) and any(
            isinstance(n, ast.Name) and n.id in self.names for n in parts)

    def visit(self, node, in_test):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return
        if isinstance(node, ast.If):
            self.visit(node.test, True)
            for s in node.body + node.orelse:
                self.visit(s, False)
            return
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and _is_binding_call(node.value):
            self.names.add(node.targets[0].id)
            if not self._dim_zero(node.value):
                self.value_use = True
            return
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and self._thread_arithmetic(node.value):  # `warp = tx // 32`: another thread-range name
            self.names.add(node.targets[0].id)
            return
        if _is_binding_call(node) and not (in_test and self._dim_zero(node)):
            self.value_use = True
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            self.reads.append((node.id, in_test))
        # in a condition, only arithmetic and comparisons keep the index a thread range (`A[tx] > 0` reads it)
        in_test = in_test and isinstance(node, (ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.expr_context,
                                                ast.operator, ast.cmpop, ast.boolop, ast.unaryop))
        for child in ast.iter_child_nodes(node):
            self.visit(child, in_test)


def lower(pt: PerThread, stmts: list, new_name) -> list:
    """The kernel body `stmts` (parsed in per-thread mode) as tile statements (see the module
    docstring); `new_name(base)` gives a buffer name unused in the kernel."""
    return _Lowering(pt, new_name).run(stmts)


@dataclasses.dataclass(frozen=True)
class _Ctx:
    mask: tuple = ()  # conditions (in thread-Var terms) the statement runs under
    pins: tuple = ()  # (dim, uniform Expr): thread dims fixed by `tv == value` conditions

    @property
    def pinned(self) -> dict:
        return dict(self.pins)


def _constant_value(e, env: dict):
    """`e` evaluated with the thread Vars of `env` bound, or None where it reads anything else."""
    if isinstance(e, ir.Const):
        return e.value
    if isinstance(e, ir.Var):
        return env.get(e)
    if isinstance(e, ir.BinOp) and e.op in exprs.PY_BINARY:
        lhs, rhs = _constant_value(e.lhs, env), _constant_value(e.rhs, env)
        return None if lhs is None or rhs is None else exprs.PY_BINARY[e.op](lhs, rhs)
    if isinstance(e, ir.UnaryOp) and e.op in ("not", "-"):
        value = _constant_value(e.operand, env)
        return None if value is None else (not value if e.op == "not" else -value)
    return None


def _conjuncts(e):
    if isinstance(e, ir.BinOp) and e.op == "and":
        return _conjuncts(e.lhs) + _conjuncts(e.rhs)
    return [e]


def _pure(e) -> bool:
    """Reads no memory: can be recomputed where it is used."""
    return not any(isinstance(n, ir.Load) for n in walk(e))


class _Lowering:
    def __init__(self, pt: PerThread, new_name):
        for d in pt.active:  # a dimension the body never names still has its threads
            pt.var(d)
        self.pt = pt
        self.new_name = new_name
        self.dim_of = {id(v): d for d, v in enumerate(pt.vars) if v is not None}
        self.tvars = {d: v for d, v in enumerate(pt.vars) if v is not None}
        self.varying_ids = set(self.dim_of)
        self.marked = set()  # ids of local / var buffers some thread writes its own value
        self.buffers = {}  # id(local buffer) -> its per-thread fragment
        self.subs = {}  # Let var -> what replaces it (an Expr in thread-Var terms)

    # ---------------------------------------------------------------- analysis
    def varying(self, node) -> bool:
        for n in walk(node):
            if isinstance(n, ir.Var) and id(n) in self.varying_ids:
                return True
            buf = getattr(n, "buffer", None)
            if isinstance(buf, ir.Buffer) and id(buf) in self.marked:
                return True
        return False

    def _mark(self, buf):
        if buf.scope in ("local", "var") and id(buf) not in self.marked:
            self.marked.add(id(buf))
            self.changed = True

    def _analyse(self, stmts, masked):
        for s in stmts:
            if isinstance(s, ir.Seq):
                self._analyse(s.stmts, masked)
            elif isinstance(s, ir.Let):
                if self.varying(s.value) and id(s.var) not in self.varying_ids:
                    self.varying_ids.add(id(s.var))
                    self.changed = True
            elif isinstance(s, ir.Alloc):
                if s.init is not None and self.varying(s.init):
                    self._mark(s.buffer)
            elif isinstance(s, (ir.Store, ir.Fill, ir.Copy, ir.AtomicAdd)):
                target = s.buffer if isinstance(s, ir.Store) else s.dst.buffer
                if masked or self.varying(s):
                    self._mark(target)
                if isinstance(s, ir.AtomicAdd) and s.prev is not None and id(s.prev) not in self.varying_ids:
                    self.varying_ids.add(id(s.prev))  # one atomic per thread: each sees its own value
                    self.changed = True
            elif isinstance(s, ir.If):
                inner = masked or self.varying(s.cond)
                self._analyse(s.then_body.stmts, inner)
                if s.else_body is not None:
                    self._analyse(s.else_body.stmts, inner)
            elif isinstance(s, (ir.For, ir.While, ir.Parallel, ir.WarpGroups)):
                self._analyse(s.body.stmts, masked)

    # ---------------------------------------------------------------- rewriting helpers
    def run(self, stmts):
        self.changed = True
        while self.changed:
            self.changed = False
            self._analyse(stmts, False)
        return self._block(stmts, _Ctx())

    def fragment(self, base, extra: tuple, dtype, loc) -> ir.Buffer:
        shape = tuple(self.pt.extents[d] for d in self.pt.active) + tuple(extra)
        return ir.Buffer(self.new_name(base), shape, dtype, "fragment", loc=loc)

    def per_thread_buffer(self, buf) -> ir.Buffer:
        if id(buf) not in self.buffers:
            size = math.prod(buf.shape)
            self.buffers[id(buf)] = self.fragment(buf.name, (size,) if size > 1 else (), buf.dtype, buf.loc)
        return self.buffers[id(buf)]

    def lane_indices(self) -> tuple:
        return tuple(self.tvars[d] for d in self.pt.active)

    def flat_index(self, buf, indices, loc) -> tuple:
        """The per-thread fragment's indices of element `indices` of local `buf`."""
        if math.prod(buf.shape) == 1:
            return self.lane_indices()
        flat, stride = None, 1
        for index, extent in reversed(list(zip(indices, buf.shape))):
            if extent == 1:
                continue
            term = index if stride == 1 else exprs.binary("*", index, stride, loc)
            flat = term if flat is None else exprs.binary("+", term, flat, loc)
            stride *= extent
        return self.lane_indices() + (flat,)

    def sub(self, node):
        """`node` with inlined / stored Lets replaced and per-thread buffers' loads retargeted."""
        low = self

        class _Sub(Transformer):
            def visit_Var(self, v):
                return low.subs.get(id(v), v)

            def visit_Load(self, e):
                if id(e.buffer) in low.marked:
                    frag = low.per_thread_buffer(e.buffer)
                    return ir.Load(frag, low.flat_index(e.buffer, e.indices, None), e.dtype)
                return e

        return _Sub().transform(node)

    def dims_of(self, nodes, ctx) -> list:
        """The thread dims (not pinned) whose Var occurs in `nodes`."""
        pinned = ctx.pinned
        found = {self.dim_of[id(n)] for n in walk(list(nodes)) if isinstance(n, ir.Var) and id(n) in self.dim_of}
        return sorted(d for d in found if d not in pinned)

    def all_dims(self, ctx) -> list:
        pinned = ctx.pinned
        return [d for d in self.pt.active if d not in pinned]

    def lanes(self, stmts, dims, ctx, loc, serial=()) -> list:
        """`stmts` (thread-Var terms) run by the lanes of thread `dims` under the context's mask:
        a T.Parallel over `dims` (none: one statement), inside serial loops over `serial`."""
        mapping = {self.tvars[d]: value for d, value in ctx.pins}
        lane_vars = [ir.Var(self.tvars[d].name) for d in dims]
        mapping.update({self.tvars[d]: lane for d, lane in zip(dims, lane_vars)})
        loop_vars = [ir.Var(self.tvars[d].name) for d in serial]
        mapping.update({self.tvars[d]: v for d, v in zip(serial, loop_vars)})
        body = list(stmts)
        if ctx.mask:
            cond = ctx.mask[0]
            for term in ctx.mask[1:]:
                cond = exprs.binary("and", cond, term, loc)
            body = [ir.If(cond, ir.Seq(body, loc=loc), loc=loc)]
        body = substitute_vars(body, mapping)
        leftover = [n for n in walk(body) if isinstance(n, ir.Var) and id(n) in self.dim_of]
        if leftover:  # a thread Var the statement was not given lanes for: an internal error
            raise CompileError(f"per-thread code: thread index {leftover[0].name} left unmapped", loc)
        if dims:
            body = [ir.Parallel(tuple(lane_vars), tuple(self.pt.extents[d] for d in dims), ir.Seq(body, loc=loc),
                                loc=loc)]
        for d, v in reversed(list(zip(serial, loop_vars))):
            body = [ir.For(v, ir.Const(0), ir.Const(self.pt.extents[d]), ir.Seq(body, loc=loc), loc=loc)]
        return body

    # ---------------------------------------------------------------- statements
    def _block(self, stmts, ctx) -> list:
        out = []
        for s in stmts:
            out.extend(self._stmt(s, ctx))
        return out

    def _seq(self, seq, ctx):
        return None if seq is None else ir.Seq(self._block(seq.stmts, ctx), loc=seq.loc)

    def _stmt(self, s, ctx) -> list:
        loc = getattr(s, "loc", None)
        if isinstance(s, ir.Seq):
            return self._block(s.stmts, ctx)
        method = getattr(self, "_" + type(s).__name__, None)
        if method is not None:
            return method(s, ctx, loc)
        if self.varying(s) or ctx.mask:
            where = "under a condition that varies by thread" if ctx.mask else "on a per-thread value"
            raise CompileError(f"{_describe(s)} in per-thread code {where}: tritile maps per-thread statements onto "
                               f"tiles one element per thread, and has no mapping for this one", loc)
        return [s]

    def _Alloc(self, s, ctx, loc):
        if id(s.buffer) not in self.marked:
            return [ir.Alloc(s.buffer, None if s.init is None else self.sub(s.init), loc=loc)]
        frag = self.per_thread_buffer(s.buffer)
        out = [ir.Alloc(frag, loc=loc)]
        if s.init is not None:
            out += self._Store(ir.Store(s.buffer, (ir.Const(0),), s.init, loc=loc), ctx, loc)
        return out

    def _Let(self, s, ctx, loc):
        value = self.sub(s.value)
        if id(s.var) not in self.varying_ids:
            return [ir.Let(s.var, value, loc=loc)]
        if _pure(value):
            self.subs[id(s.var)] = value
            return []
        frag = self.fragment(s.var.name, (), s.var.dtype, loc)
        self.subs[id(s.var)] = ir.Load(frag, self.lane_indices(), s.var.dtype)
        store = ir.Store(frag, self.lane_indices(), value, loc=loc)
        return [ir.Alloc(frag, loc=loc)] + self.lanes([store], self.all_dims(ctx), ctx, loc)

    def _Store(self, s, ctx, loc):
        buf = s.buffer
        indices, value = self.sub(tuple(s.indices)), self.sub(s.value)
        if id(buf) in self.marked:
            frag = self.per_thread_buffer(buf)
            store = ir.Store(frag, self.flat_index(buf, indices, loc), exprs.cast(value, frag.dtype, loc), loc=loc)
            return self.lanes([store], self.all_dims(ctx), ctx, loc)
        store = ir.Store(buf, indices, value, loc=loc)
        if not ctx.mask and not self.varying(store):
            return [store]
        if buf.scope == "global":
            return self.lanes([store], self.dims_of([indices, value, ctx.mask], ctx), ctx, loc)
        own = self.dims_of([indices], ctx)
        serial = [d for d in self.dims_of([value, ctx.mask], ctx) if d not in own]
        return self.lanes([store], own, ctx, loc, serial=serial)

    def _elementwise(self, region, make, loc) -> list:
        """Serial loops over the elements of `region` (its dims of extent > 1), each the statement
        `make(indices)`."""
        loop_vars, indices = [], []
        for d, (start, extent) in enumerate(zip(region.starts, region.extents)):
            if extent == 1:
                indices.append(start)
                continue
            v = ir.Var(f"i{d}")
            loop_vars.append((v, extent))
            indices.append(exprs.binary("+", start, v, loc))
        body = [make(tuple(indices), [v for v, _ in loop_vars])]
        for v, extent in reversed(loop_vars):
            body = [ir.For(v, ir.Const(0), ir.Const(extent), ir.Seq(body, loc=loc), loc=loc)]
        return body

    def _Fill(self, s, ctx, loc):
        buf = s.dst.buffer
        full = all(isinstance(st, ir.Const) and st.value == 0 for st in s.dst.starts) \
            and tuple(s.dst.extents) == tuple(buf.shape)
        if id(buf) in self.marked and full and not ctx.mask and not self.varying(s.value):
            frag = self.per_thread_buffer(buf)
            return [ir.Fill(ir.Region.full(frag), self.sub(s.value), loc=loc)]
        if id(buf) not in self.marked and not ctx.mask and not self.varying(s):
            return [s]
        stmts = self._elementwise(s.dst, lambda at, _: ir.Store(buf, at, s.value, loc=loc), loc)
        return self._block(stmts, ctx)

    def _Copy(self, s, ctx, loc):
        if not ctx.mask and not self.varying(s):
            return [s]
        src, dst = s.src, s.dst
        src_dims = [d for d, e in enumerate(src.extents) if e != 1]
        if [src.extents[d] for d in src_dims] != [e for e in dst.extents if e != 1]:
            raise CompileError(f"T.copy in per-thread code between regions of different shapes "
                               f"{list(src.extents)} and {list(dst.extents)}", loc)

        def make(at, loop_vars):
            src_at = list(src.starts)
            for d, v in zip(src_dims, loop_vars):
                src_at[d] = exprs.binary("+", src_at[d], v, loc)
            value = exprs.cast(ir.Load(src.buffer, tuple(src_at), src.buffer.dtype), dst.buffer.dtype, loc)
            return ir.Store(dst.buffer, at, value, loc=loc)

        return self._block(self._elementwise(dst, make, loc), ctx)

    def _AtomicAdd(self, s, ctx, loc):
        if isinstance(s.value, ir.Region):  # a tile atomic: one tile operation
            if ctx.mask or self.varying(s):
                raise CompileError(f"a tile T.atomic_{s.kind} in per-thread code on a per-thread value or under a "
                                   f"condition that varies by thread is not supported; add element by element", loc)
            return [s]
        dst = s.dst.buffer
        starts, value = self.sub(tuple(s.dst.starts)), self.sub(s.value)
        if dst.scope == "global":
            region = dataclasses.replace(s.dst, starts=starts)
            if s.prev is None:
                return self.lanes([dataclasses.replace(s, dst=region, value=value)], self.all_dims(ctx), ctx, loc)
            prev = ir.Var(s.prev.name, s.prev.dtype)
            frag = self.fragment(s.prev.name, (), s.prev.dtype, loc)
            self.subs[id(s.prev)] = ir.Load(frag, self.lane_indices(), s.prev.dtype)
            stmts = [dataclasses.replace(s, dst=region, value=value, prev=prev),
                     ir.Store(frag, self.lane_indices(), prev, loc=loc)]
            return [ir.Alloc(frag, loc=loc)] + self.lanes(stmts, self.all_dims(ctx), ctx, loc)
        return self._shared_atomic(s, starts, value, ctx, loc)

    def _shared_atomic(self, s, starts, value, ctx, loc):
        """A scalar atomic of every thread into on-chip buffer `s.dst.buffer` (module docstring)."""
        dst = s.dst.buffer
        name = f"T.atomic_{s.kind}" if s.kind != "exchange" else "T.atomic_store"
        if s.kind not in ("add", "max", "min") or s.prev is not None or id(dst) in self.marked:
            raise CompileError(f"{name} into on-chip buffer {dst.name} in per-thread code"
                               f"{' with return_prev' if s.prev is not None else ''} is not supported: tritile "
                               f"combines the threads' atomics into on-chip memory by a reduction, which only "
                               f"T.atomic_add / T.atomic_max / T.atomic_min without return_prev have", loc)
        dims = self.all_dims(ctx)
        own = []
        for index in starts:
            found = self.dims_of([index], ctx)
            if not found:
                continue
            d = found[0]
            if len(found) > 1 or d in own or not _var_plus_uniform(index, self.tvars[d], self.dim_of):
                raise CompileError(f"{name} into on-chip buffer {dst.name} in per-thread code at index "
                                   f"{exprs.expr_str(index)}: each index must be uniform or one thread index plus "
                                   f"a uniform offset (each thread of the other dims adding into its own "
                                   f"element)", loc)
            own.append(d)
        op = {"add": "sum", "max": "max", "min": "min"}[s.kind]
        combine = {"add": "+", "max": "max", "min": "min"}[s.kind]
        value = exprs.cast(value, dst.dtype, loc)
        identity = reducers.identity(op, dst.dtype)
        if not isinstance(identity, ir.Expr):
            identity = exprs.make_const(identity, dst.dtype)
        out = []
        rest = [d for d in dims if d not in own]
        current = ir.Load(dst, starts, dst.dtype)
        if not rest:  # one lane per element already
            update = exprs.cast(exprs.binary(combine, current, value, loc), dst.dtype, loc)
            return self.lanes([ir.Store(dst, starts, update, loc=loc)], own, ctx, loc)
        # every thread's value (the masked ones the identity), reduced over the dims the address leaves out
        shape = tuple(self.pt.extents[d] for d in dims)
        values = ir.Buffer(self.new_name(f"{dst.name}_{s.kind}"), shape, dst.dtype, "fragment", loc=loc)
        out.append(ir.Alloc(values, loc=loc))
        at = tuple(self.tvars[d] for d in dims)
        masked = value
        if ctx.mask:
            cond = ctx.mask[0]
            for term in ctx.mask[1:]:
                cond = exprs.binary("and", cond, term, loc)
            masked = exprs.select(cond, value, identity, loc)
        out += self.lanes([ir.Store(values, at, masked, loc=loc)], dims, _Ctx(pins=ctx.pins), loc)
        kept = list(dims)
        src = values
        for d in reversed(rest):
            pos = kept.index(d)
            kept.remove(d)
            shape = tuple(self.pt.extents[k] for k in kept) or (1,)
            reduced = ir.Buffer(self.new_name(f"{dst.name}_{s.kind}"), shape, dst.dtype, "fragment", loc=loc)
            out.append(ir.Alloc(reduced, loc=loc))
            out.append(ir.Reduce(op, ir.Region.full(src), ir.Region.full(reduced), pos, clear=True, loc=loc))
            src = reduced
        total = ir.Load(src, tuple(self.tvars[d] for d in kept) or (ir.Const(0),), dst.dtype)
        update = exprs.cast(exprs.binary(combine, current, total, loc), dst.dtype, loc)
        # the uniform part of the mask (its thread terms are in the combined values)
        out += self.lanes([ir.Store(dst, starts, update, loc=loc)], own, _Ctx(pins=ctx.pins), loc)
        return out

    def _If(self, s, ctx, loc):
        cond = self.sub(s.cond)
        if not self.varying(cond):
            else_body = self._seq(s.else_body, ctx)
            return [ir.If(cond, self._seq(s.then_body, ctx), else_body, loc=loc)]
        out = []
        if not _pure(cond):  # evaluated once, at the `if` (a branch may write what it reads)
            frag = self.fragment("cond", (), cond.dtype, loc)
            out.append(ir.Alloc(frag, loc=loc))
            out += self.lanes([ir.Store(frag, self.lane_indices(), cond, loc=loc)], self.all_dims(ctx), ctx, loc)
            cond = ir.Load(frag, self.lane_indices(), cond.dtype)
        out += self._block(s.then_body.stmts, self._narrowed(ctx, cond, loc))
        if s.else_body is not None and s.else_body.stmts:
            out += self._block(s.else_body.stmts, _Ctx(ctx.mask + (exprs.unary("not", cond, loc),), ctx.pins))
        return out

    def _narrowed(self, ctx, cond, loc) -> _Ctx:
        """The context under `cond`: `thread == uniform` conjuncts pin the dim (its range checked)."""
        mask, pins = list(ctx.mask), dict(ctx.pins)
        for term in _conjuncts(cond):
            pin = self._pin(term, pins)
            if pin is None:
                mask.append(term)
                continue
            d, value = pin
            pins[d] = value
            extent = self.pt.extents[d]
            if isinstance(value, ir.Const):
                if not 0 <= value.value < extent:
                    mask.append(ir.Const(False, ir.bool_))  # no thread has that index
                continue
            mask.append(exprs.binary("and", exprs.binary(">=", value, 0, loc), exprs.binary("<", value, extent, loc),
                                     loc))
        mask = [substitute_vars(m, {self.tvars[d]: v for d, v in pins.items()}) for m in mask]
        return _Ctx(tuple(mask), tuple(sorted(pins.items())))

    def _pin(self, term, pins):
        if not (isinstance(term, ir.BinOp) and term.op == "=="):
            return None
        for var, other in ((term.lhs, term.rhs), (term.rhs, term.lhs)):
            if isinstance(var, ir.Var) and id(var) in self.dim_of and self.dim_of[id(var)] not in pins \
                    and not self.varying(other) and var.dtype.is_int:
                return self.dim_of[id(var)], other
        return None

    def _For(self, s, ctx, loc):
        bounds = self.sub((s.start, s.stop, s.step))
        if self.varying(bounds):
            raise CompileError("a loop whose bounds vary by thread (they use the thread index or a per-thread value) "
                               "is not supported in per-thread code: tritile runs every thread's iterations "
                               "together, so the trip count must be the same for all threads", loc)
        start, stop, step = bounds
        return [dataclasses.replace(s, start=start, stop=stop, step=step, body=self._seq(s.body, ctx))]

    def _While(self, s, ctx, loc):
        cond = self.sub(s.cond)
        if self.varying(cond):
            raise CompileError("a `while` loop whose condition varies by thread is not supported in per-thread code: "
                               "tritile runs every thread's iterations together, so the loop must run the same "
                               "number of times for all threads", loc)
        return [ir.While(cond, self._seq(s.body, ctx), loc=loc)]

    def _ThreadBarrier(self, s, ctx, loc):
        threads = math.prod(self.pt.extents)
        arriving = self._threads_under(ctx) if ctx.mask or ctx.pins else threads
        if s.participants is None and arriving != threads:
            raise CompileError("T.sync_threads() under a condition that varies by thread: every thread of the block "
                               "must reach the barrier", loc)
        if s.participants is not None and arriving != s.participants:
            raise CompileError(f"T.sync_threads(barrier_id, {s.participants}): the threads that reach it must be "
                               f"exactly {s.participants}, and tritile counts them only where the conditions around "
                               f"it depend on the thread index alone (here: "
                               f"{'not known' if arriving is None else arriving})", loc)
        return []  # lockstep: the statements before it already ran for every thread that reaches it

    def _threads_under(self, ctx) -> Optional[int]:
        """How many threads satisfy the conditions `ctx` runs under, where they are compile-time
        functions of the thread index alone (else None)."""
        dims = [d for d, e in enumerate(self.pt.extents) if e > 1]
        count = 0
        for ids in itertools.product(*(range(self.pt.extents[d]) for d in dims)):
            env = {self.pt.vars[d]: i for d, i in zip(dims, ids) if self.pt.vars[d] is not None}
            pinned = [_constant_value(value, env) == env.get(self.pt.vars[d], 0) for d, value in ctx.pins]
            values = [_constant_value(c, env) for c in ctx.mask] + pinned
            if any(v is None for v in values):
                return None
            count += all(values)
        return count

    def _lane_statement(self, s, ctx, loc):
        if not ctx.mask and not self.varying(s):
            return [s]
        s = self.sub(s)
        return self.lanes([s], self.dims_of([s, ctx.mask], ctx), ctx, loc)

    _Print = _DeviceAssert = _lane_statement

    def _Evaluate(self, s, ctx, loc):
        return [s]


def _var_plus_uniform(index, var, dim_of) -> bool:
    """`index` is `var`, or `var` plus / minus an expression without thread Vars."""
    if index is var:
        return True
    if isinstance(index, ir.BinOp) and index.op in ("+", "-"):
        pairs = [(index.lhs, index.rhs)] + ([(index.rhs, index.lhs)] if index.op == "+" else [])
        for a, b in pairs:
            if a is var and not any(isinstance(n, ir.Var) and id(n) in dim_of for n in walk(b)):
                return True
    return False


def _describe(s) -> str:
    names = {"Gemm": "T.gemm", "Reduce": "T.reduce", "Cumsum": "T.cumsum", "CumExtremum": "T.cummax / T.cummin",
             "Parallel": "a T.Parallel loop", "WarpGroups": "a T.ws section", "AllocBarrier": "T.alloc_barrier",
             "BarrierArrive": "T.barrier_arrive", "BarrierWait": "T.barrier_wait"}
    return names.get(type(s).__name__, type(s).__name__)
