"""A ring of shared tiles as one register tile per slot (the triton.language backend).

Every on-chip buffer of this backend is a register tile read and written whole (`emitter.py`),
so a ring - a shared buffer used one slot at a time, ``A_shared[ko % slots, :, :]``
(`lowering/shared_slots.ring_buffers`) - cannot be one tile.  `split_slots(func)` gives it one
buffer per slot (``A_shared_0``, ``A_shared_1``, ...: the tile shape, `origin` = the ring), and
runs each statement that uses a slot under an if-chain over the slot index's values, the
statement's copy in each branch naming that slot's buffer::

    if ko % 2 == 0:
        T.gemm(A_shared_0, B_shared_0, C_local)
    else:
        T.gemm(A_shared_1, B_shared_1, C_local)

Accesses at one index expression share a branch, so a gemm of two rings at ``ko % 2`` is two
branches, not four.  The last branch takes every value past the others (an index outside the
ring is undefined behaviour).  A ring indexed in a loop bound or an `if` / `while` condition,
by a name bound inside the statement that uses it, or read into a `Let` / an initial value
(a name bound under a branch would not reach its uses), is left whole (the emitter selects a slot's lanes at
its index from the whole tile, codegen/semantics.py's `selected_text`, and refuses other partial
regions with a CompileError at the user's line).  The result is a `PrimFunc` the
interpreter runs with the same results.
"""
from __future__ import annotations

import dataclasses

from tritile.ir import nodes as ir
from tritile.ir.dtypes import bool_
from tritile.ir.transform import Transformer, bound_var, walk
from tritile.lowering.shared_slots import ring_buffers

_CONTAINERS = (ir.Seq, ir.For, ir.While, ir.If)


def split_slots(func: ir.PrimFunc) -> ir.PrimFunc:
    rings = [b for b in ring_buffers(func) if b.num_versions == 1 and _splittable(func.kernel.body, b)]
    if not rings:
        return func
    slots = {b: [ir.Buffer(f"{b.name}_{s}", tuple(b.shape[1:]), b.dtype, b.scope, origin=b, loc=b.loc)
                 for s in range(b.shape[0])] for b in rings}
    return _Splitter(slots).transform(func)


def _slot_accesses(node, ring) -> list:
    """(index expression, node) of every access of `ring` below `node`."""
    out = []
    for n in walk(node):
        if getattr(n, "buffer", None) is ring:
            if isinstance(n, ir.Region):
                out.append(n.starts[0])
            elif isinstance(n, (ir.Load, ir.Store)):
                out.append(n.indices[0])
    return out


def _splittable(stmt, ring) -> bool:
    """Is every access of `ring` in a statement that can be branched on its slot index?"""
    if isinstance(stmt, _CONTAINERS):
        headers = [getattr(stmt, f) for f in ("start", "stop", "step", "cond") if hasattr(stmt, f)]
        if any(_slot_accesses(h, ring) for h in headers):
            return False
        children = stmt.stmts if isinstance(stmt, ir.Seq) else \
            [stmt.then_body, stmt.else_body] if isinstance(stmt, ir.If) else [stmt.body]
        return all(_splittable(c, ring) for c in children if c is not None)
    # a name bound under a branch would not reach its uses
    if isinstance(stmt, ir.Alloc) or bound_var(stmt) is not None:
        return not _slot_accesses(stmt, ring)
    bound = {id(bound_var(n)) for n in walk(stmt) if bound_var(n) is not None}
    if isinstance(stmt, ir.Parallel):
        bound |= {id(v) for v in stmt.vars}
    return not any(id(v) in bound for index in _slot_accesses(stmt, ring)
                   for v in walk(index) if isinstance(v, ir.Var))


class _Splitter(Transformer):
    def __init__(self, slots: dict):
        self.slots = slots

    def transform(self, node):
        if isinstance(node, ir.Stmt) and not isinstance(node, _CONTAINERS + (ir.Alloc,)):
            indices = []
            for ring in self.slots:
                for index in _slot_accesses(node, ring):
                    if index not in indices:
                        indices.append(index)
            if indices:
                return self._branch(node, indices)
        return super().transform(node)

    def visit_Alloc(self, n):
        parts = self.slots.get(n.buffer)
        return n if parts is None else [ir.Alloc(p, loc=n.loc) for p in parts]

    def _branch(self, stmt, indices):
        """`stmt` under an if-chain over the values of `indices[0]`, the accesses of the rings
        at that index naming each value's slot buffer; the other indices branch inside."""
        index, rest = indices[0], indices[1:]
        count = max(len(parts) for ring, parts in self.slots.items() if index in _slot_accesses(stmt, ring))

        def at(value):
            chosen = _SlotAt(self.slots, index, value).transform(stmt)
            return ir.Seq([self._branch(chosen, rest) if rest else chosen], stmt.loc)

        chain = at(count - 1)
        for value in reversed(range(count - 1)):
            cond = ir.BinOp("==", index, ir.Const(value, index.dtype), bool_)
            chain = ir.Seq([ir.If(cond, at(value), chain, loc=stmt.loc)], stmt.loc)
        return chain.stmts[0] if len(chain.stmts) == 1 else chain


class _SlotAt(Transformer):
    """Accesses ``ring[index, ...]`` -> ``ring_<value>[...]`` (the last slot past the ring's end)."""

    def __init__(self, slots: dict, index, value: int):
        self.slots, self.index, self.value = slots, index, value

    def _part(self, buf, first):
        parts = self.slots.get(buf)
        if parts is None or first != self.index:
            return None
        return parts[min(self.value, len(parts) - 1)]

    def visit_Region(self, r):
        part = self._part(r.buffer, r.starts[0])
        return r if part is None else ir.Region(part, tuple(r.starts[1:]), tuple(r.extents[1:]))

    def visit_Load(self, n):
        part = self._part(n.buffer, n.indices[0])
        return n if part is None else dataclasses.replace(n, buffer=part, indices=tuple(n.indices[1:]))

    def visit_Store(self, n):
        part = self._part(n.buffer, n.indices[0])
        return n if part is None else dataclasses.replace(n, buffer=part, indices=tuple(n.indices[1:]))
