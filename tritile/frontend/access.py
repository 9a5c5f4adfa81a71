"""Buffer subscripts: `A[i, j]` (a point), `A[a:b, c]` (a region) and their resolution.

A subscript is kept as a `BufferAccess` until its use decides what it means: an element
read (`Load`), an element write (`Store` indices), a tile-op operand (`Region`), or a
TileLang "head address" (`A[by * BM, k * BK]` passed to `T.copy`: the region starting there
with the other operand's extents).  Guarantees: every `Region` made here has static integer
extents; constant indices are checked against static dimensions (negative constants count
from the end, as in Python); violations are `CompileError`s at the subscript's location.
"""
from __future__ import annotations

from dataclasses import dataclass

from tritile.errors import CompileError
from tritile.frontend import exprs
from tritile.ir import nodes as ir


@dataclass
class BufferAccess:
    buffer: ir.Buffer
    items: tuple  # per indexed dimension: an Expr / Python int (a point) or a Python slice
    loc: ir.SourceLoc

    @property
    def is_point(self) -> bool:
        return len(self.items) == self.buffer.ndim and not any(isinstance(i, slice) for i in self.items)

    @property
    def dtype(self):
        """The element type (TileLang's helpers check `val.dtype == T.uint8` on an element access)."""
        return self.buffer.dtype


def _element_operator(name: str):
    """Python's operator `name` on an element access: that of its `Load` (Python code run while
    a kernel is traced, a lambda given `A[i]`, computes with it as with any expression)."""

    def operator(self, *other):
        return getattr(load(self), name)(*other)

    operator.__name__ = name
    return operator


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__neg__", "astype"):
    setattr(BufferAccess, _name, _element_operator(_name))


def _index(buffer: ir.Buffer, dim: int, value, loc):
    """One index as an int32 Expr; constant indices are range-checked."""
    if isinstance(value, ir.Const) and isinstance(value.value, int) and not isinstance(value.value, bool):
        value = value.value
    if isinstance(value, bool) or isinstance(value, float):
        raise CompileError(f"index {value!r} into {buffer.name} must be an integer", loc)
    size = buffer.shape[dim]
    if isinstance(value, int):
        if isinstance(size, int):
            if value < 0:
                value += size
            if not 0 <= value < size:
                raise CompileError(f"index {value if value >= 0 else value - size} is out of range for "
                                   f"dimension {dim} of {buffer.name} (size {size})", loc)
        return ir.Const(value)
    if not isinstance(value, ir.Expr):
        raise CompileError(f"index into {buffer.name} must be a scalar, got {value!r}", loc)
    if value.dtype.is_float:
        raise CompileError(f"index into {buffer.name} has float type {value.dtype}", loc)
    return value


def element_indices(access: BufferAccess) -> tuple:
    """Indices of a single-element access (`Load` / `Store`)."""
    buf = access.buffer
    if len(access.items) != buf.ndim:
        raise CompileError(f"{buf.name} has rank {buf.ndim} but is indexed with {len(access.items)} "
                           f"indices", access.loc)
    if any(isinstance(i, slice) for i in access.items):
        raise CompileError(f"a slice of {buf.name} is a region, not a scalar; use T.copy or a T.Parallel "
                           f"loop to move regions", access.loc)
    return tuple(_index(buf, d, i, access.loc) for d, i in enumerate(access.items))


def load(access: BufferAccess) -> ir.Load:
    buf = access.buffer
    return ir.Load(buf, element_indices(access), buf.dtype)


def region(value, loc, what: str = "operand") -> ir.Region:
    """A Buffer or a sliced subscript as a Region (trailing unindexed dims are full)."""
    if isinstance(value, ir.Buffer):
        if value.scope == "var":
            raise CompileError(f"{what}: {value.name} is a scalar variable, not a tile", loc)
        return _full_region(value, loc)
    if not isinstance(value, BufferAccess):
        raise CompileError(f"{what} must be a buffer or a buffer region, got {_describe(value)}", loc)
    buf = value.buffer
    if len(value.items) > buf.ndim:
        raise CompileError(f"{buf.name} has rank {buf.ndim} but is indexed with {len(value.items)} indices",
                           value.loc)
    items = list(value.items) + [slice(None)] * (buf.ndim - len(value.items))
    starts, extents = [], []
    for dim, item in enumerate(items):
        if isinstance(item, slice):
            start, extent = _slice(buf, dim, item, value.loc)
        else:
            start, extent = _index(buf, dim, item, value.loc), 1
        starts.append(start)
        extents.append(extent)
    return ir.Region(buf, tuple(starts), tuple(extents))


def _full_region(buf: ir.Buffer, loc) -> ir.Region:
    for dim, size in enumerate(buf.shape):
        if not isinstance(size, int):
            raise CompileError(f"dimension {dim} of {buf.name} is dynamic ({exprs.expr_str(size)}); "
                               f"address a static-size region such as {buf.name}[i:i + 64, ...]", loc)
    return ir.Region.full(buf)


def _slice(buf: ir.Buffer, dim: int, item: slice, loc):
    if item.step not in (None, 1) and not (isinstance(item.step, ir.Const) and item.step.value == 1):
        raise CompileError(f"slices of {buf.name} must have step 1", loc)
    start = 0 if item.start is None else item.start
    stop = buf.shape[dim] if item.stop is None else item.stop
    extent = exprs.static_difference(stop, start)
    if extent is None:
        raise CompileError(f"the extent of slice {dim} of {buf.name} is not a compile-time constant "
                           f"(stop - start must not depend on runtime values)", loc)
    if extent < 1:
        raise CompileError(f"slice {dim} of {buf.name} is empty (extent {extent})", loc)
    start_expr = _index(buf, dim, start, loc)
    size = buf.shape[dim]
    if buf.scope != "global" and isinstance(start, int) and isinstance(size, int) and start + extent > size:
        raise CompileError(f"slice {start}:{start + extent} is out of range for dimension {dim} of "
                           f"{buf.name} (size {size})", loc)
    return start_expr, extent


def head_region(access: BufferAccess, other: ir.Region) -> ir.Region:
    """TileLang's head address: the region of `access.buffer` starting at the point `access`
    with `other`'s extents, aligned to the trailing dimensions (missing leading dims are 1).
    Global tiles may run past the tensor's end (T.copy zero-fills / drops those elements);
    on-chip tiles may not."""
    buf = access.buffer
    extents = list(other.extents)
    while len(extents) > buf.ndim and extents[0] == 1:
        extents.pop(0)
    if len(extents) > buf.ndim:
        raise CompileError(f"{buf.name}[...] (rank {buf.ndim}) cannot hold a tile of shape "
                           f"{list(other.tile_shape)}", access.loc)
    extents = [1] * (buf.ndim - len(extents)) + extents
    starts = tuple(_index(buf, d, i, access.loc) for d, i in enumerate(access.items))
    for dim, (start, extent, size) in enumerate(zip(starts, extents, buf.shape)):
        if (buf.scope != "global" and isinstance(start, ir.Const) and isinstance(size, int)
                and start.value + extent > size):
            raise CompileError(f"a tile of extent {extent} starting at {start.value} is out of range for "
                               f"dimension {dim} of {buf.name} (size {size})", access.loc)
    return ir.Region(buf, starts, tuple(extents))


def _describe(value) -> str:
    if isinstance(value, ir.Expr):
        return f"the scalar {exprs.expr_str(value)}"
    return f"{type(value).__name__} {value!r}"
