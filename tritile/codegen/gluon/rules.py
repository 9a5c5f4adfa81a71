"""Per-node lowering rules of the Gluon backend, registered in ONE table each.

`RULES[ir.Copy] = lower_copy` etc. for statements, `EXPR_RULES` for expressions.  A rule
gets the shared `Emitter` and the node and emits lines; a node kind without a rule, or a
rule meeting a case it cannot lower, raises `CompileError` at the node's location
("... is not supported by the Gluon backend yet").  Rules assume layout inference ran
(they read `Buffer.layout`) and that instruction choice comes from `instructions.py`.
"""
from __future__ import annotations

import math
import os

from tritile.codegen import gemm_accumulators, semantics
from tritile.ir import instructions as isel
from tritile.codegen.gluon import early_loads, rings, tma_reduce, warp_specialize
from tritile.codegen.gluon.emitter import (GL_DTYPES, Emitter, ParallelContext, buffers_touched, broadcast_text,
                                           unsupported)
from tritile.codegen.semantics import Val, cast_text, lane_loop_bounds
from tritile.codegen.source_writer import static_int, unrolled
from tritile.errors import CompileError
from tritile.ir import layouts as lay
from tritile.ir import nodes as ir
from tritile.ir.padding import is_padded, padded, padded_shape
from tritile.ir.transform import walk
from tritile.lowering.shared_memory_budget import allocated_at_once_bytes

# ======================================================================================
# expressions
# ======================================================================================


def _identity(indices, par) -> bool:
    return len(indices) == len(par.loop.vars) and all(a is b for a, b in zip(indices, par.loop.vars))


def _refuse_bool_tile(buf: ir.Buffer):
    """Tiles of a bool shared buffer - T.copy to or from it, T.Parallel over it - fail in Triton
    3.6 (an MLIR pass, or an abort of the process); its elements one at a time (T.serial, as
    TileLang's any_of test fills one) are fine."""
    if buf.scope == "shared" and buf.dtype.kind == "bool":
        raise unsupported(f"a tile of bool shared buffer {buf.name} (T.copy or T.Parallel; T.uint8 holds the "
                          f"same bytes)", None)


def _parallel_tile_view(em: Emitter, buf: ir.Buffer, indices, par):
    """The view of shared `buf` whose elements T.Parallel's lanes read or write at `indices`, or
    None: dim d indexed by the loop's d-th variable plus an offset that is a constant or a
    consumer partition's own first row (lowering/consumer_partitions.py turns ``x[i, j]`` over
    a tile's rows into ``x[i + part * rows, j]`` over the partition's rows) - the whole tile,
    or a slice of it."""
    _refuse_bool_tile(buf)
    lead = 1 if buf.num_versions > 1 else 0
    dims = indices[lead:]
    if len(dims) != len(par.loop.vars):
        return None
    view = em.name(buf) + (f".index({em.expr(indices[0]).text})" if lead else "")
    for pos, (index, var, extent, full) in enumerate(zip(dims, par.loop.vars, par.loop.extents, buf.tile_shape)):
        offset = semantics.offset_from(index, var)
        if offset is None:
            return None
        start = static_int(offset)
        if start is None:
            if not em.per_partition(offset):
                return None
            start = em.expr(offset).text
        elif start < 0 or start + extent > full:
            return None
        if start == 0 and extent == full:
            continue
        view += f".slice({start}, {extent}, {pos})"
    return view


def _e_load(em: Emitter, e: ir.Load) -> Val:
    buf, par = e.buffer, em.par
    if buf.scope == "var" or (buf.scope == "local" and all(s == 1 for s in buf.shape)):
        return Val(em.name(buf))
    if buf.scope == "global":
        idx = [em.expr(i) for i in e.indices]
        strides = em.strides(buf)
        offs = " + ".join(i.text if s == "1" else f"{i.text} * ({s})" for i, s in zip(idx, strides))
        dims = frozenset().union(*[i.dims for i in idx])
        if not dims:
            return Val(f"gl.load({em.name(buf)} + {offs})")
        mask = semantics.bounds_mask(em, e.indices, idx, buf)
        return Val(f"gl.load({em.name(buf)} + {offs}, mask={mask}, other={semantics.out_of_bounds_literal(buf)})", dims)
    if buf.scope == "local":
        index = _local_index(em, buf, e.indices, None)
        return Val(semantics.picked_element_text("gl", em.name(buf), _local_lanes(em, buf), index, buf.dtype))
    if buf.scope == "fragment" and all(n == 1 for n in buf.shape):
        # a one-element fragment (a `T.reduce_*` result, TileLang's alloc_fragment((1,))) read
        # anywhere: its value, as a scalar (max of one element: itself, NaN and -0.0 included),
        # in the fragment's own dtype (gl.max widens narrower types)
        flat = em.name(buf) if len(buf.shape) == 1 else f"gl.reshape({em.name(buf)}, [1])"
        wide = semantics.reduction_dtype(buf.dtype)
        return Val(cast_text(f"gl.max({cast_text(flat, buf.dtype, wide, 'gl')}, axis=0)", wide, buf.dtype, "gl"))
    if buf.scope == "fragment":
        split = _lane_dims(em, buf, e.indices)
        if split is not None:
            axes, picks = split
            if picks:  # a row / column / element at indices the same for every lane
                text, layout = _selected(em, buf, picks)
                return _on_parallel(em, text, layout, axes) if axes else Val(text)
            return _on_parallel(em, em.name(buf), em.buffer_layout(buf), axes)
        order = _permutation(e.indices, par)
        if order is not None and tuple(buf.shape) == tuple(par.loop.extents[k] for k in _inverse(order)):
            # x[j, i] in T.Parallel(i, j) (T.transpose): the tile permuted, in the loop's layout
            return Val(f"gl.convert_layout(gl.permute({em.name(buf)}, {order}), {par.layout_name})",
                       frozenset(range(len(order))))
    if par is None:
        raise unsupported(f"an element read of {buf.scope} buffer {buf.name} outside T.Parallel", None)
    lead = 1 if buf.num_versions > 1 else 0
    if buf.scope == "shared" and len(buf.tile_shape) == 1 and len(par.loop.vars) == 2:
        # a vector indexed by loop var k broadcasts along the other dim: read it in the
        # loop layout's slice and expand
        for k, var in enumerate(par.loop.vars):
            if e.indices[lead] is var and buf.tile_shape[0] == par.loop.extents[k]:
                view = em.name(buf) + (f".index({em.expr(e.indices[0]).text})" if lead else "")
                return _expanded(f"{view}.load({_slice_name(em, par, 1 - k)})", k)
    view = _parallel_tile_view(em, buf, e.indices, par) if buf.scope == "shared" else None
    if view is not None:
        return Val(f"{view}.load({par.layout_name})", frozenset(range(len(par.loop.vars))))
    order = _permutation(e.indices[lead:], par) if buf.scope == "shared" else None
    if order is not None and tuple(buf.tile_shape) == tuple(par.loop.extents[k] for k in _inverse(order)):
        # x[j, i] in T.Parallel(i, j) (T.transpose): a permuted view of the shared tile
        view = em.name(buf) + (f".index({em.expr(e.indices[0]).text})" if lead else "")
        return Val(f"{view}.permute({order}).load({par.layout_name})", frozenset(range(len(order))))
    raise unsupported(f"this indexing of {buf.scope} buffer {buf.name} inside T.Parallel", None)


def _permutation(indices, par):
    """For indices that are the current Parallel's loop variables in another order: the
    permutation putting the buffer's dims into the loop's order (dim `order[k]` runs along
    loop axis k), else None."""
    if par is None or len(indices) != len(par.loop.vars) or {id(i) for i in indices} != {id(v) for v in par.loop.vars}:
        return None
    return [next(d for d, index in enumerate(indices) if index is var) for var in par.loop.vars]


def _inverse(order) -> list:
    """The loop axis along which each buffer dim runs."""
    return [order.index(d) for d in range(len(order))]


def _lane_dims(em: Emitter, buf: ir.Buffer, indices):
    """How fragment `buf` indexed by `indices` maps onto the lanes of the current T.Parallel (if
    any): (the Parallel axis of each dim indexed by a loop variable of the dim's extent, in the
    loop's order; (dim, index text) of the dims indexed the same for every lane), or None when
    some index varies along the lanes otherwise (a gather)."""
    par = em.par
    axes, picks = [], []
    for d, index in enumerate(indices):
        if par is not None and isinstance(index, ir.Var) and index in par.index:
            axis = par.loop.vars.index(index)
            if par.loop.extents[axis] != buf.shape[d] or (axes and axis <= axes[-1]):
                return None
            axes.append(axis)
            continue
        k = em.expr(index)
        if k.dims:
            return None
        picks.append((d, k.text))
    return axes, picks


def _axis_lanes(em: Emitter, shape, layout_name: str, axis: int) -> str:
    """The lane indices along `axis` of a register tile of padded `shape` in `layout_name`,
    broadcastable to the tile (rank 1 or 2)."""
    if len(shape) == 1:
        return f"gl.arange(0, {shape[0]}, layout={layout_name})"
    if len(shape) != 2:
        raise unsupported(f"a {len(shape)}-D fragment indexed at one index along some dims", None)
    sl = em.layout_name(f"gl.SliceLayout({1 - axis}, {layout_name})")
    return f"gl.arange(0, {shape[axis]}, layout={sl}){'[:, None]' if axis == 0 else '[None, :]'}"


def _selection_masks(em: Emitter, buf: ir.Buffer, picks: list) -> list:
    """The lane tests selecting, in fragment `buf`'s register tile, index text `k` along dim `d`
    for each (d, k) of `picks` (codegen/semantics.py's `selected_text` / `written_text`)."""
    shape = padded_shape(buf.shape)
    lname = em.layout_name(em.buffer_layout(buf), em.name(buf))
    return [f"({_axis_lanes(em, shape, lname, d)} == {k})" for d, k in picks]


