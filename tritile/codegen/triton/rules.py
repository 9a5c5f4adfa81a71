"""Per-node lowering rules of the triton.language backend, registered in ONE table each.

`RULES[ir.Copy] = lower_copy` etc. for statements; `EXPR_RULES` for the expressions whose
text depends on where data lives (Var, Load) - the scalar meaning of the others is
`codegen/semantics.py`'s, shared with the Gluon backend.  A rule gets the `Emitter` and the
node and emits lines; a node kind without a rule, or a case a rule cannot express in
triton.language, raises `CompileError` at the node's (the user's) line naming the construct.

Every on-chip buffer is a register tile (see `emitter.py`), so a rule reads an on-chip
operand as its variable and writes it by reassigning the whole tile: regions of on-chip
buffers must cover the buffer (unit dims may be added or dropped).
"""
from __future__ import annotations

from tritile.codegen import gemm_accumulators, semantics
from tritile.codegen.semantics import Val, cast_text, dtype_text, lane_loop_bounds
from tritile.codegen.source_writer import static_int, unrolled
from tritile.codegen.triton.emitter import (Emitter, ParallelContext, axis_index, is_scalar_buffer, padded_size,
                                            unsupported)
from tritile.errors import CompileError
from tritile.ir import nodes as ir
from tritile.ir.padding import is_padded, padded_shape
from tritile.ir.bounds import let_bindings
from tritile.lowering.pipeline_planning import capped_stages, check_stages_fit

# ======================================================================================
# expressions
# ======================================================================================


def _e_load(em: Emitter, e: ir.Load) -> Val:
    buf = e.buffer
    if is_scalar_buffer(buf):
        return Val(em.name(buf))
    idx = [em.expr(i) for i in e.indices]
    dims = frozenset().union(*[i.dims for i in idx])
    if buf.scope == "global":
        ptr = f"{em.name(buf)} + {_offsets(em, buf, idx)}"
        if not dims:
            return Val(f"tl.load({ptr})")
        return Val(f"tl.load({ptr}, mask={semantics.bounds_mask(em, e.indices, idx, buf)}, other={semantics.out_of_bounds_literal(buf)})", dims)
    if not dims:  # one element, the same for every lane
        return Val(_pick(em, buf, e.indices, idx))
    if buf.scope == "local":
        raise unsupported(f"indexing local array {buf.name} by a T.Parallel variable (a register gather)")
    region = _lanes_range(em, buf, e.indices)
    if region is not None:  # a tile of the Parallel's shape: a unit range (`x[i, j]` in T.Parallel(16, 1)) kept
        return Val(_tile(em, region, None, list(em.par.loop.extents))[0], frozenset(range(len(em.par.loop.vars))))
    return Val(_lanes_view(em, buf, e.indices), dims)


def _lanes_range(em: Emitter, buf: ir.Buffer, indices):
    """The static range of on-chip `buf` whose elements the current T.Parallel's lanes take at
    `indices`, each dim indexed by the loop's own variable of that axis plus a constant, not the
    whole tile (``x[i + 64, j]`` or ``x[i, j]`` over a loop of half x's rows): an `ir.Region` (a
    register tile has no sub-tile view: `_tile` / `_assign_tile` select the range through lane
    masks), else None."""
    par = em.par
    if len(indices) != len(par.loop.vars):
        return None
    starts = []
    for index, var, extent, size in zip(indices, par.loop.vars, par.loop.extents, buf.shape):
        offset = semantics.offset_from(index, var)
        start = static_int(offset) if offset is not None else None
        if start is None or start < 0 or not isinstance(size, int) or start + extent > size:
            return None
        starts.append(start)
    if not any(starts) and tuple(par.loop.extents) == tuple(buf.shape):
        return None  # the whole tile: `_lane_dims`' case
    return ir.Region(buf, tuple(ir.Const(k) for k in starts), tuple(par.loop.extents))


def _offsets(em: Emitter, buf: ir.Buffer, idx: list) -> str:
    strides = em.strides(buf)
    return " + ".join(i.text if s == "1" else f"{i.text} * ({s})" for i, s in zip(idx, strides))


def _flat_index(em: Emitter, buf: ir.Buffer, idx: list) -> str:
    """The element's index in `buf`'s flattened tile: a `T.alloc_local` array flattens its own
    shape, a shared / fragment tile its padded one (ir/padding.py)."""
    return semantics.flat_index_text(buf.shape if buf.scope == "local" else padded_shape(buf.shape), idx)


def _flat(em: Emitter, buf: ir.Buffer) -> str:
    return em.name(buf) if buf.scope == "local" else f"tl.reshape({em.name(buf)}, [{padded_size(buf)}])"


def _pick(em: Emitter, buf: ir.Buffer, indices, idx: list) -> str:
    """One element of an on-chip buffer at lane-independent indices (codegen/semantics.py)."""
    if not all(isinstance(d, int) for d in buf.shape):
        raise unsupported(f"a runtime-sized buffer {buf.name}")
    return semantics.picked_element_text("tl", _flat(em, buf), _lanes(em, buf), _flat_index(em, buf, idx), buf.dtype)


