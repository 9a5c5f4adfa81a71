"""buffer_views: an on-chip view (`T.reshape` / `T.view` of a shared buffer or fragment) becomes
a buffer of its own, kept equal to its storage by reshaping copies.

Assumes: the frontend's IR, where an on-chip view ``V`` (a Buffer whose `view_of` is its
storage ``S``) is declared by an ``Alloc(V)`` after ``S``'s and shares ``S``'s bytes.

Guarantees: no on-chip view of its storage's dtype remains (global views are the runtime's:
each is a tensor parameter of its own).  Each such view ``V`` becomes an ordinary buffer of its shape and
scope, allocated where it was declared and filled there by ``T.copy(S, V)``; afterwards, in
its declaration's scope,

* after a statement that writes ``S``: ``T.copy(S, W)`` for every view ``W`` of ``S``;
* after a statement that writes ``V``: ``T.copy(V, S)``, then ``T.copy(S, W)`` for the other
  views ``W`` of ``S``.

A statement is a leaf of the statement tree: a loop or an `if` is entered (its body's
statements get the copies), a `T.Parallel` is one statement (its writes land when it ends).
So between statements every view holds its storage's elements (a copy between regions of
equal size and different shapes moves the elements in row-major order: a reshape), and a read
of either buffer sees what the program wrote through the other - the values of the frontend
program, where they share bytes.  A view of another dtype (`T.view(S, dtype=...)`) stays as it
is: a copy converts values, it cannot reinterpret their bits; the interpreter runs such a view
(it shares the bytes), both backends refuse it at its line (`lower_alloc`).

Why: a register tile (fragment) has no storage that another shape could alias, and Triton
reshapes register tensors only as values (`tl.reshape` / `gl.reshape`); the copies are those
reshapes, which both backends emit for a T.copy between tiles of different shapes.
"""
from __future__ import annotations

import dataclasses

from tritile.ir import nodes as ir
from tritile.ir.transform import substitute_buffers, walk, written_buffer

_CONTAINERS = (ir.Seq, ir.For, ir.If, ir.While, ir.WarpGroups, ir.ConsumerPartitions)


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    views = [n.buffer for n in walk(func.kernel.body) if isinstance(n, ir.Alloc) and _reshaped(n.buffer)]
    if not views:
        return func
    own = {view: dataclasses.replace(view, view_of=None) for view in views}
    body = _with_copies(func.kernel.body, {})
    body = substitute_buffers(body, own)
    return dataclasses.replace(func, kernel=dataclasses.replace(func.kernel, body=body))


def _reshaped(buf: ir.Buffer) -> bool:
    """Is `buf` an on-chip view this pass rewrites (one of its storage's dtype)?"""
    return buf.view_of is not None and buf.dtype == buf.view_of.dtype


def _copy(src: ir.Buffer, dst: ir.Buffer, loc) -> ir.Copy:
    return ir.Copy(ir.Region.full(src), ir.Region.full(dst), loc=loc)


def _with_copies(seq: ir.Seq, live: dict) -> ir.Seq:
    """`seq` with the copies of the contract; `live` maps a storage to its views declared in
    the scopes around `seq` (a view declared in `seq` is live for the rest of it)."""
    live = {storage: list(views) for storage, views in live.items()}
    out = []
    for stmt in seq.stmts:
        if isinstance(stmt, ir.Alloc) and _reshaped(stmt.buffer):
            view, storage = stmt.buffer, stmt.buffer.view_of
            live.setdefault(storage, []).append(view)
            out += [stmt, _copy(storage, view, stmt.loc)]
            continue
        if isinstance(stmt, _CONTAINERS):
            out.append(_entered(stmt, live))
            continue
        out.append(stmt)
        out += _refresh(stmt, live)
    return dataclasses.replace(seq, stmts=out)


def _entered(stmt, live: dict):
    """A loop / branch / block with the copies added inside its bodies."""
    if isinstance(stmt, ir.Seq):
        return _with_copies(stmt, live)
    return dataclasses.replace(stmt, **{f.name: _with_copies(getattr(stmt, f.name), live)
                                        for f in dataclasses.fields(stmt) if isinstance(getattr(stmt, f.name), ir.Seq)})


def _refresh(stmt, live: dict) -> list:
    """The copies after `stmt` that make every live view equal its storage again."""
    written = {id(b) for b in (written_buffer(n) for n in walk(stmt)) if b is not None}
    out = []
    for storage, views in live.items():
        through = [v for v in views if id(v) in written]
        if id(storage) not in written and not through:
            continue
        if through:
            out.append(_copy(through[-1], storage, stmt.loc))
        out += [_copy(storage, v, stmt.loc) for v in views if v is not (through[-1] if through else None)]
    return out