def _selected(em: Emitter, buf: ir.Buffer, picks: list) -> tuple:
    """(text, layout) of fragment `buf` at the indices `picks` along their dims: the tile of its
    other dims, in the buffer layout's slice."""
    dims = [d for d, _ in picks]
    text = semantics.selected_text("gl", em.name(buf), _selection_masks(em, buf, picks), dims, buf.dtype)
    return text, _row_layout(em, buf, dims)


def _range_masks(em: Emitter, buf: ir.Buffer, ranges: list) -> list:
    """The lane tests of static `ranges` (semantics.static_ranges) of fragment `buf`."""
    shape = padded_shape(buf.shape)
    lname = em.layout_name(em.buffer_layout(buf), em.name(buf))
    return semantics.range_masks([_axis_lanes(em, shape, lname, d) for d, _, _ in ranges], ranges)


def _selected_range(em: Emitter, buf: ir.Buffer, ranges: list) -> str:
    """Fragment `buf` in static `ranges`: a tile in the layout its reshape gives."""
    return semantics.range_selected_text("gl", em.name(buf), padded_shape(buf.shape), _range_masks(em, buf, ranges),
                                         ranges, buf.dtype)


def _row_layout(em: Emitter, buf: ir.Buffer, dims: list):
    """The layout of fragment `buf`'s tile without `dims`: the buffer layout's slice."""
    layout = em.buffer_layout(buf)
    for d in sorted(dims, reverse=True):
        layout = lay.slice_of(layout, d)
    return layout


def _slice_name(em: Emitter, par, dim: int) -> str:
    return em.layout_name(f"gl.SliceLayout({dim}, {par.layout_name})")


def _expanded(text: str, axis: int) -> Val:
    """A vector in the slice of a 2-D Parallel's layout along its other axis, expanded along it."""
    return Val(f"{text}[:, None]" if axis == 0 else f"{text}[None, :]", frozenset([axis]))


def _on_parallel(em: Emitter, text: str, layout, axes: list) -> Val:
    """Register tile `text` (in `layout`) whose dims run along the current Parallel's `axes`, as a
    tile broadcastable to the Parallel's shape: converted to its layout, or - a vector in a 2-D
    Parallel - to the slice along the other axis, and expanded."""
    par = em.par
    if len(axes) == len(par.loop.vars):
        return Val(_convert(em, text, layout, par.layout, par.layout_name), frozenset(axes))
    if len(axes) != 1 or len(par.loop.vars) != 2:
        raise unsupported(f"a {len(axes)}-D tile read inside a {len(par.loop.vars)}-D T.Parallel", None)
    other = 1 - axes[0]
    return _expanded(_convert(em, text, layout, lay.slice_of(par.layout, other), _slice_name(em, par, other)), axes[0])


def _e_table_read(em: Emitter, e: ir.TableRead) -> Val:
    index = em.expr(e.index)
    if index.dims:
        raise unsupported("a constant-table read indexed by a T.Parallel loop variable", None)
    return Val(f"gl.load({em.tables[id(e.table)][0]} + {index.text})")


def _convert(em, text, have, want, want_name) -> str:
    return text if str(have) == str(want) else f"gl.convert_layout({text}, {want_name})"


def _e_cast(em: Emitter, e: ir.Cast) -> Val:
    """`semantics.lower_cast`; a scalar computed from constants, block indices and loop counters
    only is cast as a tensor: a `gl.static_range` counter (`T.unroll`) is a Python int, which has
    no `.to` (`gl.to_tensor` of a tensor is the tensor)."""
    if isinstance(e.value, ir.Const) or any(isinstance(n, (ir.Load, ir.TableRead)) for n in walk(e.value)):
        return semantics.lower_cast(em, e)
    v = em.expr(e.value)
    text = v.text if v.dims else f"gl.to_tensor({v.text})"
    return Val(cast_text(text, e.value.dtype, e.dtype, "gl"), v.dims)


# Var, Load and TableRead: where data lives is the backend's (a scalar Cast: whether its operand
# may be a Python int); the scalar meaning of the other expression nodes is codegen/semantics.py's,
# shared with the triton.language backend
EXPR_RULES = {ir.Load: _e_load, ir.TableRead: _e_table_read, ir.Cast: _e_cast}


def lower_expr(em: Emitter, e) -> Val:
    return semantics.lower_scalar_expr(em, e, EXPR_RULES)


# ======================================================================================
# statements
# ======================================================================================


def lower_stmt(em: Emitter, s):
    rule = RULES.get(type(s))
    if rule is None:
        raise unsupported(type(s).__name__, getattr(s, "loc", None))
    if not isinstance(s, (ir.Gemm, ir.WaitMMA, ir.For, ir.While, ir.Seq, ir.If, ir.ConsumerPartitions)):
        em.settle([b for b in buffers_touched(s)])
    try:
        rule(em, s)
    except CompileError as err:  # a rule meeting an unsupported case without its own location
        if err.loc is None and getattr(s, "loc", None) is not None:
            raise CompileError(err.message, s.loc) from None
        raise


def lower_seq(em: Emitter, s: ir.Seq):
    em.body(s)


def emit_shared_alloc(em: Emitter, buf: ir.Buffer):
    for line in em.shared_alloc(buf):
        em.emit(line)


def lower_alloc(em: Emitter, s: ir.Alloc):
    buf = s.buffer
    if buf.view_of is not None:  # reinterpreted bits (lowering/buffer_views.py rewrote the reshapes)
        raise unsupported(f"T.view of {buf.view_of.scope} buffer {buf.view_of.name} as {buf.dtype} (it holds "
                          f"{buf.view_of.dtype}: its bits reinterpreted in registers)", s.loc)
    name = em.name(buf)
    dt = GL_DTYPES[buf.dtype.name]
    if buf.scope == "var" or (buf.scope == "local" and all(d == 1 for d in buf.shape)):
        init = em.expr(s.init).text if s.init is not None else "0"
        em.emit(f"{name} = gl.to_tensor({init}).to({dt})")
    elif buf.scope == "shared":
        if id(buf) in em.hoisted:
            em.emit(f"# {name}: allocated before the warp-specialized fork")
        elif id(buf) not in em.deferred_buffers:  # else allocated at its first use (shared_lifetimes.py)
            emit_shared_alloc(em, buf)
    elif buf.scope == "fragment":  # padded to powers of two, pad lanes 0 (ir/padding.py)
        layout = em.layout_name(em.buffer_layout(buf), name)
        em.emit(f"{name} = gl.zeros({padded_shape(buf.shape)}, {dt}, layout={layout})")
    elif buf.scope == "local":
        if not all(isinstance(d, int) for d in buf.shape):
            raise unsupported(f"T.alloc_local with a runtime shape {list(buf.shape)}", s.loc)
        em.emit(f"{name} = gl.zeros([{semantics.local_array_lanes(buf)}], {dt}, layout={_local_layout(em, buf)})")
    else:
        raise unsupported(f"an allocation in {buf.scope} scope ({buf.name})", s.loc)


# A `T.alloc_local` array of several elements is a 1-D tensor of its flattened elements (padded
# to a power of two), as on the triton.language backend: an element is read by a masked sum and
# written by a select over the lanes (codegen/semantics.py), at lane-independent indices.


def _local_layout(em: Emitter, buf: ir.Buffer) -> str:
    return em.layout_name(lay.blocked_for([semantics.local_array_lanes(buf)], 32, em.num_warps))


def _local_lanes(em: Emitter, buf: ir.Buffer) -> str:
    return f"gl.arange(0, {semantics.local_array_lanes(buf)}, layout={_local_layout(em, buf)})"


def _local_index(em: Emitter, buf: ir.Buffer, indices, loc) -> str:
    idx = [em.expr(i) for i in indices]
    if any(i.dims for i in idx):
        raise unsupported(f"indexing local array {buf.name} by a T.Parallel variable (registers have no gather "
                          f"or scatter)", loc)
    return semantics.flat_index_text(buf.shape, idx)


def lower_consumer_partitions(em: Emitter, s: ir.ConsumerPartitions):
    """The body of the consumer function, which every consumer partition runs with its own
    `s.var` (a parameter: warp_specialize.emit_fork launches one partition per value)."""
    if em.partitions is None:
        raise CompileError("consumer partitions need the warp-specialized fork, which this kernel did not get; "
                           "set TRITILE_CONSUMER_PARTITIONS=0", s.loc)
    em.define(s.var)
    em.body(s.body)


def lower_let(em: Emitter, s: ir.Let):
    v = em.expr(s.value)
    em.let_dims[id(s.var)] = v.dims  # inside T.Parallel a name may stand for a tile (row = by * 32 + i)
    em.emit(f"{em.define(s.var)} = {v.text}")
    for buf in em.address_tensors.get(id(s.var), ()):  # T.make_tensor: a pointer from the address,
        # 16-byte aligned as every tensor argument (the interpreter checks it)
        em.emit(f"{em.name(buf)} = gl.multiple_of({em.name(s.var)}.to(gl.pointer_type({GL_DTYPES[buf.dtype.name]})), 16)")


def _scalar_assign(em, buf, value_expr):
    v = em.expr(value_expr)
    dt = GL_DTYPES[buf.dtype.name]
    em.emit(f"{em.name(buf)} = gl.to_tensor({v.text}).to({dt})")