def _lanes(em: Emitter, buf: ir.Buffer) -> str:
    """`buf`'s flattened lane indices (a tl.arange over its padded size), emitted where used:
    a name bound inside a loop or branch would not reach the uses after it."""
    return f"tl.arange(0, {padded_size(buf)})"


def _selection_masks(buf: ir.Buffer, picks: list) -> list:
    """The lane tests selecting, in `buf`'s padded tile, index text `k` along dim `d` for each
    (d, k) of `picks` (codegen/semantics.py's `selected_text` / `written_text`)."""
    shape = padded_shape(buf.shape)
    return [f"({axis_index(f'tl.arange(0, {shape[d]})', d, len(shape))} == {k})" for d, k in picks]


def _lane_dims(em: Emitter, buf: ir.Buffer, indices, ordered: bool = True) -> tuple:
    """How on-chip `buf` indexed by `indices` inside the current T.Parallel maps onto its lanes:
    (the Parallel axis of each dim the lanes run along, those dims, (dim, index text) of the dims
    taken at one lane-independent index).  The lanes' dims must be distinct loop variables of the
    dim's extent, in the loop's order unless not `ordered` (a read: the tile is then permuted);
    the tile is the buffer's, expanded along the loop's other dims; a unit dim indexed 0 is
    neither."""
    par = em.par
    axes, dims, picks = [], [], []
    for d, (index, extent) in enumerate(zip(indices, buf.shape)):
        if extent == 1 and static_int(index) == 0:
            continue
        if isinstance(index, ir.Var) and index in par.index:
            axis = par.loop.vars.index(index)
            if par.loop.extents[axis] != extent or axis in axes or (ordered and axes and axis < axes[-1]):
                raise unsupported(f"this indexing of {buf.scope} buffer {buf.name} inside T.Parallel (a transposed or "
                                  f"partial view)")
            axes.append(axis)
            dims.append(d)
            continue
        k = em.expr(index)
        if k.dims:
            raise unsupported(f"this indexing of {buf.scope} buffer {buf.name} inside T.Parallel (each dim indexed "
                              f"by its own T.Parallel variable or by one index for all lanes; Triton has no register "
                              f"gather)")
        picks.append((d, k.text))
    return axes, dims, picks


def _lanes_view(em: Emitter, buf: ir.Buffer, indices) -> str:
    """On-chip `buf` read at `indices` inside the current T.Parallel, as a tile broadcastable
    to the Parallel's shape (`_lane_dims`): the dims taken at one index selected away, the
    others permuted into the loop's order (`x[j, i]` in `T.Parallel(i, j)`: `T.transpose`)."""
    axes, dims, picks = _lane_dims(em, buf, indices, ordered=False)
    text = em.name(buf)
    if picks:
        text = semantics.selected_text("tl", text, _selection_masks(buf, picks), [d for d, _ in picks], buf.dtype)
    kept = [padded_shape(buf.shape)[d] for d in dims]
    if len(kept) != len(buf.shape) - len(picks):
        text = f"tl.reshape({text}, {kept})"
    if axes != sorted(axes):
        text = f"tl.permute({text}, {[axes.index(a) for a in sorted(axes)]})"
        axes = sorted(axes)
    rank = len(em.par.loop.vars)
    if len(axes) == rank:
        return text
    return f"{text}[{', '.join(':' if a in axes else 'None' for a in range(rank))}]"


def _e_cast(em: Emitter, e: ir.Cast) -> Val:
    """`semantics.lower_cast` of the operand as a tensor (`Emitter.tensor`): under Triton's
    interpreter a loop counter is a Python int, which has no `.to` (`T.cast(k, "float32")`);
    compiled, `tl.full([], x, x's dtype)` of a scalar tensor is `x` itself."""
    if isinstance(e.value, ir.Const):
        return semantics.lower_cast(em, e)
    v = em.expr(e.value)
    return Val(cast_text(em.tensor(e.value, v), e.value.dtype, e.dtype, "tl"), v.dims)


EXPR_RULES = {ir.Load: _e_load, ir.Cast: _e_cast}


def lower_expr(em: Emitter, e) -> Val:
    return semantics.lower_scalar_expr(em, e, EXPR_RULES)


# ======================================================================================
# statements
# ======================================================================================


def lower_stmt(em: Emitter, s):
    rule = RULES.get(type(s))
    if rule is None:
        raise unsupported(type(s).__name__, getattr(s, "loc", None))
    try:
        rule(em, s)
    except CompileError as err:  # a rule meeting an unsupported case without its own location
        if err.loc is None and getattr(s, "loc", None) is not None:
            raise CompileError(err.message, s.loc) from None
        raise


def lower_seq(em: Emitter, s: ir.Seq):
    em.body(s)


