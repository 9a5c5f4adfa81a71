"""Buffer storage of one thread block: region and element reads/writes with TileLang's
bounds rules and the async-hazard checks.

Contract
--------
* Global buffers are the caller's tensors (written in place); on-chip buffers are fresh
  per block (`allocate`).
* Regions (tile ops): out-of-bounds global reads give 0 (or the tensor's
  `T.annotate_safe_value`: `out_of_bounds_value`), out-of-bounds global writes are dropped;
  an out-of-bounds on-chip region is a user error (`CompileError`).
* Elements (`Load`/`Store`/scalar `AtomicAdd`): indices are Python ints or broadcastable
  int64 tensors (one lane per element inside `T.Parallel`); `mask` (bool tensor or None)
  selects the active lanes.  Inactive lanes never write and never fail; out-of-bounds
  global lanes read 0 (or the safe value) and drop their write; an active out-of-bounds
  on-chip lane is a `CompileError`.
* Every access is checked against the block's `AsyncTracker` before it happens (writes
  with ``check=False`` are the landing of an async copy, which the tracker itself does).
* Values written are rounded to the buffer's dtype; values read come back in the compute
  dtype (`tritile.interpreter.values`).
"""
from __future__ import annotations

import ctypes
import math

import torch

from tritile.errors import CompileError
from tritile.interpreter import values as V
from tritile.interpreter.hazards import AsyncTracker
from tritile.ir import nodes as ir
from tritile.ir.printer import region_str