def lower_store(em: Emitter, s: ir.Store):
    buf, par = s.buffer, em.par
    if buf.scope == "var" or (buf.scope == "local" and all(d == 1 for d in buf.shape)):
        if par is not None:
            raise unsupported(f"assigning scalar {buf.name} inside T.Parallel", s.loc)
        return _scalar_assign(em, buf, s.value)
    v = em.expr(s.value)
    dt = GL_DTYPES[buf.dtype.name]
    if buf.scope == "global":
        idx = [em.expr(i) for i in s.indices]
        strides = em.strides(buf)
        offs = " + ".join(i.text if st == "1" else f"{i.text} * ({st})" for i, st in zip(idx, strides))
        dims = frozenset().union(v.dims, *[i.dims for i in idx])
        if par is None or not dims:
            if par is not None and par.cond:  # one address and value, stored where some lane's condition holds
                raise unsupported(f"a store to one element of {buf.name} under a condition inside T.Parallel", s.loc)
            value = f"gl.to_tensor({v.text}).to({dt})"
            em.emit(f"gl.store({em.name(buf)} + {offs}, {value})")
            return
        value = _full(v, s.value.dtype, buf.dtype, par)
        mask = semantics.bounds_mask(em, s.indices, idx, buf)
        if par.write_mask:
            mask += f" & {par.write_mask}"
        em.emit(f"gl.store({em.name(buf)} + {offs}, {value}, mask={mask})")
        return
    if buf.scope == "local":
        if par is not None and (v.dims or par.write_mask):  # every lane would write the element
            raise unsupported(f"a lane-dependent write to one element of local array {buf.name}", s.loc)
        index = _local_index(em, buf, s.indices, s.loc)
        value = f"gl.to_tensor({v.text}).to({dt})"
        em.emit(f"{em.name(buf)} = "
                f"{semantics.written_element_text('gl', em.name(buf), _local_lanes(em, buf), index, value)}")
        return
    if buf.scope == "fragment":
        split = _lane_dims(em, buf, s.indices)
        if split is not None and split[1]:  # a row / column / element at indices the same for every lane
            return _write_selected(em, s, v, *split)
    if par is None:
        raise unsupported(f"an element write to {buf.scope} buffer {buf.name} outside T.Parallel", s.loc)
    lead = 1 if buf.num_versions > 1 else 0
    if buf.scope == "fragment" and _identity(s.indices, par) and tuple(buf.shape) == tuple(par.loop.extents):
        value = _full(v, s.value.dtype, buf.dtype, par)
        have = em.buffer_layout(buf)
        value = _convert(em, value, par.layout, have, em.layout_name(have, em.name(buf)))
        if par.write_mask:  # the `if`s inside the loop, and the pad lanes (ir/padding.py) keep their value
            cond = _convert(em, _full_bool(em, par.write_mask, par), par.layout, have, em.layout_name(have))
            value = f"gl.where({cond}, {value}, {em.name(buf)})"
        em.emit(f"{em.name(buf)} = {value}")
        return
    view = _parallel_tile_view(em, buf, s.indices, par) if buf.scope == "shared" else None
    if view is not None:
        value = _full(v, s.value.dtype, buf.dtype, par)
        if par.write_mask:
            value = f"gl.where({_full_bool(em, par.write_mask, par)}, {value}, {view}.load({par.layout_name}))"
        em.emit(f"{view}.store({value})")
        _after_generic_shared_write(em)
        return
    order = _permutation(s.indices[lead:], par)
    if order is not None and tuple(buf.tile_shape) == tuple(par.loop.extents[k] for k in _inverse(order)):
        return _write_permuted(em, s, v, order)
    raise unsupported(f"this indexing of {buf.scope} buffer {buf.name} inside T.Parallel", s.loc)


def _write_permuted(em: Emitter, s: ir.Store, v: Val, order: list):
    """`y[j, i] = value` in T.Parallel(i, j): the loop's tile permuted into the buffer's order -
    stored through a permuted view of a shared tile, or `gl.permute`d and converted into a
    fragment's layout; lanes the loop's `if`s leave out keep their values."""
    buf, par = s.buffer, em.par
    value = _full(v, s.value.dtype, buf.dtype, par)
    if buf.scope == "shared":
        lead = 1 if buf.num_versions > 1 else 0
        view = em.name(buf) + (f".index({em.expr(s.indices[0]).text})" if lead else "") + f".permute({order})"
        if par.write_mask:
            value = f"gl.where({_full_bool(em, par.write_mask, par)}, {value}, {view}.load({par.layout_name}))"
        em.emit(f"{view}.store({value})")
        _after_generic_shared_write(em)
        return
    if par.write_mask:
        old = f"gl.convert_layout(gl.permute({em.name(buf)}, {order}), {par.layout_name})"
        value = f"gl.where({_full_bool(em, par.write_mask, par)}, {value}, {old})"
    want = em.buffer_layout(buf)
    em.emit(f"{em.name(buf)} = gl.convert_layout(gl.permute({value}, {_inverse(order)}), "
            f"{em.layout_name(want, em.name(buf))})")


def _write_selected(em: Emitter, s: ir.Store, v: Val, axes: list, picks: list):
    """Fragment `s.buffer` written at the indices `picks` along their dims, and along its other
    dims by the current Parallel's lanes (`axes`, one element per lane) - or one element, by a
    value the same for every lane: a select of those lanes of the register tile."""
    buf, par = s.buffer, em.par
    dt = GL_DTYPES[buf.dtype.name]
    masks = _selection_masks(em, buf, picks)
    if not axes:
        if par is not None and (v.dims or par.write_mask):  # every lane would write the element
            raise unsupported(f"a lane-dependent write to one element of fragment {buf.name}", s.loc)
        value = f"gl.to_tensor({v.text}).to({dt})"
    else:
        if len(axes) != len(par.loop.vars):
            raise unsupported(f"a write to fragment {buf.name} that does not cover a row once per T.Parallel lane",
                              s.loc)
        value = _onto_row(em, buf, picks, _full(v, s.value.dtype, buf.dtype, par))
        if par.write_mask:  # the `if`s inside the loop and its pad lanes keep the tile's values
            masks.append(_onto_row(em, buf, picks, _full_bool(em, par.write_mask, par)))
    em.emit(f"{em.name(buf)} = {semantics.written_text('gl', em.name(buf), masks, value)}")


def _onto_row(em: Emitter, buf: ir.Buffer, picks: list, tile: str) -> str:
    """A tile of the current Parallel's shape (in its layout) as the lanes of fragment `buf` at
    the indices `picks` along their dims: in the layout of that row (the buffer layout's slice),
    expanded along the picked dims, so that it broadcasts onto the buffer's register tile."""
    row = _row_layout(em, buf, [d for d, _ in picks])
    text = _convert(em, tile, em.par.layout, row, em.layout_name(row))
    for d, _ in sorted(picks):
        text = f"gl.expand_dims({text}, {d})"
    return text


def _full(v: Val, src_dtype, dst_dtype, par) -> str:
    """`v` as a tensor of the Parallel's full shape and layout, cast to `dst_dtype`."""
    full = frozenset(range(len(par.loop.vars)))
    if v.dims == full:
        return cast_text(v.text, src_dtype, dst_dtype, "gl")
    return broadcast_text(f"gl.to_tensor({v.text})", src_dtype, dst_dtype, padded_shape(par.loop.extents),
                          par.layout_name)


def _full_bool(em, cond_text, par) -> str:
    zeros = f"gl.zeros({padded_shape(par.loop.extents)}, gl.int1, layout={par.layout_name})"
    return f"({zeros} | {cond_text})"


def _after_generic_shared_write(em):
    # generic-proxy smem writes must be fenced before wgmma / TMA (async proxy) read them
    if em.target.has_wgmma:
        em.emit("fence_async_shared()")


# ---------------------------------------------------------------- T.Parallel


def lower_parallel(em: Emitter, s: ir.Parallel):
    if em.par is not None:
        raise unsupported("nested T.Parallel", s.loc)
    rank = len(s.vars)
    extents = list(s.extents)
    if rank not in (1, 2) or not all(isinstance(e, int) and e > 0 for e in extents):
        raise unsupported(f"T.Parallel{tuple(extents)} (rank 1-2, static extents)", s.loc)
    layout, hint = None, None
    for node in _walk_stmts(s.body):
        if isinstance(node, ir.Store) and node.buffer.scope == "fragment" and tuple(node.buffer.shape) == tuple(extents) \
                and len(node.indices) == rank and all(a is b for a, b in zip(node.indices, s.vars)):
            layout, hint = em.buffer_layout(node.buffer), em.name(node.buffer)
            break
    if layout is None:
        layout = lay.blocked_for(padded_shape(extents), 32, em.num_warps)
    lname = em.layout_name(layout, hint)
    par = ParallelContext(s, lname, layout)
    for k, (var, ext) in enumerate(zip(s.vars, extents)):
        # an extent that is not a power of two runs on the next one, the lanes past it
        # masked off: they may read, never write (ir/padding.py)
        name, lanes = em.name(var), padded(ext)
        if rank == 1:
            em.emit(f"{name} = gl.arange(0, {lanes}, layout={lname})")
            par.index[var] = name
        else:
            sl = em.layout_name(f"gl.SliceLayout({1 - k}, {lname})")
            em.emit(f"{name} = gl.arange(0, {lanes}, layout={sl})")
            par.index[var] = f"{name}[:, None]" if k == 0 else f"{name}[None, :]"
        if lanes != ext:
            inside = f"({par.index[var]} < {ext})"
            par.inside = inside if par.inside is None else f"({par.inside} & {inside})"
    em.par = par
    try:
        em.body(s.body)
    finally:
        em.par = None


def _walk_stmts(seq):
    stack = list(reversed(seq.stmts))
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, ir.Seq):
            stack.extend(reversed(n.stmts))
        elif isinstance(n, ir.If):
            stack.extend(reversed(n.then_body.stmts + (n.else_body.stmts if n.else_body else [])))


# ---------------------------------------------------------------- control flow


def lower_if(em: Emitter, s: ir.If):
    if em.partitions is not None and not (s.else_body and s.else_body.stmts) and s.then_body.stmts and all(
            isinstance(c, ir.AsyncCopy) and rings.served_by_tma(em, c) for c in s.then_body.stmts):
        # copies the producer issues (predicated by this condition): the consumers' part, the
        # release of the slot, holds whether or not they run, and a group whose last copy is
        # guarded off still frees its slot for the producer's next group (emit_release drops
        # the releases of groups the producer never fills)
        for c in s.then_body.stmts:
            warp_specialize.emit_release(em, c)
        return
    cond = em.expr(s.cond)
    if em.par is not None:
        outer = em.par.cond
        both = cond.text if outer is None else f"({outer} & {cond.text})"
        em.par.cond = both
        em.body(s.then_body)
        if s.else_body is not None and s.else_body.stmts:
            neg = f"({cond.text} == 0)"
            em.par.cond = neg if outer is None else f"({outer} & {neg})"
            em.body(s.else_body)
        em.par.cond = outer
        return
    entry, entry_inflight = set(em.tokens), set(em.inflight)
    em.emit(f"if {cond.text}:")
    _branch(em, s.then_body, entry)
    inflight = em.inflight  # in flight after the if: after either branch (a wait in one retires nothing in the other)
    if s.else_body is not None and s.else_body.stmts:
        em.inflight = set(entry_inflight)
        em.emit("else:")
        _branch(em, s.else_body, entry)
    else:
        em.inflight = entry_inflight
    em.inflight |= inflight


