"""flat_reshapes: a 1-D on-chip buffer written at the row-major linearisation of a T.Parallel's
variables is a reshape: it gets that Parallel's shape.

Assumes: the frontend's IR (this pass runs first).

Guarantees: for a 1-D fragment / local buffer ``F`` of ``P`` elements such that

* every write of ``F`` is ``F[lin] = v`` inside a ``T.Parallel(E0, .., Ek)`` (rank >= 2, the
  product of the extents ``P``, every such Parallel the same extents), ``lin`` being
  ``i0 * (E1 * .. * Ek) + .. + ik`` of its variables (in any order of the terms),
* and every read of ``F`` is either such an ``F[lin]`` inside such a Parallel, or ``F[i]`` inside
  a 1-D ``T.Parallel(P)`` over ``i``,

``F`` becomes a buffer of shape ``(E0, .., Ek)`` indexed by the variables themselves, and each
such 1-D Parallel becomes a Parallel over ``(E0, .., Ek)`` with ``i`` replaced by ``lin`` of its
new variables (TileLang's composable index: ``B_local[i * block_N + j] = A_local[i, j]`` and a
``T.Parallel(block_M * block_N)`` reading ``B_local[i]``).  Values are unchanged: element ``lin``
of the flat buffer is element ``(i0, .., ik)`` of the reshaped one.  Any other access leaves
``F`` as it is (a backend that cannot index a register tile that way says so at the access).

Why: a register tile is indexed by its own lanes; a computed flat index of another tile's
lanes is a register gather/scatter, which Triton cannot express, while the reshaped buffer is
an ordinary tile of the Parallel's shape - also one whose extents are not powers of two (576),
which a flat reshape of padded tiles (ir/padding.py) would not preserve.
"""
from __future__ import annotations

import dataclasses
from math import prod

from tritile.ir import nodes as ir
from tritile.ir.affine import affine
from tritile.ir.transform import Transformer, substitute_vars, walk


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    shapes = _reshapes(func.kernel.body)
    if not shapes:
        return func
    body = _Rewrite(shapes).transform(func.kernel.body)
    return dataclasses.replace(func, kernel=dataclasses.replace(func.kernel, body=body))


def _row_major(vars_, extents) -> dict:
    """{var: its stride} in the row-major order of a Parallel's variables."""
    strides, acc = {}, 1
    for var, extent in zip(reversed(vars_), reversed(extents)):
        strides[var] = acc
        acc *= extent
    return strides


def _is_linearisation(index, par: ir.Parallel) -> bool:
    terms = affine(index)
    return terms is not None and terms[1] == 0 and terms[0] == _row_major(par.vars, par.extents)


def _linearisation(vars_, extents):
    strides = _row_major(vars_, extents)
    out = None
    for var in vars_:
        term = var if strides[var] == 1 else ir.BinOp("*", var, ir.Const(strides[var]), var.dtype)
        out = term if out is None else ir.BinOp("+", out, term, var.dtype)
    return out


def _reshapes(body) -> dict:
    """{flat buffer: the shape it takes} for the buffers the contract above rewrites."""
    candidates = {n.buffer for n in walk(body) if isinstance(n, ir.Alloc) and n.buffer.scope in ("fragment", "local")
                  and len(n.buffer.shape) == 1 and isinstance(n.buffer.shape[0], int)}
    shapes, refused = {}, set()
    seen = set()  # ids of the Loads / Stores met inside T.Parallel loops
    for par in (n for n in walk(body) if isinstance(n, ir.Parallel)):
        for node in walk(par.body):
            if not (isinstance(node, (ir.Load, ir.Store)) and node.buffer in candidates):
                continue
            seen.add(id(node))
            buf, (index,) = node.buffer, node.indices
            if len(par.vars) >= 2 and prod(par.extents) == buf.shape[0] and _is_linearisation(index, par):
                if shapes.setdefault(buf, tuple(par.extents)) != tuple(par.extents):
                    refused.add(buf)
            elif not (isinstance(node, ir.Load) and len(par.vars) == 1 and index is par.vars[0]
                      and par.extents[0] == buf.shape[0]):
                refused.add(buf)
    for node in walk(body):  # an access outside the loops above, or a tile op on the buffer
        for buf in candidates:
            if (isinstance(node, (ir.Load, ir.Store)) and node.buffer is buf and id(node) not in seen) or \
                    (isinstance(node, ir.Region) and node.buffer is buf):
                refused.add(buf)
    return {buf: shape for buf, shape in shapes.items() if buf not in refused}


class _Rewrite(Transformer):
    def __init__(self, shapes: dict):
        self.shapes = shapes
        self.buffers = {buf: dataclasses.replace(buf, shape=shape) for buf, shape in shapes.items()}

    def visit_Parallel(self, par: ir.Parallel):
        flat_reads = [n for n in walk(par.body) if isinstance(n, ir.Load) and n.buffer in self.shapes]
        if len(par.vars) == 1 and flat_reads:
            # a 1-D Parallel over a flat buffer: over the buffer's new shape, its var linearised
            extents = self.shapes[flat_reads[0].buffer]
            var = par.vars[0]
            new_vars = tuple(ir.Var(f"{var.name}_{k}", var.dtype) for k in range(len(extents)))
            body = substitute_vars(par.body, {var: _linearisation(new_vars, extents)})
            par = dataclasses.replace(par, vars=new_vars, extents=tuple(extents), body=body)
        return dataclasses.replace(par, body=_ReshapedAccesses(self, par).transform(par.body))

    def visit_Alloc(self, alloc: ir.Alloc):
        new = self.buffers.get(alloc.buffer)
        return dataclasses.replace(alloc, buffer=new) if new is not None else alloc


class _ReshapedAccesses(Transformer):
    """Inside one Parallel: the flat buffers' accesses at the linearised index -> the vars."""

    def __init__(self, rewrite: _Rewrite, par: ir.Parallel):
        self.rewrite, self.par = rewrite, par

    def _reshaped(self, node):
        new = self.rewrite.buffers.get(node.buffer)
        if new is None:
            return node
        return dataclasses.replace(node, buffer=new, indices=tuple(self.par.vars))

    visit_Load = visit_Store = _reshaped

