"""Tile operations of the reference interpreter: whole-tile torch ops on regions.

Contract
--------
Each function executes one tile statement for the current block through `run` (the
`BlockRunner`: evaluation, `memory`, `tracker`).  Region starts must be scalars (tile ops
are not allowed inside `T.Parallel`, except the scalar form of `AtomicAdd`).  Operand
shapes are `Region.tile_shape` (extents with unit dims dropped), and the `dim` of reduce
and cumsum indexes it, as in the frontend; so `dim` means the same before and after buffer
versioning (the stage dimension of ``A_shared[slot, :, :]`` is a unit dim).  Numerics: compute in float32 (float64 for float64 or integer gemm operands),
round on store.
"""
from __future__ import annotations

import torch

from tritile.interpreter import values as V
from tritile.ir import nodes as ir
from tritile.ir.dtypes import truncate_to_tf32
from tritile.ir.printer import region_str
from tritile.ir.verifier import gemm_mnk


def _read(run, region: ir.Region, **kw) -> torch.Tensor:
    return run.memory.read_region(region, run.starts(region), run.stmt, **kw)


def _write(run, region: ir.Region, value: torch.Tensor, **kw):
    run.memory.write_region(region, run.starts(region), value.reshape(region.extents), run.stmt, **kw)


def _dim(run, region: ir.Region, dim: int) -> int:
    ndim = len(region.tile_shape)
    if not -ndim <= dim < ndim:
        raise run.error(f"dim={dim} is out of range for {region_str(region)} with tile shape "
                        f"{list(region.tile_shape)}")
    return dim % ndim


def copy(run, s: ir.Copy):
    tile = _read(run, s.src)
    if s.src.buffer is s.dst.buffer:
        tile = tile.clone()
    if s.src.buffer.dtype != s.dst.buffer.dtype:  # a conversion (to fp8: saturating)
        tile = V.convert_tensor(tile, s.dst.buffer.dtype)
    _write(run, s.dst, tile)


def async_copy(run, s: ir.AsyncCopy):
    data = _read(run, s.src).clone().reshape(s.dst.extents)  # the source is read at issue time
    starts = run.starts(s.dst)
    box = run.memory.region_box(s.dst, starts, s)
    if s.slot is not None and s.dst.buffer.num_versions > 1:
        slot = run.scalar(s.slot)
        if slot != starts[0]:
            raise run.error(f"T.async_copy is tagged slot {slot} but writes {region_str(s.dst)} at slot "
                            f"{starts[0]}")
    run.tracker.check(s.dst.buffer, box, s, write=True)
    memory = run.memory
    run.tracker.issue_copy(s, s.dst.buffer, box,
                           land=lambda: memory.write_region(s.dst, starts, data, s, check=False),
                           iteration=None if s.iteration is None else run.scalar(s.iteration))


def commit_group(run, s: ir.CommitGroup):
    run.tracker.commit(s, None if s.iteration is None else run.scalar(s.iteration))


def wait_group(run, s: ir.WaitGroup):
    run.tracker.wait_group(s, None if s.iteration is None else run.scalar(s.iteration))


def gemm(run, s: ir.Gemm):
    m, n, _ = gemm_mnk(s)
    wide = any(r.buffer.dtype.bits == 64 for r in (s.a, s.b, s.c)) or not (
        s.a.buffer.dtype.is_float and s.b.buffer.dtype.is_float)
    compute = torch.float64 if wide else torch.float32
    a = _read(run, s.a).reshape(s.a.tile_shape)
    b = _read(run, s.b).reshape(s.b.tile_shape)
    if s.tf32:
        a, b = truncate_to_tf32(a.float()), truncate_to_tf32(b.float())
    a, b = a.to(compute), b.to(compute)
    product = (a.t() if s.transpose_a else a) @ (b.t() if s.transpose_b else b)
    c_starts = run.starts(s.c)
    c_box = run.memory.region_box(s.c, c_starts, s)
    run.tracker.check(s.c.buffer, c_box, s, write=True, async_accumulate=s.is_async)
    if not s.clear_accum:
        product = product + _read(run, s.c, check=False).reshape(m, n).to(compute)
    _write(run, s.c, product, check=False)
    if s.is_async:
        operands = [(r.buffer, run.memory.region_box(r, run.starts(r), s)) for r in (s.a, s.b)]
        run.tracker.issue_mma(s, operands, (s.c.buffer, c_box))


def wait_mma(run, s: ir.WaitMMA):
    run.tracker.wait_mma(s)


def fill(run, s: ir.Fill):
    value = run.scalar(s.value)
    _write(run, s.dst, torch.full(s.dst.extents, value, dtype=V.compute_dtype(s.dst.buffer.dtype)))


def _ignoring_nan(extreme, fill):
    """max / min of floats ignoring NaN (the GPU's maxnumf tree): NaN only where every value
    along `dim` is NaN."""
    def reducer(x, dim):
        if not x.is_floating_point():
            return extreme(x, dim)
        nan = torch.isnan(x)
        result = extreme(torch.where(nan, torch.full((), fill, dtype=x.dtype), x), dim)
        return torch.where(nan.all(dim), torch.full((), float("nan"), dtype=x.dtype), result)
    return reducer