def _branch(em: Emitter, body, entry: set):
    """Emit one branch of an `if`; at its end every accumulator is a wgmma token exactly
    when it was one before the `if` (both branches must yield the same types)."""
    em.depth += 1
    em.issued = []  # the other branch may have issued or retired differently
    em.body(body)
    em.issued = []
    for buf in sorted(em.tokens - entry, key=em.name):
        em.wait_mma(0, [buf])
    for buf in sorted(entry - em.tokens, key=em.name):
        n = em.name(buf)
        em.emit(f"{n} = warpgroup_mma_init({n})")
    em.tokens = set(entry)
    em.depth -= 1


def _loop(em: Emitter, header: str, body):
    """Emit a loop whose body may leave async wgmmas pending.  The body is emitted under
    the loop-carried state (what is pending at its start is what its end leaves pending,
    joined with the state before the loop), re-emitting until that is a fixed point;
    accumulators carried as wgmma tokens are wrapped with warpgroup_mma_init before the
    loop and re-wrapped at the end of the body where the body waited on them."""
    entry_tokens, entry_inflight = set(em.tokens), set(em.inflight)
    tokens, inflight = set(entry_tokens), set(entry_inflight)
    retire_at_end = _retires_all_before_issuing(body)
    at = len(em.lines)
    for _ in range(4):
        del em.lines[at:]
        em.tokens, em.inflight = set(tokens), set(inflight)
        em.emit(header)
        em.depth += 1
        em.issued = []  # wgmmas of the previous iteration interleave with those before the loop
        em.body(body)
        if retire_at_end:
            lower_wait_mma(em, ir.WaitMMA(0))
        em.depth -= 1
        if em.tokens <= tokens and em.inflight <= inflight:
            break
        tokens |= em.tokens
        inflight |= em.inflight
    em.depth += 1
    for buf in sorted(tokens - em.tokens, key=em.name):
        n = em.name(buf)
        em.emit(f"{n} = warpgroup_mma_init({n})")
    em.depth -= 1
    prefix = ["    " * em.depth + f"{em.name(b)} = warpgroup_mma_init({em.name(b)})"
              for b in sorted(tokens - entry_tokens, key=em.name)]
    em.lines[at:at] = prefix
    em.tokens, em.inflight = tokens, inflight | em.inflight
    em.issued = []


def _retires_all_before_issuing(body) -> bool:
    """Whether an iteration waits for every wgmma in flight before it issues one of its own.

    Such a loop retires its wgmmas at the end of the body instead of at the start of the
    next iteration: a wgmma left in flight across the back edge made ptxas serialize every
    wgmma of causal attention's kernels - the split one (C7512, "insufficient register
    resources", under setmaxnreg) and, once its mask moved after QK^T (accumulator_init),
    the one-warpgroup one too (C7515, "non wgmma instructions defining accumulator registers"
    in flight).  The wait it moves past is only the next iteration's barrier wait (and, in
    a kernel without a producer warp, its TMA issue, which has to follow the wait anyway: the
    copies refill the slot that wgmma reads)."""
    for s in getattr(body, "stmts", [body]):
        if isinstance(s, ir.WaitMMA):
            return s.pending == 0
        if any(isinstance(n, ir.Gemm) for n in walk(s)):
            return False
    return False


def lower_for(em: Emitter, s: ir.For):
    if em.par is not None:
        return _lane_loop(em, s)
    if s.var is em.tile_loop_var:
        return _persistent_tile_loop(em, s)
    ring = em.ring_owner.get(id(s))
    start, stop, step = em.expr(s.start).text, em.expr(s.stop).text, em.expr(s.step).text
    st = static_int(s.step)
    if unrolled(s):
        rng = f"gl.static_range({start}, {stop}, {step})"
    else:
        rng = f"range({start}, {stop})" if st == 1 else f"range({start}, {stop}, {step})"
    if ring is not None and ring.has_tma:
        em.emit(f"# software-pipelined loop ({ring.stages} stages), mbarrier ring {ring.name}")
    _loop(em, f"for {em.define(s.var)} in {rng}:", s.body)


def _lane_loop(em: Emitter, s: ir.For):
    """A serial loop inside T.Parallel (semantics.lane_loop_bounds)."""
    start, stop, step = lane_loop_bounds(em, s)
    rng = "gl.static_range" if unrolled(s) else "range"
    _loop(em, f"for {em.define(s.var)} in {rng}({start}, {stop}, {step}):", s.body)


def _persistent_tile_loop(em: Emitter, s: ir.For):
    """The tile loop of lowering/persistent_tiles.py: staging tiles of TMA stores are
    allocated before it, the last tile's stores are waited for after it, and the phase bits
    of the rings living across it start at 0 before it."""
    em.emit(f"# persistent tiles: {em.func.attrs['persistent_programs']} programs take the tiles round by round")
    for ring in em.tile_rings:  # a tensor, so that the loop may carry it
        em.emit(f"{em.define(ring.phase_bits)} = gl.to_tensor(0)")
    at, em.tile_loop_depth = len(em.lines), em.depth
    em.tile_loop_prefix = {}  # (dtype, shape, layout) -> (staging tile name, its allocation)
    stop = em.expr(s.stop).text
    _loop(em, f"for {em.define(s.var)} in range(0, {stop}):", s.body)
    em.lines[at:at] = ["    " * em.depth + alloc for _, alloc in em.tile_loop_prefix.values()]
    em.tile_loop_prefix = None
    if em.deferred_tma_stores:
        em.emit("tma.store_wait(0)")
        em.deferred_tma_stores = False


def lower_while(em: Emitter, s: ir.While):
    if em.par is not None:
        raise unsupported("a while loop inside T.Parallel", s.loc)
    _loop(em, f"while {em.expr(s.cond).text}:", s.body)


def lower_evaluate(em: Emitter, s: ir.Evaluate):
    em.emit(f"# T.{s.name}{tuple(s.args)!r}: no code")


def lower_print(em: Emitter, s: ir.Print):
    """T.print -> gl.device_print (vprintf): every thread prints the values it holds (a scalar:
    every thread), as ``pid (x, y, z) idx (i, j) msg: value``."""
    if s.value is None:  # Triton leaves a message of two characters unspaced ("pid (0, 0, 0)ok")
        em.emit(f"gl.device_print({(s.msg if s.msg.startswith(' ') else ' ' + s.msg)!r})")
        return
    value = _register_tile(em, s.value, s.loc)[0] if isinstance(s.value, ir.Region) else em.expr(s.value).text
    em.emit(f"gl.device_print({s.msg!r}, {value})")


# ---------------------------------------------------------------- copies


def lower_copy(em: Emitter, s):
    src, dst = s.src, s.dst
    ss, ds = src.buffer.scope, dst.buffer.scope
    if tuple(src.tile_shape) != tuple(dst.tile_shape):
        return _reshaping_copy(em, s)
    # the register tensor's shape: a fragment's own shape (it may keep unit dims, e.g. a
    # keep-dim reduction's (1, N)), else the tile's
    frag = next((r.buffer for r in (src, dst) if r.buffer.scope == "fragment"), None)
    shape = list(frag.shape) if frag is not None else list(dst.tile_shape)
    tile = padded_shape(shape)  # the register tile (ir/padding.py)

    def converted(text: str) -> str:  # docs/semantics.md's conversion (saturating float -> int, fp8)
        return cast_text(text, src.buffer.dtype, dst.buffer.dtype, "gl")
    for b in (src.buffer, dst.buffer):
        if b.scope in ("local", "var"):
            raise unsupported(f"T.copy from/to {b.scope} buffer {b.name}", s.loc)
        _refuse_bool_tile(b)
    if any(r.buffer.scope == "fragment" and semantics.sliced_dims(r) != [] for r in (src, dst)):
        return _copy_fragment_part(em, s)
    if em.partitions is not None and id(s) in em.partitions.tile_loads:
        return warp_specialize.emit_tile_load_wait(em, s)  # the producer issues the copy
    if id(s) in em.early_loads:
        return early_loads.emit_issue(em, s)  # waited for before the buffer's first use
    blocked = lay.blocked_for(tile, dst.buffer.dtype.bits, em.num_warps)
    if ss == "global":
        if ds == "fragment":
            _check_whole_fragment(dst, s.loc)
            have = em.buffer_layout(dst.buffer)
            lname = em.layout_name(have, em.name(dst.buffer))
            ptr, mask = em.global_tile(src, lname, s.loc, shape)
            em.emit(f"{em.name(dst.buffer)} = {converted(semantics.tile_load_text('gl', ptr, mask, src.buffer))}")
            return
        lname = em.layout_name(blocked)
        ptr, mask = em.global_tile(src, lname, s.loc)
        value = converted(semantics.tile_load_text("gl", ptr, mask, src.buffer))
        if ds == "shared":
            _wait_for_tma_stores(em, dst.buffer)
            em.emit(f"{em.shared_view(dst, s.loc)}.store({value})")
            _after_generic_shared_write(em)
        else:
            tmp = em.tmp("v")
            em.emit(f"{tmp} = {value}")
            ptr, mask = em.global_tile(dst, lname, s.loc)
            em.emit(f"gl.store({ptr}, {tmp}{semantics.mask_argument(mask)})")
        return
    if isel.uses_tma_store(s, em.target) and semantics.tma_may_store(em, dst):
        return _tma_store(em, s)
    if ss == "shared" and ds == "global" and id(src.buffer) in em.tma_store_sources and semantics.tma_may_store(em, dst):
        return _tma_store_from_shared(em, s)
    # the source as a register tensor
    if ss == "fragment":
        _check_whole_fragment(src, s.loc)
        value, have = em.name(src.buffer), em.buffer_layout(src.buffer)
    else:  # shared
        have = blocked if ds != "fragment" else em.buffer_layout(dst.buffer)
        value = f"{em.shared_view(src, s.loc, len(shape))}.load({em.layout_name(have)})"
    if ds == "global":
        lname = em.layout_name(blocked)
        value = _convert(em, value, have, blocked, lname)
        tmp = em.tmp("v")
        em.emit(f"{tmp} = {converted(value)}")
        ptr, mask = em.global_tile(dst, lname, s.loc, shape)
        em.emit(f"gl.store({ptr}, {tmp}{semantics.mask_argument(mask)})")
    elif ds == "shared":
        _wait_for_tma_stores(em, dst.buffer)
        em.emit(f"{em.shared_view(dst, s.loc, len(shape))}.store({converted(value)})")
        _after_generic_shared_write(em)
    else:  # fragment
        _check_whole_fragment(dst, s.loc)
        if ss == "fragment" and len(src.buffer.shape) != len(dst.buffer.shape):
            raise unsupported(f"a T.copy between fragments of ranks {len(src.buffer.shape)} and "
                              f"{len(dst.buffer.shape)}", s.loc)
        want = em.buffer_layout(dst.buffer)
        value = _convert(em, value, have, want, em.layout_name(want, em.name(dst.buffer)))
        em.emit(f"{em.name(dst.buffer)} = {converted(value)}")


