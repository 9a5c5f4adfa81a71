"""Views: `T.reshape(buf, shape)`, `T.view(buf, shape=None, dtype=None)` and a buffer's
`.data` (`T.Tensor(shape, dtype, A.data)`, `T.alloc_buffer(shape, dtype, data=A.data)`).

TileLang's meaning (tilelang/language/customize.py): a new buffer over the same storage -
the same bytes from the first, row-major, in another shape and / or dtype, the total number
of bits unchanged.  Guarantees: the view is a Buffer whose `view_of` is the storage's own
buffer (a view of a view is a view of that storage), of the storage's scope; a global view
is recorded in the function's views (`Parser.views`, which the runtime derives from the
call's tensors), an on-chip view is declared by an `Alloc` where it is made.  A shape whose
bits provably differ from the storage's is a CompileError at the call (TileLang asserts);
sizes known only at run time are checked when the runtime derives the view.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from tritile.errors import CompileError
from tritile.frontend import exprs
from tritile.ir import nodes as ir
from tritile.ir.dtypes import element_dtype


@dataclass(frozen=True)
class Storage:
    """A buffer's `.data`: its storage, which `T.Tensor(shape, dtype, data)` views."""

    buffer: ir.Buffer


def make_view(p, src, shape, dtype, what: str, loc) -> ir.Buffer:
    """The view of `src` (a Buffer or its `.data`) with `shape` (None: src's) and `dtype`
    (None: src's)."""
    if isinstance(src, Storage):
        src = src.buffer
    if not isinstance(src, ir.Buffer):
        raise CompileError(f"{what}: the source must be a buffer (a T.Tensor parameter, T.alloc_shared, "
                           f"T.alloc_fragment, ...), got {type(src).__name__}", loc)
    if src.scope in ("var", "barrier"):
        raise CompileError(f"{what}: {src.name} is a {'scalar variable' if src.scope == 'var' else 'barrier'}, "
                           f"which has no view", loc)
    storage = src.view_of or src
    if storage.strides is not None:  # its bytes are not its elements in row-major order
        raise CompileError(f"{what}: {storage.name} is a T.StridedTensor, which has no row-major view; declare "
                           f"the view's shape as another parameter", loc)
    try:
        dtype = src.dtype if dtype is None else element_dtype(dtype)
    except TypeError as exc:
        raise CompileError(f"{what}: {exc}", loc) from None
    shape = tuple(src.shape) if shape is None else _shape(shape, src, what, loc)
    if src.scope != "global" and not all(isinstance(d, int) for d in shape):
        raise CompileError(f"{what}: a view of on-chip buffer {src.name} needs a compile-time shape", loc)
    bits, src_bits = _bits(shape, dtype), _bits(src.shape, src.dtype)
    if bits is not None and src_bits is not None and bits != src_bits:
        raise CompileError(f"{what}: shape check failed: {list(shape)} of {dtype} is {bits} bits, {src.name} "
                           f"{list(src.shape)} of {src.dtype} is {src_bits}", loc)
    view = ir.Buffer(p.unique_name(p.name_hint or f"{src.name}_view"), shape, dtype, storage.scope, loc=loc,
                     view_of=storage)
    if view.scope == "global":
        p.views.append(view)
    else:
        p.require_kernel(what, loc)
        p.emit(ir.Alloc(view, loc=loc))
    return view


def _shape(shape, src, what, loc) -> tuple:
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    out = []
    for dim in shape:
        if isinstance(dim, ir.Const) and isinstance(dim.value, int) and not isinstance(dim.value, bool):
            dim = dim.value
        if isinstance(dim, ir.Expr) and not dim.dtype.is_float:
            out.append(exprs.cast(dim, "int32", loc))
        elif isinstance(dim, int) and not isinstance(dim, bool) and dim >= 1:
            out.append(dim)
        else:
            raise CompileError(f"{what}: every dimension of the new shape of {src.name} must be a positive "
                               f"integer, got {dim!r}", loc)
    return tuple(out)


def _bits(shape, dtype):
    """The total bits of a buffer of `shape` and `dtype`, or None when a size is a runtime value."""
    if not all(isinstance(d, int) for d in shape):
        return None
    return prod(shape) * dtype.bits


def reshape(p, a, loc):
    return make_view(p, a["src"], a["shape"], None, "T.reshape", loc)


def view(p, a, loc):
    return make_view(p, a["src"], a["shape"], a["dtype"], "T.view", loc)