def lower_alloc(em: Emitter, s: ir.Alloc):
    buf = s.buffer
    if buf.view_of is not None:  # reinterpreted bits (lowering/buffer_views.py rewrote the reshapes)
        raise unsupported(f"T.view of {buf.view_of.scope} buffer {buf.view_of.name} as {buf.dtype} (it holds "
                          f"{buf.view_of.dtype}: its bits reinterpreted in registers)", s.loc)
    name, dtype = em.name(buf), dtype_text(buf.dtype, "tl")
    if is_scalar_buffer(buf):
        init = s.init if s.init is not None else ir.Const(0, buf.dtype)
        em.emit(f"{name} = {cast_text(em.tensor(init), init.dtype, buf.dtype, 'tl')}")
    elif buf.scope == "local":
        if not all(isinstance(d, int) for d in buf.shape):
            raise unsupported(f"T.alloc_local with a runtime shape {list(buf.shape)}", s.loc)
        em.emit(f"{name} = tl.zeros([{padded_size(buf)}], {dtype})")
    elif buf.scope in ("shared", "fragment"):  # padded to powers of two, pad lanes 0 (ir/padding.py)
        em.emit(f"{name} = tl.zeros({padded_shape(buf.shape)}, {dtype})")
    else:
        raise unsupported(f"an allocation in {buf.scope} scope ({buf.name})", s.loc)


def lower_let(em: Emitter, s: ir.Let):
    v = em.expr(s.value)
    em.emit(f"{em.define(s.var)} = {v.text}")
    if v.dims:
        em.let_dims[id(s.var)] = v.dims
    for buf in em.address_tensors.get(id(s.var), ()):  # T.make_tensor: a pointer from the address,
        # 16-byte aligned as every tensor argument (the interpreter checks it)
        em.emit(f"{em.name(buf)} = tl.multiple_of({em.name(s.var)}.to(tl.pointer_type({dtype_text(buf.dtype, 'tl')})), 16)")


def lower_store(em: Emitter, s: ir.Store):
    buf, par = s.buffer, em.par
    if is_scalar_buffer(buf):
        if par is not None:
            raise unsupported(f"assigning scalar {buf.name} inside T.Parallel", s.loc)
        em.emit(f"{em.name(buf)} = {cast_text(em.tensor(s.value), s.value.dtype, buf.dtype, 'tl')}")
        return
    v = em.expr(s.value)
    idx = [em.expr(i) for i in s.indices]
    dims = frozenset().union(v.dims, *[i.dims for i in idx])
    if buf.scope == "global":
        ptr = f"{em.name(buf)} + {_offsets(em, buf, idx)}"
        if par is None or not (dims or par.cond):  # one element, one value: a single store
            em.emit(f"tl.store({ptr}, {cast_text(em.tensor(s.value, v), s.value.dtype, buf.dtype, 'tl')})")
            return
        mask = semantics.bounds_mask(em, s.indices, idx, buf) + (f" & {par.cond}" if par.cond else "")
        full = par.shape
        em.emit(f"tl.store(tl.broadcast_to({ptr}, {full}), {em.splat(s.value, v, buf.dtype, full)}, "
                f"mask=tl.broadcast_to({mask}, {full}))")
        return
    if not frozenset().union(*[i.dims for i in idx]):
        return _write_element(em, s, v, idx)
    if buf.scope == "local":
        raise unsupported(f"indexing local array {buf.name} by a T.Parallel variable (a register scatter)", s.loc)
    region = _lanes_range(em, buf, s.indices)
    if region is not None:  # a static range of the tile, one element per lane
        if par.cond:
            raise unsupported(f"a masked write to a range of {buf.scope} buffer {buf.name} inside T.Parallel", s.loc)
        shape = list(par.loop.extents)
        value = v.text if v.dims == frozenset(range(len(shape))) else em.splat(s.value, v, s.value.dtype, par.shape)
        return _assign_tile(em, region, value, s.value.dtype, shape, s.loc)
    # on-chip lanes written lane by lane: each lane of the Parallel one element
    axes, dims, picks = _lane_dims(em, buf, s.indices, ordered=False)
    if axes != sorted(axes) and (picks or len(axes) != len(par.loop.vars)):
        raise unsupported(f"this indexing of {buf.scope} buffer {buf.name} inside T.Parallel (its loop variables "
                          f"in another order, with dims at one index or loop dims it does not take)", s.loc)
    # unit loop dims count for nothing: a [N] tile under T.Parallel(1, N)
    if len([a for a in axes if par.loop.extents[a] != 1]) != len([e for e in par.loop.extents if e != 1]):
        raise unsupported(f"a write to {buf.scope} buffer {buf.name} that does not cover it once per T.Parallel "
                          f"lane", s.loc)
    shape = par.shape
    if v.dims == frozenset(range(len(shape))):  # already a tile of the Parallel's shape
        value = cast_text(v.text, s.value.dtype, buf.dtype, "tl")
    else:
        value = em.splat(s.value, v, buf.dtype, shape)
    # the tile of the written lanes: the buffer's padded shape, 1 along the dims taken at one index
    picked = {d for d, _ in picks}
    written = [1 if d in picked else n for d, n in enumerate(padded_shape(buf.shape))]
    if picks:  # a row (column, ...) of the buffer: a select of the lanes along the picked dims
        masks = _selection_masks(buf, picks)
        if par.cond:  # the `if`s inside the loop, and its pad lanes (which keep the tile's 0s)
            masks.append(f"tl.reshape(tl.broadcast_to({par.cond}, {shape}), {written})")
        value = value if written == shape else f"tl.reshape({value}, {written})"
        em.emit(f"{em.name(buf)} = {semantics.written_text('tl', em.name(buf), masks, value)}")
        return
    if par.cond:
        value = f"tl.where({par.cond}, {value}, {_lanes_view(em, buf, s.indices)})"
    if axes != sorted(axes):  # `y[j, i] = ...` in T.Parallel(i, j): the tile permuted into the buffer's order
        value = f"tl.permute({value}, {axes})"
    elif written != shape:
        value = f"tl.reshape({value}, {written})"
    em.emit(f"{em.name(buf)} = {value}")


