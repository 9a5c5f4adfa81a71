"""Generic traversal of the tile IR.

`walk` yields every node below a root; `written_buffer` names the buffer a statement writes,
`touches` tells whether a subtree names a buffer;
`Transformer` rebuilds a tree bottom-up, calling
`visit_<ClassName>` where a subclass defines one.  Both treat `Buffer` and `Var` as leaves
(they are identities, not children), so a pass that rewrites buffers does it with
`substitute_buffers` in one step.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

from tritile.ir import nodes as ir

_LEAVES = (ir.Buffer, ir.Var, ir.Const, ir.ConstTable, ir.SourceLoc, ir.PipelineSchedule, str, int, float, bool, type(None))


def _child_values(node):
    for f in dataclasses.fields(node):
        if f.name in ("loc", "dtype", "origin", "layout", "annotated_layout"):
            continue
        yield f.name, getattr(node, f.name)


def walk(node) -> Iterator:
    """Pre-order iteration over `node` and all IR nodes below it (Buffers excluded)."""
    stack = [node]
    while stack:
        cur = stack.pop()
        if isinstance(cur, (list, tuple)):
            stack.extend(reversed(cur))
            continue
        if isinstance(cur, dict) or isinstance(cur, _LEAVES) or not dataclasses.is_dataclass(cur):
            if isinstance(cur, (ir.Var, ir.Const)):
                yield cur
            continue
        yield cur
        stack.extend(reversed([v for _, v in _child_values(cur)]))


class Transformer:
    """Bottom-up rebuilder.  Override `visit_<Class>(self, node)`; the node passed in
    already has transformed children.  Return a node (or, for statements inside a `Seq`,
    a list of statements to splice, or None to delete)."""

    def __call__(self, node):
        return self.transform(node)

    def transform(self, node):
        if isinstance(node, list):
            return self._transform_list(node)
        if isinstance(node, tuple):
            return tuple(self.transform(v) for v in node)
        if isinstance(node, (ir.Var, ir.Const)):
            visit = getattr(self, "visit_" + type(node).__name__, None)
            return visit(node) if visit else node
        if isinstance(node, _LEAVES) or isinstance(node, dict) or not dataclasses.is_dataclass(node):
            return node
        changes = {}
        for name, value in _child_values(node):
            new = self.transform(value)
            if new is not value:
                changes[name] = new
        if changes:
            node = dataclasses.replace(node, **changes)
        visit = getattr(self, "visit_" + type(node).__name__, None)
        return visit(node) if visit else node

    def _transform_list(self, items: list):
        out = []
        changed = False
        for item in items:
            new = self.transform(item)
            if new is not item:
                changed = True
            if new is None:
                continue
            if isinstance(new, list) and isinstance(item, ir.Stmt):
                out.extend(new)
            else:
                out.append(new)
        return out if changed else items


def substitute_buffers(node, mapping: dict):
    """Replace every reference to a key of `mapping` (Region, Load, Store, Alloc, params)
    by its value; a view (`Buffer.view_of`) of a replaced buffer becomes one view of its
    replacement, so a view keeps naming its storage."""
    swapped = {}

    def swap(buf):
        if buf not in swapped:
            new = mapping.get(buf, buf)
            if new.view_of is not None and swap(new.view_of) is not new.view_of:
                new = dataclasses.replace(new, view_of=swap(new.view_of))
            swapped[buf] = new
        return swapped[buf]

    class _Sub(Transformer):
        def _swap(self, n):
            new = swap(n.buffer)
            return dataclasses.replace(n, buffer=new) if new is not n.buffer else n

        visit_Region = visit_Load = visit_Store = visit_Alloc = _swap

        def visit_PrimFunc(self, f):
            return dataclasses.replace(f, params=[swap(p) for p in f.params])

    return _Sub().transform(node)


def substitute_vars(node, mapping: dict):
    """Replace Var occurrences (by identity) with the mapped expressions."""

    class _Sub(Transformer):
        def visit_Var(self, v):
            return mapping.get(v, v)

    return _Sub().transform(node)


# statement type -> the field holding the region (or buffer) it writes
_WRITTEN_FIELD = {ir.Store: "buffer", ir.Copy: "dst", ir.AsyncCopy: "dst", ir.AtomicAdd: "dst", ir.Fill: "dst",
                  ir.Reduce: "dst", ir.Cumsum: "dst", ir.CumExtremum: "dst", ir.Gemm: "c"}


def bound_var(node):
    """The scalar name statement `node` binds for the rest of its Seq: a `Let`'s var, an
    `AtomicAdd`'s `prev`; else None."""
    if isinstance(node, ir.Let):
        return node.var
    if isinstance(node, ir.AtomicAdd):
        return node.prev
    return None


def written_buffer(node):
    """The Buffer `node` writes, or None for a node that writes no buffer."""
    field = _WRITTEN_FIELD.get(type(node))
    if field is None:
        return None
    target = getattr(node, field)
    return target if isinstance(target, ir.Buffer) else target.buffer


def touches(node, buffer: ir.Buffer) -> bool:
    """Does any region, load or store below `node` name `buffer`?"""
    return any(getattr(n, "buffer", None) is buffer for n in walk(node))


def address_tensors(node) -> dict:
    """id(Var) -> the `T.make_tensor` tensors (global Buffers with `address`) at that Var's address
    that `node` uses: what a backend defines, as pointers, where the Var's `Let` binds it."""
    out = {}
    for n in walk(node):
        buf = getattr(n, "buffer", None)
        if isinstance(buf, ir.Buffer) and buf.address is not None:
            found = out.setdefault(id(buf.address), [])
            if all(b is not buf for b in found):
                found.append(buf)
    return out


def top_level(seq: ir.Seq) -> list:
    """The statements of `seq` in program order, nested Seqs and the body of
    `ConsumerPartitions` flattened (not entering loops or branches)."""
    out = []
    for s in seq.stmts:
        if isinstance(s, ir.Seq):
            out.extend(top_level(s))
        elif isinstance(s, ir.ConsumerPartitions):
            out.extend(top_level(s.body))
        else:
            out.append(s)
    return out