def _reshaping_copy(em: Emitter, s):
    """A T.copy between whole on-chip tiles of different shapes and as many elements (an
    on-chip view's copy, lowering/buffer_views.py): the elements in row-major order - the
    source in a blocked layout, `gl.reshape` (Triton infers the result's layout), converted
    to the destination fragment's layout or stored into the destination's shared tile."""
    src, dst = s.src, s.dst
    what = f"a T.copy that reshapes {list(src.tile_shape)} into {list(dst.tile_shape)}"
    for region in (src, dst):
        buf = region.buffer
        if buf.scope not in ("shared", "fragment") or list(region.extents) != list(buf.shape):
            raise unsupported(f"{what}: only whole shared / fragment buffers are reshaped (T.reshape / T.view)",
                              s.loc)
        if is_padded(buf.tile_shape):
            raise unsupported(f"{what}: a tile whose extents are not powers of two is padded (ir/padding.py), and "
                              f"its row-major order is not the padded tile's", s.loc)
    have_shape, want_shape = list(src.buffer.tile_shape), list(dst.buffer.tile_shape)
    blocked = lay.blocked_for(have_shape, src.buffer.dtype.bits, em.num_warps)
    if src.buffer.scope == "fragment":
        value = _convert(em, em.name(src.buffer), em.buffer_layout(src.buffer), blocked, em.layout_name(blocked))
    else:
        value = f"{em.shared_view(src, s.loc)}.load({em.layout_name(blocked)})"
    value = f"gl.reshape({value}, {want_shape})"
    if dst.buffer.scope == "fragment":
        want = em.buffer_layout(dst.buffer)
        em.emit(f"{em.name(dst.buffer)} = gl.convert_layout({value}, {em.layout_name(want, em.name(dst.buffer))})")
        return
    _wait_for_tma_stores(em, dst.buffer)
    em.emit(f"{em.shared_view(dst, s.loc)}.store({value})")
    _after_generic_shared_write(em)


def _copy_fragment_part(em: Emitter, s):
    """A T.copy from or to part of a fragment - at one index along some dims (`lse[k, :]`,
    semantics.sliced_dims) or a static range (`acc_o[:4, :]`, semantics.static_ranges) - whose
    lanes are selected from / written into the fragment's register tile (`_selected`,
    `_selected_range`, `_write_part`).  The other side is a register tile of the part's shape: a
    whole fragment, or a tile loaded / stored in the part's layout (or a blocked one)."""
    src, dst = s.src, s.dst
    parts = {id(r): _fragment_part(r, s.loc) for r in (src, dst) if r.buffer.scope == "fragment"}
    shapes = [shape for _, _, shape in parts.values()]
    if any(shape != shapes[0] for shape in shapes):
        raise unsupported(f"a T.copy between fragment tiles of shapes {shapes}", s.loc)
    shape = shapes[0]
    if id(dst) in parts and not parts[id(dst)][1]:
        want = _row_layout(em, dst.buffer, parts[id(dst)][0])
    else:  # a range's tile has the layout its reshape gives: written from a blocked one
        want = lay.blocked_for(padded_shape(shape), dst.buffer.dtype.bits, em.num_warps)
    want_name = em.layout_name(want)
    if id(src) in parts:
        dims, ranges, _ = parts[id(src)]
        picks = [(d, em.expr(src.starts[d]).text) for d in dims]
        if ranges:
            value = f"gl.convert_layout({_selected_range(em, src.buffer, ranges)}, {want_name})"
        else:
            value, have = _selected(em, src.buffer, picks) if picks else (em.name(src.buffer), em.buffer_layout(src.buffer))
            value = _convert(em, value, have, want, want_name)
    elif src.buffer.scope == "shared":
        value = f"{em.shared_view(src, s.loc, len(shape))}.load({want_name})"
    else:
        ptr, mask = em.global_tile(src, want_name, s.loc, shape)
        value = semantics.tile_load_text("gl", ptr, mask, src.buffer)
    value = cast_text(value, src.buffer.dtype, dst.buffer.dtype, "gl")  # now in `want`
    if id(dst) in parts:
        _write_part(em, dst, parts[id(dst)], value)
    elif dst.buffer.scope == "shared":
        _wait_for_tma_stores(em, dst.buffer)
        em.emit(f"{em.shared_view(dst, s.loc, len(shape))}.store({value})")
        _after_generic_shared_write(em)
    else:
        tmp = em.tmp("v")
        em.emit(f"{tmp} = {value}")
        ptr, mask = em.global_tile(dst, want_name, s.loc, shape)
        em.emit(f"gl.store({ptr}, {tmp}{semantics.mask_argument(mask)})")


def _write_part(em: Emitter, region: ir.Region, part: tuple, value: str):
    """Write `value` to the part (`_fragment_part`) of fragment `region` - in the layout of the
    fragment's row (`_row_layout`) for one-index dims, any layout for a range -: the whole
    fragment when it is all of it, else a select."""
    dims, ranges, _ = part
    if not ranges:
        return _write_row(em, region, dims, value)
    buf = region.buffer
    shape = padded_shape(buf.shape)
    lname = em.layout_name(em.buffer_layout(buf), em.name(buf))
    spread = f"gl.convert_layout({semantics.range_spread_text('gl', value, shape, ranges)}, {lname})"
    em.emit(f"{em.name(buf)} = {semantics.written_text('gl', em.name(buf), _range_masks(em, buf, ranges), spread)}")


def _write_row(em: Emitter, region: ir.Region, dims: list, value: str):
    """Write `value`, a tile in the layout of fragment `region`'s row (`_row_layout`), to the
    lanes of the fragment that `region` takes at one index along `dims`: the whole fragment
    when there are none, else a select."""
    buf = region.buffer
    picks = [(d, em.expr(region.starts[d]).text) for d in dims]
    for d, _ in picks:  # ascending: the row's layout expands back into the buffer's
        value = f"gl.expand_dims({value}, {d})"
    if picks:
        value = semantics.written_text("gl", em.name(buf), _selection_masks(em, buf, picks), value)
    em.emit(f"{em.name(buf)} = {value}")


def _fragment_row(region: ir.Region) -> tuple:
    """(the dims fragment `region` takes at one index, the shape of the register tile left)."""
    dims = semantics.sliced_dims(region)
    if dims is None:
        raise unsupported(f"a partial region of fragment {region.buffer.name}", None)
    return dims, [n for d, n in enumerate(region.buffer.shape) if d not in dims]


def _fragment_part(region: ir.Region, loc) -> tuple:
    """(the dims fragment `region` takes at one index, (dim, start, extent) of its static ranges,
    the shape of its register tile): one-index dims (`_fragment_row`) or aligned static ranges."""
    dims = semantics.sliced_dims(region)
    if dims is not None:
        return dims, [], [n for d, n in enumerate(region.buffer.shape) if d not in dims]
    ranges = semantics.static_ranges(region)
    buf = region.buffer
    if ranges is None:
        raise unsupported(f"a partial region of fragment {buf.name} with a runtime start and an extent over 1", loc)
    bad = semantics.misaligned_range(ranges)
    if bad is not None:
        raise unsupported(f"a partial region of fragment {buf.name} (a static range of dim {bad[0]} starts at a "
                          f"multiple of its extent padded to a power of two, not at {bad[1]})", loc)
    return [], ranges, list(region.extents)


def _tma_store(em: Emitter, s):
    """fragment -> NVMMA shared staging tile -> TMA store.  The staging tile is waited on
    (`store_wait(0)`) before this statement ends, so it is free for any later use - except
    directly in a persistent tile loop: there one staging tile per (dtype, shape, layout) is
    allocated once before the loop and waited on before its next write and after the loop, so
    the store of one tile drains while the next tile's main loop runs.  Stores of one kind in
    a tile share it (a fused GEMM's pre-activation and output: 64 KB each at 128x256 in 16
    bits; a staging tile each took the room of a third pipeline stage), the second waiting
    until the first has read it, which TMA does in a fraction of a microsecond."""
    src, dst = s.src, s.dst
    dt = GL_DTYPES[dst.buffer.dtype.name]
    shape = list(dst.tile_shape)
    layout = lay.nvmma_default_for(shape, dst.buffer.dtype.bits)
    deferred = _tma_store_deferred(em)
    kind = (dt, tuple(shape), em.layout_name(layout))
    if deferred and kind in em.tile_loop_prefix:  # an earlier store of the loop's body, or the body emitted again
        stage = em.tile_loop_prefix[kind][0]
    else:
        stage = em.tmp("store_tile")
    alloc = f"{stage} = gl.allocate_shared_memory({dt}, {shape}, {em.layout_name(layout)})"
    if deferred:
        em.tile_loop_prefix[kind] = (stage, alloc)
        em.emit("tma.store_wait(0)")  # earlier stores (this tile's, the previous tile's) have read the staging tile
    else:
        em.emit(alloc)
    em.emit(f"{stage}.store({cast_text(em.name(src.buffer), src.buffer.dtype, dst.buffer.dtype, 'gl')})")
    em.emit("fence_async_shared()")  # generic-proxy smem writes before the async-proxy TMA read
    _issue_tma_store(em, dst, layout, stage, deferred)