def _write_element(em: Emitter, s: ir.Store, v: Val, idx: list):
    """One element of an on-chip buffer at lane-independent indices: a select over the
    flattened tile.  Inside a T.Parallel every lane would write it: only with one value and
    no lane condition is that one write."""
    buf, par = s.buffer, em.par
    if par is not None and (v.dims or par.cond):
        raise unsupported(f"a lane-dependent write to one element of {buf.scope} buffer {buf.name}", s.loc)
    value = cast_text(em.tensor(s.value, v), s.value.dtype, buf.dtype, "tl")
    written = semantics.written_element_text("tl", _flat(em, buf), _lanes(em, buf), _flat_index(em, buf, idx), value)
    if buf.scope != "local":
        written = f"tl.reshape({written}, {padded_shape(buf.shape)})"
    em.emit(f"{em.name(buf)} = {written}")


# ---------------------------------------------------------------- T.Parallel


def lower_parallel(em: Emitter, s: ir.Parallel):
    if em.par is not None:
        raise unsupported("nested T.Parallel", s.loc)
    extents = list(s.extents)
    if not all(isinstance(e, int) and e > 0 for e in extents):
        raise unsupported(f"T.Parallel{tuple(extents)} with a runtime extent", s.loc)
    # an extent that is not a power of two runs on the next one, the lanes past it masked off
    # (they may read, never write)
    par = ParallelContext(s, shape=[1 << (e - 1).bit_length() for e in extents])
    for k, (var, ext, lanes) in enumerate(zip(s.vars, extents, par.shape)):
        name = em.name(var)
        em.emit(f"{name} = tl.arange(0, {lanes})")
        par.index[var] = axis_index(name, k, len(extents))
        if lanes != ext:
            inside = f"({par.index[var]} < {ext})"
            par.cond = inside if par.cond is None else f"({par.cond} & {inside})"
    em.par = par
    try:
        em.body(s.body)
    finally:
        em.par = None


# ---------------------------------------------------------------- control flow


def lower_if(em: Emitter, s: ir.If):
    cond = em.expr(s.cond)
    if em.par is not None:
        outer = em.par.cond
        em.par.cond = cond.text if outer is None else f"({outer} & {cond.text})"
        em.body(s.then_body)
        if s.else_body is not None and s.else_body.stmts:
            neg = f"({cond.text} == 0)"
            em.par.cond = neg if outer is None else f"({outer} & {neg})"
            em.body(s.else_body)
        em.par.cond = outer
        return
    em.emit(f"if {cond.text}:")
    em.depth += 1
    em.body(s.then_body)
    em.depth -= 1
    if s.else_body is not None and s.else_body.stmts:
        em.emit("else:")
        em.depth += 1
        em.body(s.else_body)
        em.depth -= 1


def pipeline_stages(em: Emitter, s: ir.For) -> int:
    """The stages a `T.Pipelined` loop asks Triton's pipeliner for: `num_stages`, or one more
    than the largest stage of a manual `stage=` schedule; 0 for other loops.  Capped by the
    loop's trip count as the Gluon backend's planner caps its stages (`capped_stages`), and
    stages that leave no room in shared memory are a CompileError at the loop before Triton is
    asked (`check_stages_fit`)."""
    if s.kind != "pipelined":
        return 0
    stages = capped_stages(s, s.num_stages or (max(s.stage) + 1 if s.stage else 0), let_bindings(em.func))
    check_stages_fit(s, stages, em.target.shared_memory_limit)
    return stages


def lower_for(em: Emitter, s: ir.For):
    if em.par is not None:
        return _lane_loop(em, s)
    start, stop, step = em.expr(s.start).text, em.expr(s.stop).text, em.expr(s.step).text
    bounds = f"{start}, {stop}" + ("" if static_int(s.step) == 1 else f", {step}")
    stages = pipeline_stages(em, s)
    if stages:
        rng = f"tl.range({bounds}, num_stages={stages})"
    elif unrolled(s):
        rng = f"tl.static_range({bounds})"
    else:
        rng = f"range({bounds})"
    em.emit(f"for {em.define(s.var)} in {rng}:")
    em.depth += 1
    em.body(s.body)
    em.depth -= 1