def _raw_bytes(address: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 tensor over `nbytes` bytes of memory at `address` on `device` (no copy)."""
    if device.type == "cpu":
        return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(address), dtype=torch.uint8)

    class _Interface:  # what a CUDA array exposes: torch wraps the memory, owning nothing
        __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False), "version": 2}

    return torch.as_tensor(_Interface(), device=device)


class Memory:
    def __init__(self, tracker: AsyncTracker, globals_: dict):
        self.tracker = tracker
        self._tensors = dict(globals_)  # Buffer -> storage tensor
        self.scalars = dict  # the block's scalars now (the executor's): the addresses of T.make_tensor tensors

    def allocate(self, buffer: ir.Buffer, shape: tuple):
        self._tensors[buffer] = V.allocate(shape, buffer.dtype)

    def bind_view(self, view: ir.Buffer, stmt):
        """From here on `view` (an on-chip `T.reshape` / `T.view`) names its storage's bytes."""
        storage = self.tensor(view.view_of, stmt)
        self._tensors[view] = V.storage_view(V.reinterpret(storage, view.dtype, view.shape), view.dtype)

    def tensor(self, buffer: ir.Buffer, stmt) -> torch.Tensor:
        if buffer.address is not None:  # a T.make_tensor tensor: the memory at its address now
            return self._address_tensor(buffer, stmt)
        try:
            return self._tensors[buffer]
        except KeyError:
            raise CompileError(f"buffer {buffer.name} is used before its allocation",
                               getattr(stmt, "loc", None)) from None

    def _address_tensor(self, buffer: ir.Buffer, stmt) -> torch.Tensor:
        """The memory a `T.make_tensor` tensor names: `buffer.shape` row-major elements from the
        address its Let bound (`self.scalars()`, the block's), as a tensor sharing that memory - on the
        device of the call's tensors, as the kernel would address it.  Like the kernel, it trusts
        the address (the memory must be alive and hold the whole shape), but checks what the
        backends assume of it: 16-byte aligned."""
        try:
            address = int(self.scalars()[buffer.address])
        except (KeyError, TypeError):
            raise CompileError(f"tensor {buffer.name} (T.make_tensor) is used before its address is bound",
                               getattr(stmt, "loc", None)) from None
        itemsize = buffer.dtype.torch.itemsize
        if address == 0 or address % 16:  # the backends assume it 16-byte aligned, as every tensor argument
            raise CompileError(f"tensor {buffer.name} (T.make_tensor): address {address:#x} is null or not "
                               f"16-byte aligned", getattr(stmt, "loc", None))
        device = next((t.device for t in self._tensors.values()), torch.device("cpu"))
        raw = _raw_bytes(address, math.prod(buffer.shape) * itemsize, device)
        return V.storage_view(raw.view(buffer.dtype.torch).view(buffer.shape), buffer.dtype)

    # ------------------------------------------------------------------ regions
    def region_box(self, region: ir.Region, starts: tuple, stmt) -> tuple:
        """The in-bounds part of the region as a box (empty ranges when fully outside)."""
        shape = self.tensor(region.buffer, stmt).shape
        box = []
        for start, extent, size in zip(starts, region.extents, shape):
            lo, hi = max(start, 0), min(start + extent, size)
            box.append((lo, max(lo, hi)))
        if region.buffer.scope != "global" and any(
                lo != s or hi != s + e for (lo, hi), s, e in zip(box, starts, region.extents)):
            raise CompileError(f"region {region_str(region)} (starts {list(starts)}) is out of bounds of "
                               f"{region.buffer.name}{list(shape)}", getattr(stmt, "loc", None))
        return tuple(box)

    def read_region(self, region: ir.Region, starts: tuple, stmt, check: bool = True) -> torch.Tensor:
        """The region's values, shape = `region.extents`, in the compute dtype."""
        buffer = region.buffer
        tensor = self.tensor(buffer, stmt)
        box = self.region_box(region, starts, stmt)
        if check and self.tracker.busy(buffer):
            self.tracker.check(buffer, box, stmt, write=False)
        inside = tensor[tuple(slice(lo, hi) for lo, hi in box)]
        if tuple(inside.shape) == tuple(region.extents):
            return V.from_storage(inside, buffer.dtype)
        out = torch.full(region.extents, out_of_bounds_value(buffer), dtype=V.compute_dtype(buffer.dtype))
        out[_offsets(box, starts)] = V.from_storage(inside, buffer.dtype)
        return out

    def write_region(self, region: ir.Region, starts: tuple, value: torch.Tensor, stmt, *,
                     accumulate: bool = False, check: bool = True, async_accumulate: bool = False):
        """Store `value` (shape = `region.extents`) into the region, or combine it with the old
        values when `accumulate` (True or "add", "max", "min": `combine`); out-of-bounds
        global parts are dropped."""
        buffer = region.buffer
        tensor = self.tensor(buffer, stmt)
        box = self.region_box(region, starts, stmt)
        if check and self.tracker.busy(buffer):
            self.tracker.check(buffer, box, stmt, write=True, async_accumulate=async_accumulate)
        if any(lo == hi for lo, hi in box):
            return
        dst = tensor[tuple(slice(lo, hi) for lo, hi in box)]
        part = value[_offsets(box, starts)]
        if accumulate:
            part = combine(accumulate, V.from_storage(dst, buffer.dtype), part)
        dst.copy_(V.round_tensor(part, buffer.dtype))

    # ------------------------------------------------------------------ elements
    def load(self, buffer: ir.Buffer, indices: list, mask, stmt):
        tensor, indices = self._element_view(buffer, indices, stmt)
        if all(isinstance(i, int) for i in indices):
            if not _in_bounds(indices, tensor.shape):
                if buffer.scope != "global" and (mask is None or bool(mask.any())):
                    self._oob(buffer, indices, tensor.shape, stmt)
                return out_of_bounds_value(buffer)
            if self.tracker.busy(buffer):
                self.tracker.check(buffer, tuple((i, i + 1) for i in indices), stmt, write=False)
            return V.from_storage(tensor[tuple(indices)], buffer.dtype).item()
        box = None if self.tracker.busy(buffer) else _dense_box(indices, tensor.shape)
        if box is not None:
            slices, lane_dims, lane_shape = box
            tile = V.from_storage(tensor[slices].permute(_argsort(lane_dims)).reshape(lane_shape), buffer.dtype)
            # a view of the storage would follow later stores (a Let's `val = s[i]` before `s[i] = s[j]`,
            # bitonic sort's swap) and overlap a store's destination (`s[i + 1] = s[i]`): a snapshot
            return tile.clone() if tile.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr() else tile
        indices, valid = self._lanes(buffer, indices, tensor.shape, mask, stmt)
        clamped = [i.clamp(0, size - 1) for i, size in zip(indices, tensor.shape)]
        if self.tracker.busy(buffer):
            self.tracker.check(buffer, _lane_box(clamped, mask), stmt, write=False)
        out = V.from_storage(tensor[tuple(clamped)], buffer.dtype)
        if valid is not None:
            out = torch.where(valid, out, torch.full((), out_of_bounds_value(buffer), dtype=out.dtype))
        return out

    def store(self, buffer: ir.Buffer, indices: list, value, mask, stmt, accumulate: bool = False):
        tensor, indices = self._element_view(buffer, indices, stmt)
        if mask is None and not V.is_tensor(value) and all(isinstance(i, int) for i in indices):
            if not _in_bounds(indices, tensor.shape):
                if buffer.scope != "global":
                    self._oob(buffer, indices, tensor.shape, stmt)
                return
            if self.tracker.busy(buffer):
                self.tracker.check(buffer, tuple((i, i + 1) for i in indices), stmt, write=True)
            index = tuple(indices)
            if accumulate:
                value = combine(accumulate, V.from_storage(tensor[index], buffer.dtype), value).item()
            tensor[index] = V.storage_scalar(value, buffer.dtype)
            return
        if not V.is_tensor(value):  # a Python float would become float32, losing float64 digits
            value = V.as_tensor(value, V.compute_dtype(buffer.dtype))
        box = None if self.tracker.busy(buffer) else _dense_box(indices, tensor.shape)
        if box is not None and _fits(value, box[2]) and (mask is None or _fits(mask, box[2])):
            self._store_box(tensor, buffer, box, value, mask, accumulate)
            return
        indices, valid = self._lanes(buffer, indices, tensor.shape, mask, stmt)
        shape = torch.broadcast_shapes(value.shape, *(i.shape for i in indices),
                                       *(() if mask is None else (mask.shape,)))
        active = valid if mask is None else (mask if valid is None else mask & valid)
        lanes = [i.expand(shape) for i in indices]
        value = value.expand(shape)
        if active is not None:
            active = active.expand(shape)
            if not bool(active.any()):
                return
            lanes = [i[active] for i in lanes]
            value = value[active]
        if self.tracker.busy(buffer):
            self.tracker.check(buffer, _lane_box(lanes, None), stmt, write=True)
        if accumulate:
            self._accumulate(tensor, buffer, lanes, value, accumulate)
        else:
            tensor.index_put_(tuple(lanes), V.round_tensor(value, buffer.dtype).to(tensor.dtype))

    def atomic(self, buffer: ir.Buffer, indices: list, value, mask, stmt, kind: str):
        """An atomic update of `kind` ("add", "max", "min", "exchange") of the addressed elements
        (`store`'s rules), one per lane; returns each lane's previous value (0 for inactive or
        out-of-bounds lanes).  Lanes of one element take effect one after another in row-major
        lane order, each seeing the rounded result of the ones before it."""
        prev = self.load(buffer, indices, mask, stmt)
        if V.is_tensor(prev):
            prev = prev.clone()  # a load may be a view of the storage the update writes
        if not any(V.is_tensor(x) and x.dim() for x in (value, *indices)):
            self.store(buffer, indices, value, mask, stmt, accumulate=kind != "exchange" and kind)
            return prev
        tensor, flat = self._element_view(buffer, indices, stmt)
        shape = torch.broadcast_shapes(*(V.as_tensor(x).shape for x in (value, *flat)),
                                       *(() if mask is None else (mask.shape,)))
        lanes, valid = self._lanes(buffer, [V.as_tensor(i).expand(shape) for i in flat], tensor.shape, mask, stmt)
        active = valid if mask is None else (mask if valid is None else mask & valid)
        active = torch.ones(shape, dtype=torch.bool) if active is None else active.expand(shape)
        points = torch.stack([i.expand(shape)[active] for i in lanes], dim=1)
        if torch.unique(points, dim=0).shape[0] == points.shape[0]:  # every lane its own element
            self.store(buffer, indices, value, mask, stmt, accumulate=kind != "exchange" and kind)
            return prev
        compute = V.compute_dtype(buffer.dtype)
        prev = V.as_tensor(prev, compute).expand(shape).clone()
        values = V.as_tensor(value, compute).expand(shape)[active]
        current, seen, after = {}, [], []
        for point, new in zip(map(tuple, points.tolist()), values):
            old = current.get(point, V.from_storage(tensor[point], buffer.dtype))
            seen.append(old)
            current[point] = V.round_tensor(new if kind == "exchange" else combine(kind, old, new), buffer.dtype)
        for point in map(tuple, points.tolist()):
            after.append(current[point])  # every lane of an element writes the element's last value
        prev[active] = torch.stack(seen).to(compute)
        final = torch.zeros(shape, dtype=compute)
        final[active] = torch.stack(after).to(compute)
        self.store(buffer, indices, final, active, stmt)
        return prev

    @staticmethod
    def _store_box(tensor, buffer, box, value, mask, accumulate):
        """Store lanes that address a dense box one-to-one: a sliced write, no scatter."""
        slices, lane_dims, lane_shape = box
        dst = tensor[slices]
        to_buffer_order = _argsort(_argsort(lane_dims))
        squeezed = tuple(lane_shape[d] for d in sorted(lane_dims))

        def in_buffer_order(lanes):
            return lanes.expand(lane_shape).reshape(squeezed).permute(to_buffer_order)

        value = in_buffer_order(value)
        old = V.from_storage(dst, buffer.dtype)
        if accumulate:
            value = combine(accumulate, old, value)
        if mask is not None:
            value = torch.where(in_buffer_order(mask), value, old)
        dst.copy_(V.round_tensor(value, buffer.dtype))

    def _element_view(self, buffer, indices, stmt):
        """The storage tensor and indices; a 0-d buffer (a `T.alloc_var`) is viewed as [1]."""
        tensor = self.tensor(buffer, stmt)
        if tensor.dim() == 0:
            return tensor.view(1), [0]
        return tensor, list(indices)

    def _accumulate(self, tensor, buffer, lanes, value, kind):
        """Atomic semantics: lanes hitting the same element all contribute (summed, or their
        max / min taken, by `kind`: see `combine`)."""
        points = torch.stack([i.reshape(-1) for i in lanes], dim=1)
        unique, inverse = torch.unique(points, dim=0, return_inverse=True)
        compute = V.compute_dtype(buffer.dtype)
        index = tuple(unique.t())
        old = V.from_storage(tensor[index], buffer.dtype)
        if kind in (True, "add"):
            sums = torch.zeros(unique.shape[0], dtype=compute).index_add_(0, inverse, value.reshape(-1).to(compute))
            total = old + sums
        else:  # the max / min of each element's lanes (NaN lanes take no part), then `combine`d
            values = value.reshape(-1).to(compute)
            floats = compute.is_floating_point
            keep = ~values.isnan() if floats else torch.ones_like(values, dtype=torch.bool)
            start = torch.full((unique.shape[0],), math.nan if floats else 0, dtype=compute)
            reduced = start.scatter_reduce(0, inverse[keep], values[keep], "amax" if kind == "max" else "amin",
                                           include_self=False)
            total = combine(kind, old.to(compute), reduced)
        tensor[index] = V.round_tensor(total, buffer.dtype).to(tensor.dtype)

    def _lanes(self, buffer, indices, shape, mask, stmt):
        """Indices as int64 tensors, and the in-bounds lanes (None when all are)."""
        indices = [V.as_tensor(i, torch.int64) if not V.is_tensor(i) else i.to(torch.int64) for i in indices]
        valid = None
        for i, size in zip(indices, shape):
            ok = (i >= 0) & (i < size)
            valid = ok if valid is None else valid & ok
        if valid is None or bool(valid.all()):
            return indices, None
        if buffer.scope != "global":
            bad = ~valid if mask is None else mask & ~valid
            if bool(bad.any()):
                full = torch.broadcast_shapes(bad.shape, *(i.shape for i in indices))
                lane = bad.expand(full).nonzero()[0]
                point = [int(i.expand(full)[tuple(lane)]) for i in indices]
                self._oob(buffer, point, shape, stmt)
        return indices, valid

    @staticmethod
    def _oob(buffer, indices, shape, stmt):
        raise CompileError(f"index {list(indices)} is out of bounds of {buffer.scope} buffer "
                           f"{buffer.name}{list(shape)}", getattr(stmt, "loc", None))


def out_of_bounds_value(buffer: ir.Buffer):
    """What a read outside global `buffer` gives: its `T.annotate_safe_value` in its dtype, else 0."""
    return 0 if buffer.safe_value is None else V.round_scalar(buffer.safe_value, buffer.dtype)


def combine(kind, old, new):
    """The value an atomic update of `kind` (True or "add", "max", "min") stores from the
    element's `old` value and `new`; max / min ignore NaN (T.max's fmaxf)."""
    if kind in (True, "add"):
        return old + new
    new = V.as_tensor(new, old.dtype if V.is_tensor(old) else None)
    return (torch.fmax if kind == "max" else torch.fmin)(V.as_tensor(old), new)


def _in_bounds(indices, shape) -> bool:
    return all(0 <= i < size for i, size in zip(indices, shape))


def _offsets(box: tuple, starts: tuple) -> tuple:
    """Slices selecting the in-bounds part `box` within a tile that starts at `starts`."""
    return tuple(slice(lo - s, hi - s) for (lo, hi), s in zip(box, starts))


def _dense_box(indices: list, shape) -> tuple:
    """When every lane-dependent index is ``start + arange`` along its own lane dimension and
    the box is in bounds, return (slices, lane dim of each sliced buffer dim, lane shape);
    else None.  Such accesses are plain slices (the common ``buf[i, j]`` in T.Parallel)."""
    ndim = max((i.dim() for i in indices if V.is_tensor(i)), default=0)
    slices, lane_dims, lane_shape = [], [], [1] * ndim
    for index, size in zip(indices, shape):
        if not V.is_tensor(index) or index.dim() == 0:
            index = int(index)
            if not 0 <= index < size:
                return None
            slices.append(index)
            continue
        spread = [d for d, n in enumerate(index.shape) if n != 1]
        if len(spread) != 1:
            return None
        lane = spread[0] + ndim - index.dim()
        n = index.shape[spread[0]]
        flat = index.reshape(n)
        start = int(flat[0])
        if start < 0 or start + n > size or lane in lane_dims or lane_shape[lane] != 1:
            return None
        if not torch.equal(flat, torch.arange(start, start + n, dtype=flat.dtype)):
            return None
        slices.append(slice(start, start + n))
        lane_dims.append(lane)
        lane_shape[lane] = n
    if not lane_dims:
        return None
    return tuple(slices), lane_dims, tuple(lane_shape)


def _fits(lanes: torch.Tensor, lane_shape: tuple) -> bool:
    """`lanes` broadcasts to `lane_shape` without widening it."""
    return lanes.dim() <= len(lane_shape) and all(
        n == 1 or n == m for n, m in zip(reversed(lanes.shape), reversed(lane_shape)))


def _argsort(values: list) -> list:
    return sorted(range(len(values)), key=values.__getitem__)


def _lane_box(indices: list, mask) -> tuple:
    """Bounding box of the (active) lanes' indices."""
    if mask is not None:
        full = torch.broadcast_shapes(mask.shape, *(i.shape for i in indices))
        indices = [i.expand(full)[mask.expand(full)] for i in indices]
    box = []
    for i in indices:
        if i.numel() == 0:
            return tuple((0, 0) for _ in indices)
        box.append((int(i.min()), int(i.max()) + 1))
    return tuple(box)