def _bitwise(op):
    """A bitwise reduction along `dim` (torch has none): `op` folded over the slices."""
    def reducer(x, dim):
        out = None
        for part in x.unbind(dim):
            out = part if out is None else op(out, part)
        return out
    return reducer


_max_ignoring_nan = _ignoring_nan(torch.amax, float("-inf"))
_REDUCERS = {
    "max": _max_ignoring_nan,
    "min": _ignoring_nan(torch.amin, float("inf")),
    "sum": lambda x, dim: x.sum(dim),
    "abssum": lambda x, dim: x.sum(dim),  # abs* reduce |x|, taken by `reduce`
    "absmax": _max_ignoring_nan,
    "bitand": _bitwise(torch.bitwise_and), "bitor": _bitwise(torch.bitwise_or), "bitxor": _bitwise(torch.bitwise_xor),
}
# nan_propagate=True: torch's amax / amin propagate NaN
_REDUCERS_PROPAGATING_NAN = {"max": lambda x, dim: x.amax(dim), "min": lambda x, dim: x.amin(dim),
                             "absmax": lambda x, dim: x.amax(dim)}
# how a reduction result combines with the old destination when clear=False (fmax: NaN-ignoring)
_COMBINE = {"max": torch.fmax, "min": torch.fmin, "sum": torch.add, "abssum": torch.add, "absmax": torch.fmax,
            "bitand": torch.bitwise_and, "bitor": torch.bitwise_or, "bitxor": torch.bitwise_xor}
_COMBINE_PROPAGATING_NAN = {"max": torch.maximum, "min": torch.minimum, "absmax": torch.maximum}


def reduce(run, s: ir.Reduce):
    if s.kind not in _REDUCERS:
        raise run.error(f"unknown reduction {s.kind!r}")
    src = _read(run, s.src).reshape(s.src.tile_shape)
    if s.kind in ("abssum", "absmax"):  # |x| in the source's type: integer abs wraps, abs(INT_MIN) == INT_MIN
        src = src if src.dtype == torch.bool else V.round_tensor(src.abs(), s.src.buffer.dtype)
    propagate = s.nan_propagate and s.kind in _REDUCERS_PROPAGATING_NAN
    reducer = (_REDUCERS_PROPAGATING_NAN if propagate else _REDUCERS)[s.kind]
    result = reducer(src, _dim(run, s.src, s.dim))
    if result.numel() != _numel(s.dst.extents):
        raise run.error(f"T.reduce_{s.kind}: {region_str(s.dst)} has {_numel(s.dst.extents)} elements but "
                        f"reducing {region_str(s.src)} over dim {s.dim} gives shape {list(result.shape)}")
    if not s.clear:
        combine = (_COMBINE_PROPAGATING_NAN if propagate else _COMBINE)[s.kind]
        result = combine(_read(run, s.dst).reshape(result.shape), result)
    _write(run, s.dst, result)


def _scan(run, s, name, scan):
    """`scan(tile, dim)` of `s.src` along `s.dim` (from the end when `s.reverse`) into `s.dst`."""
    src = _read(run, s.src).reshape(s.src.tile_shape)
    dim = _dim(run, s.src, s.dim)
    if s.reverse:
        result = scan(src.flip(dim), dim).flip(dim)
    else:
        result = scan(src, dim)
    if result.numel() != _numel(s.dst.extents):
        raise run.error(f"T.{name}: {region_str(s.dst)} and {region_str(s.src)} differ in size")
    _write(run, s.dst, result)


def cumsum(run, s: ir.Cumsum):
    _scan(run, s, "cumsum", torch.cumsum)


def cum_extremum(run, s: ir.CumExtremum):
    scan = torch.cummax if s.kind == "max" else torch.cummin
    _scan(run, s, f"cum{s.kind}", lambda tile, dim: scan(tile, dim).values)


def atomic_add(run, s: ir.AtomicAdd):
    """`T.atomic_add` / `T.atomic_max` / `T.atomic_min` (`s.kind`)."""
    if isinstance(s.value, ir.Region):
        value = _read(run, s.value)
        if value.numel() != _numel(s.dst.extents):
            raise run.error(f"T.atomic_{s.kind}: {region_str(s.dst)} and {region_str(s.value)} differ in size")
        _write(run, s.dst, value, accumulate=s.kind)
        return
    if any(e != 1 for e in s.dst.extents):
        raise run.error(f"T.atomic_{s.kind} of a scalar needs a single element, got {region_str(s.dst)}")
    indices = [run.eval(i) for i in s.dst.starts]  # lane tensors inside T.Parallel
    value = run.eval(s.value)
    if run.lane_ndim:  # one atomic per lane, also where address and value are the same on every lane
        value = V.as_tensor(value, V.compute_dtype(s.dst.buffer.dtype)).expand(run.lane_shape)
    if s.prev is not None:
        run.env[s.prev] = run.memory.atomic(s.dst.buffer, indices, value, run.mask, s, s.kind)
    else:  # the same effect, the lanes of one element combined at once
        run.memory.store(s.dst.buffer, indices, value, run.mask, s, accumulate=s.kind != "exchange" and s.kind)


def _numel(shape) -> int:
    n = 1
    for e in shape:
        n *= e
    return n