def _lane_loop(em: Emitter, s: ir.For):
    """A serial loop inside T.Parallel (semantics.lane_loop_bounds)."""
    start, stop, step = lane_loop_bounds(em, s)
    bounds = f"{start}, {stop}" + ("" if static_int(s.step) == 1 else f", {step}")
    em.emit(f"for {em.define(s.var)} in {'tl.static_range' if unrolled(s) else 'range'}({bounds}):")
    em.depth += 1
    em.body(s.body)
    em.depth -= 1


def lower_while(em: Emitter, s: ir.While):
    if em.par is not None:
        raise unsupported("a while loop inside T.Parallel", s.loc)
    em.emit(f"while {em.expr(s.cond).text}:")
    em.depth += 1
    em.body(s.body)
    em.depth -= 1


def lower_evaluate(em: Emitter, s: ir.Evaluate):
    em.emit(f"# T.{s.name}{tuple(s.args)!r}: no code")


def lower_print(em: Emitter, s: ir.Print):
    """T.print -> tl.device_print: ``pid (x, y, z) idx (i, j) msg: value`` per element."""
    if s.value is None:
        em.emit(f"tl.device_print({(s.msg if s.msg.startswith(' ') else ' ' + s.msg)!r})")
        return
    value = _tile(em, s.value, s.loc)[0] if isinstance(s.value, ir.Region) else em.expr(s.value).text
    em.emit(f"tl.device_print({s.msg!r}, {value})")


# ---------------------------------------------------------------- tiles and copies


def _partial(region: ir.Region, what: str, loc) -> CompileError:
    buf = region.buffer
    return unsupported(f"a partial region {buf.name}{list(region.extents)} of {buf.scope} buffer {buf.name} of shape "
                       f"{list(buf.shape)} ({what})", loc)


def _whole(region: ir.Region, loc):
    if tuple(region.extents) != tuple(region.buffer.shape) or any(static_int(x) != 0 for x in region.starts):
        raise _partial(region, "a register tile is read and written whole here", loc)


def _slice(em: Emitter, region: ir.Region, loc) -> tuple:
    """On-chip `region` as the buffer's register tile taken at one index along some dims
    (`x[k, :]`, semantics.sliced_dims) or in static ranges (`x[:4, :]`, semantics.static_ranges):
    ((dim, index text) of the one-index dims, (dim, start, extent) of the ranges, the shape of
    the tile left)."""
    dims = semantics.sliced_dims(region)
    if dims is not None:
        picks = [(d, em.expr(region.starts[d]).text) for d in dims]
        return picks, [], [n for d, n in enumerate(region.buffer.shape) if d not in dims]
    ranges = semantics.static_ranges(region)
    if ranges is None:
        raise _partial(region, "a register tile is read and written whole, at one index along some dims, or in "
                               "static ranges", loc)
    bad = semantics.misaligned_range(ranges)
    if bad is not None:
        raise _partial(region, f"a static range of dim {bad[0]} starts at a multiple of its extent padded to a "
                               f"power of two, not at {bad[1]}", loc)
    return [], ranges, list(region.extents)


def _range_masks(buf: ir.Buffer, ranges: list) -> list:
    shape = padded_shape(buf.shape)
    return semantics.range_masks([axis_index(f"tl.arange(0, {shape[d]})", d, len(shape)) for d, _, _ in ranges],
                                 ranges)


def _tile(em: Emitter, region: ir.Region, loc, shape=None) -> tuple:
    """(text, shape) of an on-chip region as a register tile (the dims it takes at one index
    selected away), reshaped to `shape` when given (which may add or drop unit dims)."""
    buf = region.buffer
    if buf.scope in ("local", "var"):
        raise unsupported(f"a tile operand in {buf.scope} buffer {buf.name}", loc)
    picks, ranges, have = _slice(em, region, loc)
    text = em.name(buf)
    if picks:
        text = semantics.selected_text("tl", text, _selection_masks(buf, picks), [d for d, _ in picks], buf.dtype)
    if ranges:
        text = semantics.range_selected_text("tl", text, padded_shape(buf.shape), _range_masks(buf, ranges), ranges,
                                             buf.dtype)
    if shape is None or list(shape) == have:
        return text, have
    if not have:  # one element (a scalar: Triton reshapes only tensors) into a tile of unit dims
        return f"tl.broadcast_to({text}, {padded_shape(shape)})", list(shape)
    expanded = _unit_dims_added(padded_shape(have), padded_shape(shape))
    if expanded is not None:
        return f"{text}[{expanded}]", list(shape)
    return f"tl.reshape({text}, {padded_shape(shape)})", list(shape)