def _tma_store_from_shared(em: Emitter, s):
    """A shared tile -> global copy of a buffer in `instructions.tma_store_sources`: one TMA
    store read straight from the buffer (its writers fenced it, `_after_generic_shared_write`).
    Directly in a persistent tile loop the store is left to drain under the next tile: the
    buffer's next writer waits for it (`_wait_for_tma_stores`), as does the end of the loop."""
    _issue_tma_store(em, s.dst, em.buffer_layout(s.src.buffer), em.shared_view(s.src, s.loc),
                     _tma_store_deferred(em))


def _tma_store_deferred(em: Emitter) -> bool:
    """Is a TMA store emitted now directly in the body of a persistent tile loop?"""
    return em.tile_loop_prefix is not None and em.depth == em.tile_loop_depth + 1


def _issue_tma_store(em: Emitter, dst: ir.Region, layout, source: str, deferred: bool):
    desc, coords, block = em.descriptor(dst, layout)
    source = em.tma_view(source, len(dst.tile_shape), block)
    em.emit(f"tma.async_copy_shared_to_global({desc}, [{coords}], {source})")
    if deferred:
        em.deferred_tma_stores = True
    else:
        em.emit("tma.store_wait(0)")


def _wait_for_tma_stores(em: Emitter, buffer: ir.Buffer):
    """Before a write to a shared buffer TMA stores read from: wait until they have read it."""
    if id(buffer) in em.tma_store_sources:
        em.emit("tma.store_wait(0)")


def _check_whole_fragment(region: ir.Region, loc):
    buf = region.buffer
    if tuple(region.extents) != tuple(buf.shape):
        raise unsupported(f"a partial region of fragment {buf.name}", loc)


def lower_async_copy(em: Emitter, s: ir.AsyncCopy):
    ring = em.rings.get(id(s))
    if em.partitions is not None and rings.served_by_tma(em, s):
        return warp_specialize.emit_release(em, s)  # the producer partition issues the copy
    if ring is not None and ring.has_tma and isel.uses_tma(s, em.target) and s.iteration is not None:
        layout = em.buffer_layout(s.dst.buffer)
        desc, coords, block = em.descriptor(s.src, layout, s.iteration, ring.loop.pipeline_trips)
        group = em.copy_group.get(id(s), s.iteration)
        for lane, nbytes in enumerate(em.expect_bytes.get(id(s), ())):
            em.emit(f"mbarrier.expect({_ring_position(em, ring, group, lane)[0]}, {nbytes})")
        bar = _ring_position(em, ring, group, em.copy_lane[id(s)])[0]
        em.emit(f"tma.async_copy_global_to_shared({desc}, [{coords}], {bar}, {em.tma_shared_view(s.dst, s.loc, block)})")
        return
    if s.src.buffer.scope != "global" or s.dst.buffer.scope != "shared" or s.src.buffer.dtype != s.dst.buffer.dtype \
            or not isel.uses_cp_async(s):
        return lower_copy(em, s)  # synchronous: data visible earlier than required, still correct
    shape = padded_shape(s.dst.tile_shape)
    lname = em.layout_name(lay.blocked_for(shape, s.dst.buffer.dtype.bits, em.num_warps))
    ptr, mask = em.global_tile(s.src, lname, s.loc)
    em.emit(f"cp.async_copy_global_to_shared({em.shared_view(s.dst, s.loc)}, {ptr}{semantics.mask_argument(mask)})")


def _ring_position(em, ring, iteration, lane: int) -> tuple:
    """(barrier, phase parity) texts of the commit group of `iteration` in `ring`'s `lane`."""
    name = rings.lane_name(ring, lane)
    it = static_int(iteration)
    if ring.phase_bits is not None:
        text = _paren_text(em.expr(iteration).text)
        index = it % ring.stages if it is not None else f"{text} % {ring.stages}"
        return f"{name}.index({index})", rings.tile_phase(em, ring, text)
    if it is not None:
        return f"{name}.index({it % ring.stages})", f"{(it // ring.stages) & 1}"
    it = _paren_text(em.expr(iteration).text)
    return f"{name}.index({it} % {ring.stages})", f"({it} // {ring.stages}) & 1"


def _paren_text(text: str) -> str:
    return text if text.isidentifier() or text.isdigit() or text.startswith("(") else f"({text})"


def lower_commit_group(em: Emitter, s: ir.CommitGroup):
    if em.cp_async:
        em.emit("cp.commit_group()")
    if id(s) in em.commit_arrivals:  # copies of this group that did not signal its barrier
        guards, missing = em.commit_arrivals[id(s)]
        bar = _ring_position(em, em.rings[id(s)], s.iteration, 0)[0]
        for guard in guards:
            em.emit(f"mbarrier.arrive({bar}, pred=not {_paren_text(em.expr(guard).text)})")
        if missing:
            em.emit(f"mbarrier.arrive({bar}, count={missing})")


def lower_wait_group(em: Emitter, s: ir.WaitGroup):
    ring = em.rings.get(id(s))
    if em.cp_async:
        # this thread's cp.async data has landed; fence it for wgmma (async proxy), then make
        # every thread's data visible to the whole CTA
        em.emit(f"cp.wait_group({s.pending})")
        _after_generic_shared_write(em)
        em.emit("gl.thread_barrier()")
    if ring is None or not ring.has_tma:
        return
    iteration = em.wait_iteration.get(id(s))
    if iteration is None:
        em.emit("# no TMA group can be in flight here")
        return
    # a cp.async wait means every group up to `iteration` has landed, a barrier wait only
    # that group: when groups mix iterations (group g holds copies of g - span .. g), the
    # iteration this wait completes also has copies in the `span` groups before it, which
    # no earlier wait covers at the loop's first step.  Those are waited on too, unless a
    # newer group (at most `pending` are committed after this one) refilled their slot: its
    # data was then consumed, so waited on, before - and its barrier's parity is ambiguous
    for back in range(min(ring.span, ring.stages - 1 - s.pending), 0, -1):
        _wait_for_group(em, ring, _minus_const(iteration, back))
    _wait_for_group(em, ring, iteration)


def _minus_const(e, k: int):
    value = static_int(e)
    return ir.Const(value - k) if value is not None else ir.BinOp("-", e, ir.Const(k))


def _wait_for_group(em: Emitter, ring, iteration):
    """Wait on the barrier of `ring`'s commit group `iteration`, when that group has copies."""
    # group g holds iterations g - span .. g: it has copies while g - span < stop
    trips = ring.loop.pipeline_trips
    it, stop = static_int(iteration), static_int(trips)
    stop_text = em.expr(trips).text + (f" + {ring.span}" if ring.span else "")
    if stop is not None:
        stop += ring.span
    if it is not None and (it < 0 or (stop is not None and it >= stop)):
        em.emit(f"# iteration {it} has no TMA group to wait for")
        return
    if it is not None:
        pred = "" if stop is not None else f", pred={it} < ({stop_text})"
    else:
        text = _paren_text(em.expr(iteration).text)
        pred = f", pred=({text} >= 0) & ({text} < {f'({stop_text})' if ring.span else stop_text})"
    for lane in range(ring.lanes):
        em.emit("mbarrier.wait({}, {}{})".format(*_ring_position(em, ring, iteration, lane), pred))


# ---------------------------------------------------------------- gemm


def lower_gemm(em: Emitter, s: ir.Gemm):
    gemm_accumulators.check(s, em.backend)
    engine = isel.gemm_engine(s, em.target, em.num_warps)
    acc_layout = isel.accumulator_layout(s, em.target, em.num_warps)
    c = s.c.buffer
    _check_whole_fragment(s.c, s.loc)
    cname = em.name(c)
    have = em.buffer_layout(c)
    acc_name = em.layout_name(acc_layout)
    converted = str(have) != str(acc_layout)
    if converted or engine != "wgmma":
        em.settle([c])
    acc = f"gl.convert_layout({cname}, {acc_name})" if converted else cname
    if engine != "wgmma":
        for op in (s.a, s.b):
            em.settle([op.buffer])
    chunk = _mma_v2_k_chunk(s) if engine == "mma_v2" else None
    if chunk is not None:
        a = b = None  # each chunk loads its own slices of the shared operands
    else:
        a = _operand(em, s, 0, engine)
        b = _operand(em, s, 1, engine)
    if s.clear_accum:
        # not the accumulator's old value, even for wgmma (use_acc=False ignores it): passed,
        # it stays live into the gemm (in attention: the previous softmax's P), and the split
        # attention kernel had 1.5x the F2FP packs and 10x the PRMTs in its SASS
        acc = f"gl.zeros({padded_shape(c.shape)}, {GL_DTYPES[c.dtype.name]}, layout={acc_name})"
    if engine == "wgmma":
        use_acc = "False" if s.clear_accum else "True"
        extra = ", is_async=True" if s.is_async else ""
        result = f"warpgroup_mma({a}, {b}, {acc}, use_acc={use_acc}{extra})"
    else:
        fn = "mma_v2" if engine == "mma_v2" else "gl.dot_fma"
        precision = ', input_precision="tf32"' if s.tf32 and engine == "mma_v2" else ""
        if chunk is not None:
            result = em.tmp("acc")
            k = em.tmp("k")
            em.emit(f"{result} = {acc}")
            em.emit(f"for {k} in gl.static_range(0, {isel.padded_mnk(s)[2]}, {chunk}):")
            a = _operand(em, s, 0, engine, k_slice=(k, chunk))
            b = _operand(em, s, 1, engine, k_slice=(k, chunk))
            em.emit(f"    {result} = {fn}({a}, {b}, {result}{precision})")
        else:
            result = f"{fn}({a}, {b}, {acc}{precision})"
    if converted:
        tmp = em.tmp("acc")
        em.emit(f"{tmp} = {result}")
        if engine == "wgmma" and s.is_async:
            em.emit(f"{tmp} = warpgroup_mma_wait(num_outstanding=0, deps=({tmp},))")
        em.emit(f"{cname} = gl.convert_layout({tmp}, {em.layout_name(have, cname)})")
        return
    em.emit(f"{cname} = {result}")
    if engine == "wgmma" and s.is_async:
        em.tokens.add(c)
        em.inflight.add(c)
        em.issued.append((c, a if s.a.buffer.scope == "fragment" and a.isidentifier() else None))