def _unit_dims_added(have: list, shape: list):
    """The index text (`None, :`) that turns a tile of `have` into one of `shape` by inserting
    unit dims only, else None.  A row selected from a fragment (`semantics.selected_text`: a sum
    over the row dim) has the dot accumulator's layout sliced along that dim; indexing it with
    None (`expand_dims`) gives back the accumulator's own layout, so putting it in place
    (`T.Parallel(1, 128)` over one row of a 128x128 wgmma accumulator) is free, where
    `tl.reshape(row, [1, 128])` infers another layout and Triton 3.6 spent ~35 s (on the CPU)
    compiling its conversion back to the accumulator's (FP8 seed 3333 mutant #255; 0.6 s
    with the expand_dims).  Same values either way: only the layout differs."""
    index, k = [], 0
    for n in shape:
        if k < len(have) and have[k] == n:
            index.append(":")
            k += 1
        elif n == 1:
            index.append("None")
        else:
            return None
    return ", ".join(index) if k == len(have) and len(shape) != len(have) else None


def _assign_tile(em: Emitter, region: ir.Region, value: str, src_dtype, shape: list, loc):
    """Write `value` (a tile of `shape`, IR dtype `src_dtype`) to on-chip `region`: the whole
    buffer, or its lanes at the indices the region takes along some dims or in its static ranges
    (a select)."""
    buf = region.buffer
    if buf.scope in ("local", "var"):
        raise unsupported(f"a tile written to {buf.scope} buffer {buf.name}", loc)
    picks, ranges, kept = _slice(em, region, loc)
    if [d for d in shape if d != 1] != [d for d in kept if d != 1]:
        raise unsupported(f"a tile of shape {shape} written to {buf.name}{list(region.extents)}", loc)
    written = list(region.extents)  # 1 along the one-index dims
    if list(shape) != written:
        value = f"tl.reshape({value}, {padded_shape(written)})"
    value = cast_text(value, src_dtype, buf.dtype, "tl")
    if picks:
        value = semantics.written_text("tl", em.name(buf), _selection_masks(buf, picks), value)
    if ranges:
        value = semantics.range_spread_text("tl", value, padded_shape(buf.shape), ranges)
        value = semantics.written_text("tl", em.name(buf), _range_masks(buf, ranges), value)
    em.emit(f"{em.name(buf)} = {value}")


def _register_shape(em: Emitter, region: ir.Region, loc) -> list:
    """The shape of on-chip `region`'s register tile (`_slice`)."""
    return _slice(em, region, loc)[2]


def lower_copy(em: Emitter, s: ir.Copy):
    src, dst = s.src, s.dst
    ss, ds = src.buffer.scope, dst.buffer.scope
    for b in (src.buffer, dst.buffer):
        if b.scope in ("local", "var"):
            raise unsupported(f"T.copy from/to {b.scope} buffer {b.name}", s.loc)
    if tuple(src.tile_shape) != tuple(dst.tile_shape):
        return _reshaping_copy(em, s)
    if ss == "global":
        shape = _register_shape(em, dst, s.loc) if ds != "global" else list(dst.tile_shape)
        value = em.load_tile(src, shape, s.loc)
        if ds != "global":
            return _assign_tile(em, dst, value, src.buffer.dtype, shape, s.loc)
        tmp = em.tmp("v")
        em.emit(f"{tmp} = {cast_text(value, src.buffer.dtype, dst.buffer.dtype, 'tl')}")
        em.store_tile(dst, tmp, shape, s.loc)
        return
    value, shape = _tile(em, src, s.loc)
    if ds == "global":
        em.store_tile(dst, cast_text(value, src.buffer.dtype, dst.buffer.dtype, 'tl'), shape, s.loc)
        return
    _assign_tile(em, dst, value, src.buffer.dtype, shape, s.loc)


def _reshaping_copy(em: Emitter, s: ir.Copy):
    """A T.copy between on-chip tiles of different shapes and as many elements (an on-chip
    view's copy, lowering/buffer_views.py): the elements in row-major order, `tl.reshape`."""
    src, dst = s.src, s.dst
    what = f"a T.copy that reshapes {list(src.tile_shape)} into {list(dst.tile_shape)}"
    if "global" in (src.buffer.scope, dst.buffer.scope):
        raise unsupported(f"{what} from or to a global tensor (reshape the tensor with T.reshape)", s.loc)
    value, have = _tile(em, src, s.loc)
    want = _register_shape(em, dst, s.loc)
    if is_padded(have) or is_padded(want):
        raise unsupported(f"{what}: a tile whose extents are not powers of two is padded (ir/padding.py), and "
                          f"its row-major order is not the padded tile's", s.loc)
    _assign_tile(em, dst, f"tl.reshape({value}, {list(want)})", src.buffer.dtype, list(want), s.loc)


# ---------------------------------------------------------------- gemm

_DOT_MIN = 16  # tl.dot needs every dim >= 16


def lower_gemm(em: Emitter, s: ir.Gemm):
    """C (+)= op(A) @ op(B): `tl.dot` (computing in the operands' dtype - operands of two dtypes in
    a float accumulator's, as the Gluon backend's FMA path; float32 as IEEE fp32, like torch and
    the interpreter, unless the gemm is tf32: then its operands are truncated to TF32 first, so
    Triton's interpreter computes what the tensor cores do), or, for tiles with a dim under 16, a
    broadcast product summed over K in the accumulator's dtype."""
    gemm_accumulators.check(s, em.backend)
    c = s.c.buffer
    _whole(s.c, s.loc)
    if len(c.shape) != 2:
        raise unsupported(f"T.gemm into a {len(c.shape)}-D accumulator {c.name}", s.loc)
    compute = s.a.buffer.dtype
    if s.b.buffer.dtype != compute and c.dtype.is_float:
        compute = c.dtype
    operands = []
    for region, transposed in ((s.a, s.transpose_a), (s.b, s.transpose_b)):
        tile = list(region.tile_shape)
        if len(tile) != 2:
            raise unsupported(f"T.gemm operand {region.buffer.name} of shape {tile}", s.loc)
        text, _ = _tile(em, region, s.loc, tile)
        if transposed:
            text = f"tl.trans({text})"
        if region.buffer.dtype != compute:
            text = cast_text(text, region.buffer.dtype, compute, "tl")
        if s.tf32:
            text = f"({text}.to(tl.int32, bitcast=True) & -{1 << 13}).to(tl.float32, bitcast=True)"
        operands.append(text)
    a, b = operands
    m, n = padded_shape(c.shape)  # the tiles' shapes (ir/padding.py): a padded K adds 0 * 0
    k = padded_shape(s.a.tile_shape)[0 if s.transpose_a else 1]
    cname, acc = em.name(c), dtype_text(c.dtype, "tl")
    if min(m, n, k) >= _DOT_MIN:
        precision = (', input_precision="tf32"' if s.tf32 else
                     ', input_precision="ieee"' if compute.name == "float32" else "")
        if s.clear_accum:
            em.emit(f"{cname} = tl.dot({a}, {b}{precision}, out_dtype={acc})")
        else:
            em.emit(f"{cname} = tl.dot({a}, {b}, {cname}{precision}, out_dtype={acc})")
        return
    product = f"tl.sum({a}.to({acc})[:, :, None] * {b}.to({acc})[None, :, :], axis=1)"
    em.emit(f"{cname} = {product}" if s.clear_accum else f"{cname} = {cname} + {product}")


# ---------------------------------------------------------------- fill / reductions / atomics


def lower_fill(em: Emitter, s: ir.Fill):
    buf = s.dst.buffer
    if is_scalar_buffer(buf):
        em.emit(f"{em.name(buf)} = {cast_text(em.tensor(s.value), s.value.dtype, buf.dtype, 'tl')}")
        return
    v = em.expr(s.value)
    if v.dims:
        raise unsupported("T.fill with a value that varies along a T.Parallel", s.loc)
    if buf.scope == "local":
        em.emit(f"{em.name(buf)} = {em.splat(s.value, v, buf.dtype, [padded_size(buf)])}")
        return
    if buf.scope == "global":
        shape = list(s.dst.tile_shape)
        ptr, mask = em.global_tile(s.dst, shape, s.loc)
        em.emit(f"tl.store({ptr}, {em.splat(s.value, v, buf.dtype, shape)}{semantics.mask_argument(mask)})")
        return
    shape = _register_shape(em, s.dst, s.loc)
    filled = _masked_pads(em.splat(s.value, v, buf.dtype, padded_shape(shape)), shape)
    _assign_tile(em, s.dst, filled, buf.dtype, shape, s.loc)


def _masked_pads(tile: str, shape, pad_value: str = "0") -> str:
    """`tile` (of `shape`'s padded shape) with its pad lanes set to `pad_value` (ir/padding.py);
    `tile` itself when `shape` has none."""
    inside = [f"({axis_index(f'tl.arange(0, {p})', a, len(shape))} < {d})"
              for a, (d, p) in enumerate(zip(shape, padded_shape(shape))) if d != p]
    if not inside:
        return tile
    return f"tl.where({' & '.join(inside)}, {tile}, {pad_value})"


def lower_reduce(em: Emitter, s: ir.Reduce):
    src_shape = list(s.src.tile_shape)
    src, _ = _tile(em, s.src, s.loc, src_shape)
    out_shape = src_shape[:s.dim] + src_shape[s.dim + 1:]
    if [d for d in s.dst.tile_shape if d != 1] != [d for d in out_shape if d != 1]:
        raise unsupported(f"T.reduce_{s.kind} of {src_shape} along dim {s.dim} into shape "
                          f"{list(s.dst.tile_shape)}", s.loc)
    src = _masked_pads(src, src_shape, semantics.reduction_identity(s.kind, s.src.buffer.dtype))  # pad lanes change nothing
    new = em.tmp("red")
    reduction, computed = semantics.reduction_text(s.kind, src, s.src.buffer.dtype, s.dim, s.nan_propagate, "tl")
    em.emit(f"{new} = {reduction}")
    if not out_shape:  # a 1-D tile reduced to one value
        out_shape = [1]
        em.emit(f"{new} = tl.broadcast_to({new}, [1])")
    if is_padded(out_shape):  # the pad lanes of the result: 0 (ir/padding.py)
        em.emit(f"{new} = {_masked_pads(new, out_shape)}")
    if not s.clear:
        old, _ = _tile(em, s.dst, s.loc, out_shape)
        combined, computed = semantics.reduction_combine_text(s.kind, old, s.dst.buffer.dtype, new, computed,
                                                              s.src.buffer.dtype, s.nan_propagate, "tl")
        em.emit(f"{new} = {combined}")
    _assign_tile(em, s.dst, new, computed, out_shape, s.loc)