# K elements of each mma.sync chunk (two k16 steps of 16-bit operands)
_MMA_V2_CHUNK = 32


def _mma_v2_k_chunk(g: ir.Gemm):
    """The K chunk of an mma.sync gemm whose operands are both in shared memory, or None to
    load them whole.  Loaded whole, both operand tiles live in registers at once (dQ's
    32x128 @ 128x256 in gqa_bwd: 64 registers a thread for K alone, beside its accumulators);
    a chunk at a time, as TileLang's mma loop reads them per k step, they take an eighth of
    that: -10 % of that kernel's time on the H100 (bench/NOTES.md, session 17).  A chunk
    along an operand's contiguous dim covers at least a 128-byte swizzle row."""
    if g.a.buffer.scope != "shared" or g.b.buffer.scope != "shared":
        return None
    k = isel.padded_mnk(g)[2]
    contiguous_k = not g.transpose_a or g.transpose_b  # A stored (M, K) / B stored (N, K)
    chunk = max(_MMA_V2_CHUNK, 1024 // g.a.buffer.dtype.bits) if contiguous_k else _MMA_V2_CHUNK
    return chunk if k > chunk else None


def _operand(em: Emitter, g: ir.Gemm, index: int, engine: str, k_slice=None) -> str:
    """Operand `index` (0 = A, 1 = B) as wgmma wants it (a shared view) or as a register
    DotOperandLayout tensor.  A transposed operand is stored (K, M) / (N, K): a shared one
    is read through a permuted view, a register one is permuted in registers.  The FMA
    engine computes in the accumulator's dtype (see `instructions`).  `k_slice` (start
    text, length) loads only those K rows / columns of a shared operand."""
    region = (g.a, g.b)[index]
    transposed = (g.transpose_a, g.transpose_b)[index]
    buf = region.buffer
    want = isel.operand_layout(g, index, em.target, em.num_warps)
    if buf.scope == "shared":
        view = em.shared_view(region, g.loc)
        if transposed:
            view += ".permute((1, 0))"
        if k_slice is not None:
            view += f".slice({k_slice[0]}, {k_slice[1]}, dim={1 - index})"
        if engine == "wgmma":
            return view
        text = f"{view}.load({em.layout_name(want)})"
    elif buf.scope == "fragment":
        _check_whole_fragment(region, g.loc)
        text, have = em.name(buf), em.buffer_layout(buf)
        if transposed:
            text = f"gl.convert_layout(gl.permute({text}, (1, 0)), {em.layout_name(want)})"
        else:
            text = _convert(em, text, have, want, em.layout_name(want))
    else:
        raise unsupported(f"T.gemm operand in {buf.scope} memory ({buf.name})", g.loc)
    compute = g.c.buffer.dtype if engine == "fma" else g.a.buffer.dtype
    if buf.dtype != compute:
        text += f".to({GL_DTYPES[compute.name]})"
    return text


def lower_wait_mma(em: Emitter, s: ir.WaitMMA):
    pending = sorted(em.tokens | em.inflight, key=lambda b: em.name(b))
    if pending:
        em.wait_mma(s.pending, pending)


# ---------------------------------------------------------------- fill / reductions / atomics


def lower_fill(em: Emitter, s: ir.Fill):
    buf = s.dst.buffer
    v = em.expr(s.value).text
    dt = GL_DTYPES[buf.dtype.name]
    if buf.scope in ("var", "local") and all(d == 1 for d in buf.shape):
        em.emit(f"{em.name(buf)} = gl.to_tensor({v}).to({dt})")
    elif buf.scope == "local":  # every lane, pad lanes too: nothing reads them
        em.emit(f"{em.name(buf)} = "
                f"{_filled(v, s.value.dtype, buf.dtype, [semantics.local_array_lanes(buf)], _local_layout(em, buf))}")
    elif buf.scope == "fragment" and semantics.sliced_dims(s.dst):  # a row: a select of its lanes
        dims, shape = _fragment_row(s.dst)
        row = _row_layout(em, buf, dims)
        value = _masked_pads(em, _filled(v, s.value.dtype, buf.dtype, padded_shape(shape), em.layout_name(row)),
                             shape, row)
        _write_row(em, s.dst, dims, value)
    elif buf.scope == "fragment":
        _check_whole_fragment(s.dst, s.loc)
        layout = em.layout_name(em.buffer_layout(buf), em.name(buf))
        filled = _filled(v, s.value.dtype, buf.dtype, padded_shape(buf.shape), layout)
        em.emit(f"{em.name(buf)} = {filled if _is_zero(s.value) else _masked_pads(em, filled, buf.shape, layout)}")
    elif buf.scope == "shared":
        shape = list(s.dst.tile_shape)
        layout = em.layout_name(lay.blocked_for(padded_shape(shape), buf.dtype.bits, em.num_warps))
        filled = _filled(v, s.value.dtype, buf.dtype, padded_shape(shape), layout)
        filled = filled if _is_zero(s.value) else _masked_pads(em, filled, shape, layout)
        em.emit(f"{em.shared_view(s.dst, s.loc)}.store({filled})")
        _after_generic_shared_write(em)
    else:
        raise unsupported(f"T.fill on {buf.scope} buffer {buf.name}", s.loc)


def _is_zero(value) -> bool:
    """A fill with 0 leaves pad lanes 0 without a mask."""
    return isinstance(value, ir.Const) and value.value == 0 and not isinstance(value.value, bool)


def _masked_pads(em: Emitter, tile: str, shape, layout, pad_value: str = "0") -> str:
    """`tile` (a register tile of `shape`'s padded shape in `layout`, a layout or its name) with
    its pad lanes set to `pad_value` (ir/padding.py); `tile` itself when `shape` has none."""
    if not is_padded(shape):
        return tile
    inside = em.inside_mask(shape, layout if isinstance(layout, str) else em.layout_name(layout))
    return f"gl.where({inside}, {tile}, {pad_value})"


def _filled(scalar: str, src, dst, shape: list, layout: str) -> str:
    if dst.is_float and dst.bits == 8:  # gl.full has no fp8 constants
        return broadcast_text(f"gl.to_tensor({scalar})", src, dst, shape, layout)
    return f"gl.full({shape}, {scalar}, {GL_DTYPES[dst.name]}, layout={layout})"


def _register_tile(em, region, loc):
    """(text, layout) of a whole fragment, or of a shared tile loaded in a blocked layout."""
    buf = region.buffer
    if buf.scope == "fragment":
        _check_whole_fragment(region, loc)
        return em.name(buf), em.buffer_layout(buf)
    if buf.scope == "shared":
        layout = lay.blocked_for(padded_shape(region.tile_shape), buf.dtype.bits, em.num_warps)
        return f"{em.shared_view(region, loc)}.load({em.layout_name(layout)})", layout
    raise unsupported(f"a reduction over {buf.scope} buffer {buf.name}", loc)


def _write_tile(em, region, value, value_layout, value_dtype, loc):
    """Store register tile `value` (of IR dtype `value_dtype`) into `region`, converted as
    docs/semantics.md says (saturating float -> int)."""
    buf = region.buffer
    if buf.scope == "fragment":
        _check_whole_fragment(region, loc)
        want = em.buffer_layout(buf)
        value = _convert(em, value, value_layout, want, em.layout_name(want, em.name(buf)))
        em.emit(f"{em.name(buf)} = {cast_text(value, value_dtype, buf.dtype, 'gl')}")
    elif buf.scope == "shared":
        em.emit(f"{em.shared_view(region, loc)}.store({cast_text(value, value_dtype, buf.dtype, 'gl')})")
        _after_generic_shared_write(em)
    else:
        raise unsupported(f"a reduction result in {buf.scope} buffer {buf.name}", loc)


def lower_reduce(em: Emitter, s: ir.Reduce):
    src, layout = _register_tile(em, s.src, s.loc)
    axis = s.dim  # of the region's tile shape (unit dims dropped)
    rank = len(s.src.tile_shape)
    if s.src.buffer.scope == "fragment" and len(s.src.buffer.shape) > rank:
        # a whole fragment is its own register tensor, unit dims kept: a [1, N] one reduces
        # along its axis 1 into one value
        axis = [d for d, n in enumerate(s.src.buffer.shape) if n != 1][s.dim]
        rank = len(s.src.buffer.shape)
    to_one = rank == 1 and s.dst.tile_shape == (1,) and s.dst.buffer.scope == "fragment"
    if len(s.dst.tile_shape) != rank - 1 and not to_one:
        raise unsupported(f"T.reduce_{s.kind} into shape {list(s.dst.tile_shape)}", s.loc)
    if rank != 2 and not to_one:
        raise unsupported(f"T.reduce_{s.kind} over a {rank}-D tile", s.loc)
    # pad lanes (ir/padding.py) take the reduction's identity
    src_shape = s.src.buffer.shape if s.src.buffer.scope == "fragment" else s.src.tile_shape
    src = _masked_pads(em, src, src_shape, layout, semantics.reduction_identity(s.kind, s.src.buffer.dtype))
    reduction, computed = semantics.reduction_text(s.kind, src, s.src.buffer.dtype, axis, s.nan_propagate, "gl")
    new = em.tmp("red")
    em.emit(f"{new} = {reduction}")
    if to_one:  # a 1-D tile into a one-element fragment: the scalar, as that fragment's tile
        want = em.buffer_layout(s.dst.buffer)
        new_layout = want
        em.emit(f"{new} = {_filled(new, computed, computed, list(s.dst.buffer.shape), em.layout_name(want, em.name(s.dst.buffer)))}")
    else:
        new_layout = lay.slice_of(layout, axis)
    if s.dst.buffer.scope == "fragment" and len(s.dst.buffer.shape) == rank and not to_one:
        if s.dst.buffer.shape[axis] != 1:
            raise unsupported(f"T.reduce_{s.kind} along dim {s.dim} into {list(s.dst.buffer.shape)}", s.loc)
        # keep-dim output ((1, N) / (M, 1) fragment): put the reduced dim back as size 1
        em.emit(f"{new} = gl.expand_dims({new}, {axis})")
        new_layout = layout
    if not s.clear:
        old, old_layout = _register_tile(em, s.dst, s.loc)
        old = _convert(em, old, old_layout, new_layout, em.layout_name(new_layout))
        combined, computed = semantics.reduction_combine_text(s.kind, old, s.dst.buffer.dtype, new, computed,
                                                              s.src.buffer.dtype, s.nan_propagate, "gl")
        em.emit(f"{new} = {combined}")
    dst_shape = s.dst.buffer.shape if s.dst.buffer.scope == "fragment" else s.dst.tile_shape
    new = _masked_pads(em, new, dst_shape, new_layout)
    _write_tile(em, s.dst, new, new_layout, computed, s.loc)


def lower_cumsum(em: Emitter, s: ir.Cumsum):
    src, layout = _register_tile(em, s.src, s.loc)
    if tuple(s.src.tile_shape) != tuple(s.dst.tile_shape):
        raise unsupported("T.cumsum with different source and destination shapes", s.loc)
    tmp = em.tmp("scan")
    em.emit(f"{tmp} = gl.associative_scan({src}, {s.dim}, _add_combine, reverse={s.reverse})")
    tmp = _masked_pads(em, tmp, s.src.tile_shape, layout)  # a forward scan's pads hold the total
    _write_tile(em, s.dst, tmp, layout, s.src.buffer.dtype, s.loc)


def lower_atomic_add(em: Emitter, s: ir.AtomicAdd):
    dst = s.dst
    if dst.buffer.scope != "global":
        raise unsupported(f"T.atomic_{s.kind} into {dst.buffer.scope} buffer {dst.buffer.name}", s.loc)
    dt = GL_DTYPES[dst.buffer.dtype.name]
    if isinstance(s.value, ir.Region):
        value, layout = _register_tile(em, s.value, s.loc)
        shape = list(s.value.buffer.shape if s.value.buffer.scope == "fragment" else s.value.tile_shape)
        value = f"{value}.to({dt})"
        if tma_reduce.applies(em, s, _planned_shared_bytes(em)):
            return tma_reduce.lower(em, s, value)
        vector = _vector_atomic_layout(em, s, layout, shape)
        if vector is not None:
            value, layout = f"gl.convert_layout({value}, {em.layout_name(vector)})", vector
        ptr, mask = em.global_tile(dst, em.layout_name(layout), s.loc)
        em.emit(semantics.atomic_text(em, s, ptr, value, mask, len(shape)))
        return
    idx = [em.expr(x) for x in dst.starts]
    strides = em.strides(dst.buffer)
    offs = " + ".join(i.text if st == "1" else f"{i.text} * ({st})" for i, st in zip(idx, strides))
    prev = "" if s.prev is None else f"{em.define(s.prev)} = "
    par = em.par
    if par is None:  # one atomic of the program
        value = f"gl.to_tensor({em.expr(s.value).text}).to({dt})"
        em.emit(prev + semantics.atomic_text(em, s, f"{em.name(dst.buffer)} + {offs}", value, None, 0))
        return
    # one atomic per lane, also where address and value are the same on every lane (TileLang's
    # T.Parallel runs every iteration); the lanes of the `if`s inside the loop, not the pad lanes
    shape = padded_shape(par.loop.extents)
    ptr = f"{em.name(dst.buffer)} + (gl.zeros({shape}, gl.int32, layout={par.layout_name}) + {offs})"
    value = _full(em.expr(s.value), s.value.dtype, dst.buffer.dtype, par)
    # lanes past the tensor's edges are dropped, as the interpreter and the triton backend drop them
    # (TileLang's safe memory access); element stores inside T.Parallel are masked the same way
    inside = semantics.bounds_mask(em, dst.starts, idx, dst.buffer)
    mask = _full_bool(em, f"({inside}) & {par.write_mask}" if par.write_mask else inside, par)
    em.emit(prev + semantics.atomic_text(em, s, ptr, value, mask, len(shape)))
    if s.prev is not None:
        em.let_dims[id(s.prev)] = frozenset(range(len(par.loop.vars)))


def _vector_atomic_layout(em: Emitter, s: ir.AtomicAdd, layout, shape: list):
    """The coalesced layout (`layouts.blocked_for`: 16 contiguous bytes a thread along the last
    dim, as Triton's coalescing pass gives `tl.atomic_add`) a tile atomic's value is converted
    to, so that Triton issues vector reductions (sm_90's `red.global.v4.f32` / `.v8.f16` ...:
    one instruction per 16 bytes, a wgmma accumulator holding 8 bytes a thread contiguous);
    None where that gains nothing: not an add of a 16- or 32-bit float (the vector forms), a
    target before sm_90, a layout already as wide, a blocked layout replicating the tile over
    threads, or a conversion whose shared-memory scratch (the tile, at most) would not fit
    beside the kernel's buffers (`shared_memory_budget`'s estimate)."""
    dtype = s.dst.buffer.dtype
    if not vector_atomics_enabled() or s.kind != "add" or not dtype.is_float or dtype.bits not in (16, 32) \
            or em.target.arch < 90:
        return None
    tile = padded_shape(shape)
    want = lay.blocked_for(tile, dtype.bits, em.num_warps)
    vector = want.size_per_thread[-1]
    if vector <= _contiguous_per_thread(layout):
        return None
    covered = math.prod(want.size_per_thread) * math.prod(want.threads_per_warp) * math.prod(want.warps_per_cta)
    planned = _planned_shared_bytes(em) + em.body_prefix_bytes()
    if covered > math.prod(tile) or planned + math.prod(tile) * dtype.bits // 8 > em.target.shared_memory_limit:
        return None
    return want


def _planned_shared_bytes(em: Emitter) -> int:
    """The kernel's shared memory as lowering planned it (`shared_memory_budget`'s estimate; a
    persistent kernel allocates every buffer at once, lowering/persistent_tiles.py)."""
    return allocated_at_once_bytes(em.func) if em.tile_loop_var is not None else em.func.attrs.get("shared_bytes", 0)


def vector_atomics_enabled() -> bool:
    """`TRITILE_VECTOR_ATOMICS=0` keeps each tile atomic in its value's own layout (an A/B
    switch: the conversion costs a shared-memory round trip and a CTA barrier)."""
    return os.environ.get("TRITILE_VECTOR_ATOMICS", "1").strip() not in ("", "0")


def _contiguous_per_thread(layout) -> int:
    """Elements a thread holds contiguous along the last dim in register `layout` (a blocked
    layout's vector, a wgmma / mma.sync accumulator's pair of columns; 1 for any other)."""
    if isinstance(layout, lay.BlockedLayout) and layout.order[0] == layout.rank - 1:
        return layout.size_per_thread[-1]
    if isinstance(layout, lay.NVMMADistributedLayout):
        return 2
    return 1


def lower_cum_extremum(em: Emitter, s: ir.CumExtremum):
    """`T.cummax` / `T.cummin`: an associative scan with the NaN-propagating max / min combine."""
    src, layout = _register_tile(em, s.src, s.loc)
    if tuple(s.src.tile_shape) != tuple(s.dst.tile_shape):
        raise unsupported(f"T.cum{s.kind} with different source and destination shapes", s.loc)
    if is_padded(s.src.tile_shape):  # a reversed scan would start from the pad lanes
        raise unsupported(f"T.cum{s.kind} of a tile whose extents are not powers of two", s.loc)
    tmp = em.tmp("scan")
    em.emit(f"{tmp} = gl.associative_scan({src}, {s.dim % len(s.src.tile_shape)}, _{s.kind}_propagate_nan, "
            f"reverse={s.reverse})")
    _write_tile(em, s.dst, tmp, layout, s.src.buffer.dtype, s.loc)


RULES = {
    ir.Seq: lower_seq,
    ir.Alloc: lower_alloc,
    ir.Let: lower_let,
    ir.Store: lower_store,
    ir.Copy: lower_copy,
    ir.AsyncCopy: lower_async_copy,
    ir.CommitGroup: lower_commit_group,
    ir.WaitGroup: lower_wait_group,
    ir.Gemm: lower_gemm,
    ir.WaitMMA: lower_wait_mma,
    ir.Fill: lower_fill,
    ir.Reduce: lower_reduce,
    ir.Cumsum: lower_cumsum,
    ir.AtomicAdd: lower_atomic_add,
    ir.Parallel: lower_parallel,
    ir.If: lower_if,
    ir.For: lower_for,
    ir.While: lower_while,
    ir.Evaluate: lower_evaluate,
    ir.Print: lower_print,
    ir.DeviceAssert: semantics.lower_device_assert,
    ir.ThreadBarrier: semantics.lower_thread_barrier,
    ir.ConsumerPartitions: lower_consumer_partitions,
    ir.CumExtremum: lower_cum_extremum,
}