def lower_cumsum(em: Emitter, s: ir.Cumsum):
    if tuple(s.src.tile_shape) != tuple(s.dst.tile_shape):
        raise unsupported("T.cumsum with different source and destination shapes", s.loc)
    src, shape = _tile(em, s.src, s.loc)
    tmp = em.tmp("scan")
    em.emit(f"{tmp} = tl.associative_scan({src}, {s.dim}, _add_combine, reverse={s.reverse})")
    tmp = _masked_pads(tmp, shape)  # a forward scan's pad lanes hold the total
    _assign_tile(em, s.dst, tmp, s.src.buffer.dtype, shape, s.loc)


def lower_cum_extremum(em: Emitter, s: ir.CumExtremum):
    """`T.cummax` / `T.cummin`: an associative scan with the NaN-propagating max / min combine."""
    if tuple(s.src.tile_shape) != tuple(s.dst.tile_shape):
        raise unsupported(f"T.cum{s.kind} with different source and destination shapes", s.loc)
    src, shape = _tile(em, s.src, s.loc)
    if is_padded(shape):  # a reversed scan would start from the pad lanes
        raise unsupported(f"T.cum{s.kind} of a tile whose extents are not powers of two", s.loc)
    tmp = em.tmp("scan")
    em.emit(f"{tmp} = tl.associative_scan({src}, {s.dim % len(shape)}, _{s.kind}_propagate_nan, "
            f"reverse={s.reverse})")
    _assign_tile(em, s.dst, tmp, s.src.buffer.dtype, shape, s.loc)


def lower_atomic_add(em: Emitter, s: ir.AtomicAdd):
    dst = s.dst
    buf = dst.buffer
    if buf.scope != "global":
        raise unsupported(f"T.atomic_{s.kind} into {buf.scope} buffer {buf.name}", s.loc)
    if isinstance(s.value, ir.Region):
        if s.value.buffer.scope == "global":  # a global tile added elsewhere: read it first
            shape = list(s.value.tile_shape)
            value = em.load_tile(s.value, shape, s.loc)
        else:
            value, shape = _tile(em, s.value, s.loc)
        ptr, mask = em.global_tile(dst, shape, s.loc)
        em.emit(semantics.atomic_text(em, s, ptr, cast_text(value, s.value.buffer.dtype, buf.dtype, 'tl'), mask,
                                      len(shape)))
        return
    idx = [em.expr(x) for x in dst.starts]
    v = em.expr(s.value)
    ptr = f"{em.name(buf)} + {_offsets(em, buf, idx)}"
    prev = "" if s.prev is None else f"{em.define(s.prev)} = "
    par = em.par
    if par is None:  # one atomic of the program
        value = cast_text(em.tensor(s.value, v), s.value.dtype, buf.dtype, 'tl')
        em.emit(prev + semantics.atomic_text(em, s, ptr, value, None, 0))
        return
    # one atomic per lane, also where address and value are the same on every lane (TileLang's
    # T.Parallel runs every iteration)
    full = par.shape
    mask = semantics.bounds_mask(em, dst.starts, idx, buf) + (f" & {par.cond}" if par.cond else "")
    em.emit(prev + semantics.atomic_text(em, s, f"tl.broadcast_to({ptr}, {full})",
                                         em.splat(s.value, v, buf.dtype, full),
                                         f"tl.full({full}, True, tl.int1) & {mask}", len(full)))
    if s.prev is not None:
        em.let_dims[id(s.prev)] = frozenset(range(len(full)))


RULES = {
    ir.Seq: lower_seq,
    ir.Alloc: lower_alloc,
    ir.Let: lower_let,
    ir.Store: lower_store,
    ir.Copy: lower_copy,
    ir.Gemm: lower_gemm,
    ir.Fill: lower_fill,
    ir.Reduce: lower_reduce,
    ir.Cumsum: lower_cumsum,
    ir.CumExtremum: lower_cum_extremum,
    ir.AtomicAdd: lower_atomic_add,
    ir.Parallel: lower_parallel,
    ir.If: lower_if,
    ir.For: lower_for,
    ir.While: lower_while,
    ir.Evaluate: lower_evaluate,
    ir.Print: lower_print,
    ir.DeviceAssert: semantics.lower_device_assert,
    ir.ThreadBarrier: semantics.lower_thread_barrier,
}
