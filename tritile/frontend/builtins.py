"""Lowering of each `T.*` call to tile IR, one small handler per operation.

Assumes the parser has bound the call against the `tritile.language` signature (so `args`
holds every parameter, defaults applied) and passes itself as `p` (emit / scalar / buffer
helpers).  Guarantees: statement operations append exactly the IR they mean to `p`'s
current block; shape rules TileLang checks in Python (copy extents, gemm M/N/K, reduce
output shape) are checked here and reported as `CompileError` at the call.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from math import prod
from typing import Optional

import tritile.language as T
from tritile.errors import CompileError
from tritile.frontend import access as acc
from tritile.frontend import exprs
from tritile.frontend import random
from tritile.frontend import reducers
from tritile.frontend import thread_ranges
from tritile.frontend import views
from tritile.ir import nodes as ir
from tritile.interpreter.values import reinterpret_bits
from tritile.ir.dtypes import bool_, element_dtype, int64, is_tfloat32
from tritile.ir.transform import substitute_vars
from tritile.ir.verifier import gemm_mnk
from tritile.language.layout import Layout
from tritile.layout import SwizzledLayout


@dataclass
class LoopSpec:
    """What a `for` header iterates over (T.serial / T.unroll / T.Pipelined / range / T.Parallel)."""

    kind: str  # "serial" | "unroll" | "pipelined" | "parallel"
    start: object = 0
    stop: object = None
    step: object = 1
    extents: tuple = ()
    num_stages: int = 0
    order: Optional[list] = None
    stage: Optional[list] = None


@dataclass
class KernelSpec:
    grid: tuple
    threads: int
    names: tuple = field(default=("bx", "by", "bz"))
    dims: tuple = ()  # `threads` as given: (X,) or (X, Y[, Z]) (frontend/per_thread.py)


def _dtype(value, loc):
    try:
        return element_dtype(value)
    except TypeError as exc:
        raise CompileError(str(exc), loc) from None


def _static_shape(shape, what, loc) -> tuple:
    if isinstance(shape, (int, ir.Const)):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise CompileError(f"{what}: shape must be an int or a tuple of ints, got {shape!r}", loc)
    out = []
    for s in shape:
        if isinstance(s, ir.Const) and isinstance(s.value, int):
            s = s.value
        if not isinstance(s, int) or isinstance(s, bool) or s < 1:
            raise CompileError(f"{what}: every dimension must be a positive compile-time integer, got "
                               f"{exprs.expr_str(s) if isinstance(s, ir.Expr) else repr(s)}", loc)
        out.append(s)
    return tuple(out)


def _int(value, what, loc) -> int:
    if isinstance(value, ir.Const) and isinstance(value.value, int):
        value = value.value
    if not isinstance(value, int) or isinstance(value, bool):
        raise CompileError(f"{what} must be a compile-time integer, got {value!r}", loc)
    return value


def _bool(value, what, loc) -> bool:
    if isinstance(value, ir.Const):
        value = value.value
    if not isinstance(value, (bool, int)):
        raise CompileError(f"{what} must be a compile-time bool, got {value!r}", loc)
    return bool(value)


# --------------------------------------------------------------------------------------
# kernel, eager-style declarations, allocations
# --------------------------------------------------------------------------------------


def kernel(p, a, loc):
    p.require_outside_kernel("T.Kernel", loc)
    blocks = a["blocks"]
    if len(blocks) == 1 and isinstance(blocks[0], (tuple, list)):
        blocks = tuple(blocks[0])
    if not 1 <= len(blocks) <= 3:
        raise CompileError(f"T.Kernel takes 1 to 3 grid extents, got {len(blocks)}", loc)
    grid = tuple(exprs.cast(p.scalar(b, loc), "int32", loc) for b in blocks)
    for axis, extent in enumerate(grid):
        value = extent.value if isinstance(extent, ir.Const) else extent
        if isinstance(value, int) and value <= 0:
            raise CompileError(f"T.Kernel: grid extent {axis} is {value}, so the kernel would run no block; "
                               f"every extent must be positive", loc)
    threads = a["threads"]
    dims = tuple(_int(t, "T.Kernel threads", loc) for t in threads) if isinstance(threads, (tuple, list)) \
        else (_int(threads, "T.Kernel threads", loc),)
    count = 1
    for t in dims:
        count *= t
    return KernelSpec(grid, _threads(count, loc), dims=dims)


_MAX_THREADS = 1024  # CUDA's limit per block


def _threads(threads: int, loc) -> int:
    """A block's thread count as tritile can launch it: Gluon runs whole warps, so a count of
    several warps must be a multiple of 32; fewer than 32 (TileLang's one-thread kernels) runs
    as one warp, which computes the same tile program."""
    if not 1 <= threads <= _MAX_THREADS:
        raise CompileError(f"T.Kernel threads={threads}: a block has 1 to {_MAX_THREADS} threads", loc)
    if threads > 32 and threads % 32:
        raise CompileError(f"T.Kernel threads={threads} is not a multiple of 32: tritile launches whole warps "
                           f"of 32 threads; use {threads // 32 * 32} or {(threads // 32 + 1) * 32}", loc)
    return threads


def const(p, a, loc):
    p.require_outside_kernel("T.const", loc)
    names = [n for n in str(a["names"]).replace(",", " ").split()]
    values = tuple(p.const_value(n, loc) for n in names)
    return values[0] if len(values) == 1 else values


def empty(p, a, loc):
    p.require_outside_kernel("T.empty", loc)
    shape, dtype = a["shape"], a["dtype"]
    if shape and isinstance(shape[0], (tuple, list)):  # T.empty((M, N), dtype) rather than T.empty(M, N, dtype=)
        if len(shape) > 2:
            raise CompileError("T.empty takes (shape, dtype) or (*shape, dtype=...)", loc)
        dtype = shape[1] if len(shape) == 2 else dtype
        shape = tuple(shape[0])
    shape = tuple(exprs.cast(s, "int32", loc) if isinstance(s, ir.Expr) else _int(s, "T.empty shape", loc)
                  for s in shape)
    return p.declare_output(shape, _dtype(dtype, loc), loc)


def match_buffer(p, a, loc):
    """`A = T.match_buffer(A, shape, dtype, strides=None)` of a parameter annotated `A: T.ptr`: its
    tensor type, as the body annotation `A: T.Tensor[shape, dtype]` (or `T.StridedTensor`) gives it."""
    p.require_outside_kernel("T.match_buffer", loc)
    param = a["param"]
    if not isinstance(param, PointerParam):
        raise CompileError("T.match_buffer takes a parameter of the kernel annotated `T.ptr` (`A: T.ptr`, then "
                           f"`A = T.match_buffer(A, shape, dtype)`), got {param!r}", loc)
    defaults = {"data": None, "elem_offset": None, "scope": "global", "align": -1, "offset_factor": 0,
                "buffer_type": "default", "axis_separators": None}
    for name, default in defaults.items():
        if a[name] != default:
            raise CompileError(f"T.match_buffer({name}=...) is not supported", loc)
    if a["shape"] is None:
        raise CompileError("T.match_buffer needs the tensor's shape", loc)
    shape = a["shape"]
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    try:
        spec = (T.Tensor(shape, a["dtype"]) if a["strides"] is None
                else T.StridedTensor(shape, a["strides"], a["dtype"]))
    except (TypeError, ValueError) as exc:
        raise CompileError(f"T.match_buffer: {exc}", loc) from None
    p._declare_param(param.name, spec, loc)
    return p.lookup(param.name, loc)


class PointerParam:
    """A kernel parameter annotated `T.ptr`, until `T.match_buffer` gives it its tensor type."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"the T.ptr parameter {self.name} (give it a type first: {self.name} = T.match_buffer({self.name}, " \
               f"shape, dtype))"


def alloc_global(p, a, loc):
    p.require_outside_kernel("T.alloc_global", loc)
    shape = a["shape"]
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    shape = tuple(exprs.cast(s, "int32", loc) if isinstance(s, ir.Expr) else _int(s, "T.alloc_global shape", loc)
                  for s in shape)
    return p.declare_workspace(shape, _dtype(a["dtype"], loc), loc)


def _alloc(scope):
    def handler(p, a, loc):
        p.require_kernel(f"T.alloc_{scope}", loc)
        shape = _static_shape(a["shape"], f"T.alloc_{scope}", loc)
        buf = p.new_buffer(shape, _dtype(a["dtype"], loc), scope, loc)
        if is_tfloat32(a["dtype"]):
            p.tf32_buffers.add(buf.name)
        p.emit(ir.Alloc(buf, loc=loc))
        return buf

    return handler


_ALLOC_BY_SCOPE = {"shared": "alloc_shared", "shared.dyn": "alloc_shared", "local.fragment": "alloc_fragment",
                   "local": "alloc_local", "local.var": "alloc_var", "global": "alloc_global"}


def alloc_buffer(p, a, loc):
    """`T.alloc_buffer(shape, dtype, scope=...)`: the `T.alloc_*` of its scope; with
    `data=B.data`, a view of B's storage (frontend/views.py).  TVM's other aliasing arguments
    (`strides`, `elem_offset`) are not supported."""
    scope = a["scope"]
    if scope not in _ALLOC_BY_SCOPE:
        raise CompileError(f"T.alloc_buffer: scope must be one of {', '.join(map(repr, _ALLOC_BY_SCOPE))}, got "
                           f"{scope!r}", loc)
    for name in ("strides", "elem_offset"):
        if a[name] is not None:
            raise CompileError(f"T.alloc_buffer({name}=...) (a view of another buffer's storage) is not supported "
                               f"by tritile", loc)
    if a["data"] is not None:
        return tensor_over(p, a["shape"], a["dtype"], a["data"], "T.alloc_buffer(data=...)", loc)
    alloc = _ALLOC_BY_SCOPE[scope]
    if alloc == "alloc_var":
        if _static_shape(a["shape"], "T.alloc_buffer", loc) != (1,):
            raise CompileError(f"T.alloc_buffer(scope='local.var') holds one scalar: shape (1,), got {a['shape']!r}",
                               loc)
        return HANDLERS[alloc](p, {"dtype": a["dtype"], "init": None}, loc)
    return HANDLERS[alloc](p, {"shape": a["shape"], "dtype": a["dtype"], "scope": scope}, loc)


def tensor_over(p, shape, dtype, data, what, loc) -> ir.Buffer:
    """`T.Tensor(shape, dtype, B.data)` (or `T.alloc_buffer(..., data=B.data)`): a view of B's storage."""
    if not isinstance(data, views.Storage):
        raise CompileError(f"{what}: data must be a buffer's storage (`B.data`), got {type(data).__name__}", loc)
    return views.make_view(p, data, shape, dtype, what, loc)


def alloc_reducer(p, a, loc):
    op = a["op"]
    if op not in reducers.OPS:
        raise CompileError(f"T.alloc_reducer: op must be one of {', '.join(map(repr, reducers.OPS))}, got {op!r}", loc)
    buf = _alloc("fragment")(p, {"shape": a["shape"], "dtype": a["dtype"]}, loc)
    if op.startswith("bit") and not buf.dtype.is_int:
        raise CompileError(f"T.alloc_reducer: op {op!r} needs an integer dtype, got {buf.dtype}", loc)
    p.reducers[buf] = op
    return buf


def _reducer(value, what, loc) -> ir.Buffer:
    if not isinstance(value, ir.Buffer) or value.scope != "fragment":
        raise CompileError(f"{what} must be a buffer made by T.alloc_reducer, got {value!r}", loc)
    return value


def reducer_init(p, a, loc):
    p.require_kernel("T.reducer_init", loc)
    buf = _reducer(a["reducer"], "T.reducer_init reducer", loc)
    op = p.reducers.get(buf, "sum")
    init = reducers.identity(op, buf.dtype) if a["init"] is None else exprs.cast(p.scalar(a["init"], loc), buf.dtype, loc)
    p.emit(ir.Fill(ir.Region.full(buf), init, loc=loc))


def reducer_update(p, a, loc):
    target = a["target"]
    if not (isinstance(target, acc.BufferAccess) and target.is_point and target.buffer in p.reducers):
        raise CompileError("T.reducer_update(target, value): target must be an element r[...] of a T.alloc_reducer", loc)
    if not p.parallel_depth:
        raise CompileError("T.reducer_update must be inside T.Parallel", loc)
    indices = acc.element_indices(target)
    value = reducers.update_value(p.reducers[target.buffer], target.buffer, indices, p.scalar(a["value"], loc), loc)
    p.emit(ir.Store(target.buffer, indices, value, loc=loc))


def finalize_reducer(p, a, loc):
    p.require_kernel("T.finalize_reducer", loc)
    buf = _reducer(a["reducer"], "T.finalize_reducer reducer", loc)
    if _int(a["batch"], "T.finalize_reducer batch", loc) < 1:
        raise CompileError("T.finalize_reducer: batch must be >= 1", loc)
    if a["dst"] is not None:
        dst = acc.region(a["dst"], loc, "T.finalize_reducer dst")
        if dst.tile_shape != ir.Region.full(buf).tile_shape:
            raise CompileError(f"T.finalize_reducer: dst {dst.buffer.name} has shape {list(dst.tile_shape)}, the "
                               f"reducer {list(buf.shape)}", loc)
        p.emit(ir.Copy(ir.Region.full(buf), dst, loc=loc))


class LaneVar:
    """`v = T.alloc_var(dtype[, init])` inside T.Parallel: each lane's own scalar, not a buffer.
    The parser binds the name to a per-lane SSA value of `dtype` (`parser._LaneBinding`): each
    assignment rebinds it, an assignment under a lane `if` merges with T.if_then_else after it."""

    __slots__ = ("dtype", "init")

    def __init__(self, dtype, init):
        self.dtype, self.init = dtype, init

    def __repr__(self):
        return f"T.alloc_var({self.dtype}) inside T.Parallel"


def alloc_var(p, a, loc):
    p.require_kernel("T.alloc_var", loc)
    dtype = _dtype(a["dtype"], loc)
    if p.parallel_depth:
        init = a["init"]
        return LaneVar(dtype, None if init is None else exprs.cast(p.scalar(init, loc), dtype, loc))
    buf = p.new_buffer((1,), dtype, "var", loc)
    init = a["init"]
    p.emit(ir.Alloc(buf, None if init is None else exprs.cast(p.scalar(init, loc), dtype, loc), loc=loc))
    return buf



def make_tensor(p, a, loc):
    """`T.make_tensor(address, shape, dtype)`: a global tensor at a device address the kernel
    computes (an element of a `T.Tensor([n], T.ptr)` table).  The address is bound once, by a
    `Let` of an int64 Var at the kernel body's own level, so that every use of the tensor sees it;
    the tensor (`Buffer.address`) is row-major over static dims."""
    p.require_kernel("T.make_tensor", loc)
    if len(p.blocks) != p.kernel_block_depth:
        raise CompileError("T.make_tensor inside an `if`, a loop or T.Parallel is not supported; make the "
                           "tensor at the kernel body's own level", loc)
    if a["strides"] is not None:
        raise CompileError("T.make_tensor(..., strides=) is not supported: tensors made from an address are "
                           "row-major", loc)
    shape = _static_shape(a["shape"], "T.make_tensor", loc)
    dtype = _dtype(a["dtype"], loc)
    address = p.scalar(a["ptr"], loc)
    if not isinstance(address, ir.Expr) or not address.dtype.is_int or address.dtype.bits != 64:
        raise CompileError("T.make_tensor: the address must be a runtime 64-bit integer (an element of a "
                           f"T.Tensor([n], T.ptr) table), got {address!r}", loc)
    buf = p.new_buffer(shape, dtype, "global", loc)
    var = ir.Var(f"{buf.name}_address", int64)
    p.emit(ir.Let(var, exprs.cast(address, int64, loc), loc=loc))
    buf.address = var
    return buf

# --------------------------------------------------------------------------------------
# tile operations
# --------------------------------------------------------------------------------------


def copy(p, a, loc):
    p.require_kernel("T.copy", loc)
    src, dst = a["src"], a["dst"]
    src_point = isinstance(src, acc.BufferAccess) and src.is_point
    dst_point = isinstance(dst, acc.BufferAccess) and dst.is_point
    if src_point and dst_point:  # both scalar loads: a plain element store
        p.emit(ir.Store(dst.buffer, acc.element_indices(dst),
                        exprs.cast(acc.load(src), dst.buffer.dtype, loc), loc=loc))
        return None
    if src_point:
        dst_region = acc.region(dst, loc, "T.copy dst")
        src_region = acc.head_region(src, dst_region)
    elif dst_point:
        src_region = acc.region(src, loc, "T.copy src")
        dst_region = acc.head_region(dst, src_region)
    else:
        src_region = acc.region(src, loc, "T.copy src")
        dst_region = acc.region(dst, loc, "T.copy dst")
    if src_region.tile_shape != dst_region.tile_shape:
        raise CompileError(f"T.copy shape mismatch: source {src_region.buffer.name} tile "
                           f"{list(src_region.tile_shape)} vs destination {dst_region.buffer.name} tile "
                           f"{list(dst_region.tile_shape)}", loc)
    if all(e == 1 for e in src_region.extents + dst_region.extents):  # one element (`T.copy(A, A_local)`)
        p.emit(ir.Store(dst_region.buffer, dst_region.starts, exprs.cast(
            ir.Load(src_region.buffer, src_region.starts, src_region.buffer.dtype), dst_region.buffer.dtype, loc),
            loc=loc))
        return None
    p.emit(ir.Copy(src_region, dst_region, loc=loc))
    return None


def transpose(p, a, loc):
    """TileLang's `T.transpose(src, dst)`: ``dst[j, i] = src[i, j]`` over src's 2-D tile (leading
    unit dims allowed), as a `T.Parallel` over dst's tile reading src at the swapped indices."""
    p.require_kernel("T.transpose", loc)
    src, dst = acc.region(a["src"], loc, "T.transpose src"), acc.region(a["dst"], loc, "T.transpose dst")
    if len(src.tile_shape) != 2 or tuple(dst.tile_shape) != tuple(reversed(src.tile_shape)):
        raise CompileError(f"T.transpose: src {src.buffer.name} tile {list(src.tile_shape)} and dst {dst.buffer.name} "
                           f"tile {list(dst.tile_shape)} must be 2-D, (M, N) and (N, M)", loc)
    lanes = (ir.Var("i"), ir.Var("j"))

    def indices(region, order):
        """The region's element at tile point (lanes[order[0]], lanes[order[1]])."""
        tile_dims = iter(lanes[k] for k in order)
        out = []
        for start, extent in zip(region.starts, region.extents):
            if extent == 1:
                out.append(start)
                continue
            lane = next(tile_dims)
            out.append(lane if isinstance(start, ir.Const) and start.value == 0 else exprs.binary("+", start, lane, loc))
        return tuple(out)

    value = exprs.cast(ir.Load(src.buffer, indices(src, (1, 0)), src.buffer.dtype), dst.buffer.dtype, loc)
    store = ir.Store(dst.buffer, indices(dst, (0, 1)), value, loc=loc)
    p.emit(ir.Parallel(lanes, tuple(dst.tile_shape), ir.Seq([store], loc=loc), loc=loc))


def im2col(p, a, loc):
    """TileLang's `T.im2col(img, col, nhw_step, c_step, kernel, stride, dilation, pad)`: the
    (block_M, block_K) tile `col` of the im2col matrix of the NHWC image `img` (global, 4-D) for a
    square `kernel` x `kernel` convolution - row ``m = nhw_step * block_M + i`` is the output pixel
    (n, oh, ow) in row-major order, column ``k = c_step * block_K + j`` the filter tap
    (kh, kw, c) in the order of a (KH, KW, C, F) weight: ``img[n, oh * stride + kh * dilation - pad,
    ow * stride + kw * dilation - pad, c]``, 0 in the padding and past the last pixel or tap.
    A `T.Parallel` over col's tile (TileLang's SIMT lowering; its TMA im2col is Hopper-only)."""
    p.require_kernel("T.im2col", loc)
    img, col = a["img"], acc.region(a["col"], loc, "T.im2col col")
    img = img.buffer if isinstance(img, acc.BufferAccess) else img
    if not isinstance(img, ir.Buffer) or img.scope != "global" or img.ndim != 4:
        raise CompileError(f"T.im2col: img must be a 4-D (N, H, W, C) global tensor, got {acc._describe(img)}", loc)
    if len(col.extents) < 2 or any(e != 1 for e in col.extents[:-2]):
        raise CompileError(f"T.im2col: col {col.buffer.name} must be a 2-D (block_M, block_K) tile, got "
                           f"{list(col.extents)}", loc)
    kernel, stride, dilation, pad = (_int(a[name], f"T.im2col {name}", loc)
                                     for name in ("kernel", "stride", "dilation", "pad"))
    if kernel < 1 or stride < 1 or dilation < 1 or pad < 0:
        raise CompileError(f"T.im2col: kernel, stride and dilation must be positive and pad non-negative, got "
                           f"{kernel}, {stride}, {dilation}, {pad}", loc)
    block_m, block_k = col.extents[-2:]
    n_dim, h_dim, w_dim, c_dim = img.shape

    def b(op, x, y):
        return exprs.binary(op, x, y, loc)

    out_h, out_w = (b("+", b("//", b("+", size, 2 * pad - dilation * (kernel - 1) - 1), stride), 1)
                    for size in (h_dim, w_dim))
    i, j = ir.Var("i"), ir.Var("j")
    m = b("+", b("*", p.scalar(a["nhw_step"], loc), block_m), i)  # the output pixel (n, oh, ow)
    k = b("+", b("*", p.scalar(a["c_step"], loc), block_k), j)  # the filter tap (kh, kw, c)
    h = b("+", b("*", b("%", b("//", m, out_w), out_h), stride), b("*", b("//", k, b("*", c_dim, kernel)), dilation))
    w = b("+", b("*", b("%", m, out_w), stride), b("*", b("%", b("//", k, c_dim), kernel), dilation))
    h, w = b("-", h, pad), b("-", w, pad)
    inside = b("and", b("and", b("<", m, b("*", n_dim, b("*", out_h, out_w))), b("<", k, b("*", c_dim, kernel * kernel))),
               b("and", b("and", b(">=", h, 0), b("<", h, h_dim)), b("and", b(">=", w, 0), b("<", w, w_dim))))
    value = exprs.select(inside, ir.Load(img, (b("//", m, b("*", out_h, out_w)), h, w, b("%", k, c_dim)), img.dtype),
                         exprs.make_const(0, img.dtype), loc)
    at = tuple(col.starts[:-2]) + tuple(lane if isinstance(start, ir.Const) and start.value == 0 else b("+", start, lane)
                                        for start, lane in zip(col.starts[-2:], (i, j)))
    store = ir.Store(col.buffer, at, exprs.cast(value, col.buffer.dtype, loc), loc=loc)
    p.emit(ir.Parallel((i, j), (block_m, block_k), ir.Seq([store], loc=loc), loc=loc))


_POLICY_BY_INT = {0: "Square", 1: "FullRow", 2: "FullCol"}


def gemm(p, a, loc):
    p.require_kernel("T.gemm", loc)
    policy = a["policy"]
    policy = _POLICY_BY_INT.get(policy, policy) if isinstance(policy, int) else getattr(policy, "name", policy)
    if policy not in ir.GEMM_POLICIES:
        raise CompileError(f"T.gemm policy must be one of T.GemmWarpPolicy.{{Square, FullRow, FullCol}}, "
                           f"got {policy!r}", loc)
    clear_accum = a["clear_accum"]
    # a runtime condition (TileLang's `clear_accum=(k == 0)` in a loop): `if cond: T.clear(C)`
    # before an accumulating gemm, the branches and fills every pass already handles
    runtime_clear = not isinstance(clear_accum, (bool, int, ir.Const))
    node = ir.Gemm(acc.region(a["A"], loc, "T.gemm A"), acc.region(a["B"], loc, "T.gemm B"),
                   acc.region(a["C"], loc, "T.gemm C"),
                   transpose_a=_bool(a["transpose_A"], "transpose_A", loc),
                   transpose_b=_bool(a["transpose_B"], "transpose_B", loc), policy=policy,
                   clear_accum=False if runtime_clear else _bool(clear_accum, "clear_accum", loc), loc=loc)
    # TileLang's tfloat32 operands: float32 storage, TF32 tensor-core inputs
    node.tf32 = any(r.buffer.name in p.tf32_buffers for r in (node.a, node.b))
    gemm_mnk(node)
    if node.c.buffer.scope not in ("fragment", "local"):
        raise CompileError(f"T.gemm accumulator C ({node.c.buffer.name}) must be a fragment "
                           f"(T.alloc_fragment), not {node.c.buffer.scope}", loc)
    for name, operand in (("A", node.a), ("B", node.b)):
        if operand.buffer.scope == "global":
            raise CompileError(f"T.gemm operand {name} ({operand.buffer.name}) must be in shared memory or "
                               f"a fragment; copy it with T.copy first", loc)
    if runtime_clear:
        cond = p.scalar(clear_accum, loc) if isinstance(clear_accum, (ir.Expr, ir.Buffer, acc.BufferAccess)) else None
        if not isinstance(cond, ir.Expr) or cond.dtype.kind not in ("bool", "int", "uint"):
            raise CompileError(f"clear_accum must be a bool or a runtime condition, got {clear_accum!r}", loc)
        if isinstance(cond, ir.Const):
            node.clear_accum = bool(cond.value)
        else:
            zero = ir.Fill(node.c, exprs.make_const(0, node.c.buffer.dtype), loc=loc)
            p.emit(ir.If(exprs.truth(cond), ir.Seq([zero], loc=loc), loc=loc))
    p.emit(node)


def wgmma_gemm(p, a, loc):
    """TileLang's `T.wgmma_gemm`: `T.gemm` (tile statements complete in program order)."""
    gemm(p, {**a, "k_pack": 1, "wg_wait": 0, "mbar": None}, loc)


def _compile_time_ints(p, a, names, what, loc):
    for name in names:
        value = a[name].value if isinstance(a[name], ir.Const) else a[name]
        if not isinstance(value, int) or isinstance(value, bool):
            raise CompileError(f"{what}: {name} must be a compile-time integer, got {value!r}", loc)


def wait_wgmma(p, a, loc):
    p.require_kernel("T.wait_wgmma", loc)
    _compile_time_ints(p, a, ("id",), "T.wait_wgmma", loc)


def register_hint(name, ints=()):
    """TileLang's register-reallocation hints of warp specialization (`T.set_max_nreg`,
    `T.no_set_max_nreg`, `T.annotate_producer_reg_dealloc`, ...): checked, no code (tritile's own
    warp specialization decides the partitions' registers; results never depend on them)."""
    def handler(p, a, loc):
        p.require_kernel(f"T.{name}", loc)
        _compile_time_ints(p, a, ints, f"T.{name}", loc)
    return handler


def fill(p, a, loc):
    p.require_kernel("T.fill", loc)
    if _is_var(a["buffer"]):  # a `T.alloc_var` is a buffer of one element in TileLang
        var = a["buffer"]
        p.emit(ir.Store(var, (ir.Const(0),), exprs.cast(p.scalar(a["value"], loc), var.dtype, loc), loc=loc))
        return
    dst = acc.region(a["buffer"], loc, "T.fill buffer")
    _fill(p, dst, exprs.cast(p.scalar(a["value"], loc), dst.buffer.dtype, loc), loc)


def clear(p, a, loc):
    p.require_kernel("T.clear", loc)
    if _is_var(a["buffer"]):
        var = a["buffer"]
        p.emit(ir.Store(var, (ir.Const(0),), exprs.make_const(0, var.dtype), loc=loc))
        return
    dst = acc.region(a["buffer"], loc, "T.clear buffer")
    _fill(p, dst, exprs.make_const(0, dst.buffer.dtype), loc)


def _is_var(value) -> bool:
    return isinstance(value, ir.Buffer) and value.scope == "var"


def _fill(p, dst: ir.Region, value, loc):
    """An on-chip region's `ir.Fill`; a global region's elements stored in a `T.Parallel` (what
    the backends write global memory with)."""
    if dst.buffer.scope == "global":
        p.emit(_each_element(dst, lambda at: ir.Store(dst.buffer, at, value, loc=loc), loc))
    else:
        p.emit(ir.Fill(dst, value, loc=loc))


def _reduce(kind):
    def handler(p, a, loc):
        name = f"T.reduce_{kind}"
        p.require_kernel(name, loc)
        src = acc.region(a["buffer"], loc, f"{name} buffer")
        dst = acc.region(a["out"], loc, f"{name} out")
        # `dim` counts the input's own dimensions, unit ones included (TileLang's `[1, N]`
        # fragment reduced over dim=1); the IR's Reduce counts those of its tile shape.
        extents = tuple(src.extents)
        rank = len(extents)
        dim = _int(a["dim"], f"{name} dim", loc)
        if not -rank <= dim < rank:
            raise CompileError(f"{name}: dim {dim} is out of range for a {rank}-D input {list(extents)}", loc)
        dim %= rank
        if extents[dim] == 1:
            raise CompileError(f"{name}: dim {dim} of the input {list(extents)} has extent 1; there is nothing "
                               f"to reduce (copy it with T.copy instead)", loc)
        expected = tuple(s for i, s in enumerate(extents) if i != dim and s != 1) or (1,)
        if dst.tile_shape != expected:
            raise CompileError(f"{name}: output {dst.buffer.name} has shape {list(dst.tile_shape)}, expected "
                               f"{list(expected)} (the input {list(extents)} without dim {dim})", loc)
        dim = sum(1 for s in extents[:dim] if s != 1)
        if kind.startswith("bit") and not (src.buffer.dtype.is_int and dst.buffer.dtype.is_int):
            raise CompileError(f"{name}: a bitwise reduction takes integer tiles, got {src.buffer.dtype} into "
                               f"{dst.buffer.dtype}", loc)
        clear_flag = _bool(a.get("clear", True), "clear", loc)
        nan_propagate = _bool(a.get("nan_propagate", False), "nan_propagate", loc)
        p.emit(ir.Reduce(kind, src, dst, dim, clear_flag, loc=loc, nan_propagate=nan_propagate))

    return handler


def _scan_operands(p, a, loc, name):
    """(src, dst, dim, reverse) of a scan `T.<name>(src, dst=None, dim=0, reverse=False)`."""
    p.require_kernel(f"T.{name}", loc)
    src = acc.region(a["src"], loc, f"T.{name} src")
    dst = src if a["dst"] is None else acc.region(a["dst"], loc, f"T.{name} dst")
    if src.tile_shape != dst.tile_shape:
        raise CompileError(f"T.{name}: dst shape {list(dst.tile_shape)} differs from src shape "
                           f"{list(src.tile_shape)}", loc)
    rank = len(src.tile_shape)
    dim = _int(a["dim"], f"T.{name} dim", loc)
    if not -rank <= dim < rank:
        raise CompileError(f"T.{name}: dim {dim} is out of range for a {rank}-D input", loc)
    return src, dst, dim % rank, _bool(a["reverse"], "reverse", loc)


def cumsum(p, a, loc):
    p.emit(ir.Cumsum(*_scan_operands(p, a, loc, "cumsum"), loc=loc))


def _cum_extremum(kind):
    def handler(p, a, loc):
        p.emit(ir.CumExtremum(kind, *_scan_operands(p, a, loc, f"cum{kind}"), loc=loc))

    return handler


def _atomic(kind):
    """`T.atomic_add` / `T.atomic_max` / `T.atomic_min`: an `ir.AtomicAdd` of `kind`."""

    def handler(p, a, loc):
        return _atomic_update(p, a, loc, kind)

    return handler


# TileLang's memory orders (C++'s) -> Triton's `sem`: Triton has no consume (acquire is stronger)
# and no seq_cst (acq_rel is its strongest order)
_TRITON_SEM = {"relaxed": "relaxed", "consume": "acquire", "acquire": "acquire", "release": "release",
               "acq_rel": "acq_rel", "seq_cst": "acq_rel"}
# the orders TileLang accepts for an atomic load / store (C++'s rules)
_LOAD_ORDERS = ("relaxed", "consume", "acquire", "seq_cst")
_STORE_ORDERS = ("relaxed", "release", "seq_cst")


class MemoryOrderError(CompileError, ValueError):
    """A `memory_order=` an atomic does not take (TileLang raises ValueError, which its tests
    expect)."""


def _memory_order(value, name, loc, allowed=tuple(_TRITON_SEM), default=None) -> str:
    """Triton's `sem` for TileLang's `memory_order=` (None: `default`, else relaxed as CUDA's
    atomicAdd)."""
    if value is None:
        value = default or "relaxed"
    if value not in allowed:
        raise MemoryOrderError(f"{name} does not support memory_order={value!r}; expected one of "
                               f"{', '.join(map(repr, allowed))}", loc)
    return _TRITON_SEM[value]


def _atomic_update(p, a, loc, kind):
    name = f"T.atomic_{kind}"
    p.require_kernel(name, loc)
    sem = _memory_order(a["memory_order"], name, loc)
    dst, value = a["dst"], a["value"]
    dst_point = isinstance(dst, acc.BufferAccess) and dst.is_point
    value_is_tile = isinstance(value, ir.Buffer) and value.scope != "var" or (
        isinstance(value, acc.BufferAccess) and not value.is_point)
    return_prev = _bool(a["return_prev"], "return_prev", loc)
    if dst_point and not value_is_tile:  # scalar form: C[i, j] += v
        return _element_atomic(p, dst, value, loc, kind, sem, return_prev)
    if return_prev:  # as TileLang, which raises NotImplementedError
        raise CompileError(f"{name}(return_prev=True) needs one element of dst (a tile's previous values are "
                           f"not returned)", loc)
    if not value_is_tile and not isinstance(value, ir.Buffer):  # one value into every element of a region
        return _broadcast_atomic(p, acc.region(dst, loc, f"{name} dst"), value, loc, kind, sem)
    value_region = acc.region(value, loc, f"{name} value")
    dst_region = acc.head_region(dst, value_region) if dst_point else acc.region(dst, loc, f"{name} dst")
    if dst_region.tile_shape != value_region.tile_shape:
        raise CompileError(f"{name} shape mismatch: dst {list(dst_region.tile_shape)} vs value "
                           f"{list(value_region.tile_shape)}", loc)
    if all(e == 1 for e in value_region.extents + dst_region.extents):  # one element (`T.atomic_add(B, A_local)`)
        value = ir.Load(value_region.buffer, value_region.starts, value_region.buffer.dtype)
        return _element_atomic(p, dst_region, value, loc, kind, sem, return_prev=False)
    p.emit(ir.AtomicAdd(dst_region, value_region, loc=loc, kind=kind, sem=sem))
    return None


def _element_atomic(p, dst, value, loc, kind, sem, return_prev):
    """The atomic of element `dst` (a point access or a one-element Region); with
    `return_prev` the element's value before it, bound once to a fresh name (a value used twice
    is still one atomic)."""
    region = dst if isinstance(dst, ir.Region) else ir.Region(dst.buffer, acc.element_indices(dst),
                                                              tuple(1 for _ in dst.items))
    prev = ir.Var(f"{dst.buffer.name}_prev", dst.buffer.dtype) if return_prev else None
    p.emit(ir.AtomicAdd(region, exprs.cast(p.scalar(value, loc), dst.buffer.dtype, loc), loc=loc, kind=kind,
                        sem=sem, prev=prev))
    return prev


def _each_element(dst: ir.Region, statement, loc) -> ir.Parallel:
    """A `T.Parallel` over the elements of `dst`, each the statement `statement(indices)`."""
    lanes = tuple(ir.Var(f"i{d}") for d in range(len(dst.extents)))
    at = tuple(exprs.binary("+", start, lane, loc) for start, lane in zip(dst.starts, lanes))
    return ir.Parallel(lanes, tuple(dst.extents), ir.Seq([statement(at)], loc=loc), loc=loc)


def _broadcast_atomic(p, dst: ir.Region, value, loc, kind, sem):
    """`T.atomic_add(A[0:M, 0:N], 1.0)`: every element of `dst` updated with one value."""
    value = exprs.cast(p.scalar(value, loc), dst.buffer.dtype, loc)
    p.emit(_each_element(dst, lambda at: ir.AtomicAdd(ir.Region(dst.buffer, at, tuple(1 for _ in at)), value,
                                                      loc=loc, kind=kind, sem=sem), loc))


def atomic_load(p, a, loc):
    """`T.atomic_load(src, memory_order)`: the element's value, read by an atomic that adds the
    identity (-0.0 for floats: x + -0.0 is x, -0.0 included; 0 for integers) with the order:
    Triton has no ordered plain load."""
    p.require_kernel("T.atomic_load", loc)
    sem = _memory_order(a["memory_order"], "atomic_load", loc, _LOAD_ORDERS)
    src = a["src"]
    if not (isinstance(src, acc.BufferAccess) and src.is_point):
        src = _one_element(src, "T.atomic_load src", loc)
    dtype = src.buffer.dtype
    identity = exprs.make_const(-0.0 if dtype.is_float else 0, dtype)
    return _element_atomic(p, src, identity, loc, "add", sem, return_prev=True)


def atomic_store(p, a, loc):
    """`T.atomic_store(dst, src, memory_order)`: an atomic exchange whose old value is dropped."""
    p.require_kernel("T.atomic_store", loc)
    sem = _memory_order(a["memory_order"], "atomic_store", loc, _STORE_ORDERS)
    dst = a["dst"]
    if not (isinstance(dst, acc.BufferAccess) and dst.is_point):
        dst = _one_element(dst, "T.atomic_store dst", loc)
    _element_atomic(p, dst, a["src"], loc, "exchange", sem, return_prev=False)


def _one_element(operand, what, loc) -> ir.Region:
    """A one-element buffer or region named as a whole."""
    region = acc.region(operand, loc, what)
    if any(e != 1 for e in region.extents):
        raise CompileError(f"{what} must be one element, got {region.buffer.name}{list(region.extents)}", loc)
    return region


def _vector_head(operand, lanes, what, loc) -> tuple:
    """The indices of the first of `lanes` consecutive elements along the last dimension that
    `operand` names: a point (TileLang's head address) or a region of exactly those elements."""
    if isinstance(operand, acc.BufferAccess) and operand.is_point:
        return operand.buffer, acc.element_indices(operand)
    region = acc.region(operand, loc, what)
    if region.extents[-1] != lanes or any(e != 1 for e in region.extents[:-1]):
        raise CompileError(f"{what}: {region.buffer.name}{list(region.extents)} must be {lanes} consecutive "
                           f"elements of the last dimension", loc)
    return region.buffer, tuple(region.starts)


def _atomic_add_vector(lanes):
    """`T.atomic_addx2` / `T.atomic_addx4(dst, value)`: `dst[..., j + k] += value[..., j + k]` for
    k < lanes (one vector atomic on the GPU; element by element it adds the same values)."""

    def handler(p, a, loc):
        name = f"T.atomic_addx{lanes}"
        p.require_kernel(name, loc)
        if _bool(a["return_prev"], "return_prev", loc):
            raise CompileError(f"{name}(return_prev=True) is not supported by tritile: its value is discarded", loc)
        dst_buf, dst_at = _vector_head(a["dst"], lanes, f"{name} dst", loc)
        src_buf, src_at = _vector_head(a["value"], lanes, f"{name} value", loc)
        if dst_buf.scope != "global":
            raise CompileError(f"{name}: dst {dst_buf.name} must be a global tensor, not {dst_buf.scope}", loc)
        for k in range(lanes):
            at = dst_at[:-1] + (exprs.binary("+", dst_at[-1], k, loc),)
            value = ir.Load(src_buf, src_at[:-1] + (exprs.binary("+", src_at[-1], k, loc),), src_buf.dtype)
            p.emit(ir.AtomicAdd(ir.Region(dst_buf, at, tuple(1 for _ in at)),
                                exprs.cast(value, dst_buf.dtype, loc), loc=loc))

    return handler


def use_swizzle(p, a, loc):
    p.require_kernel("T.use_swizzle", loc)
    order = a["order"]
    if order not in ("row", "column", "col", "mlx"):
        raise CompileError(f"T.use_swizzle order must be 'row' or 'column', got {order!r}", loc)
    if _bool(a["enable"], "enable", loc):
        panel_size = _int(a["panel_size"], "panel_size", loc)
        if panel_size < 1:  # the backends and the interpreter each ordered the tiles their own way
            raise CompileError(f"T.use_swizzle panel_size must be at least 1, got {panel_size}", loc)
        p.swizzle = (panel_size, order)


def annotate_layout(p, a, loc):
    p.require_kernel("T.annotate_layout", loc)
    layout_map = a["layout_map"]
    if not isinstance(layout_map, dict):
        raise CompileError("T.annotate_layout takes a dict {buffer: layout}", loc)
    for buf, layout in layout_map.items():
        if not isinstance(buf, ir.Buffer):
            raise CompileError(f"T.annotate_layout keys must be buffers, got {buf!r}", loc)
        if isinstance(layout, SwizzledLayout):
            if buf.scope != "shared":
                raise CompileError(f"T.annotate_layout: a swizzled layout is for shared buffers, {buf.name} is "
                                   f"{buf.scope}", loc)
            continue  # the swizzle tritile's layout inference gives every shared buffer anyway
        if isinstance(layout, Layout) and _static_dims(layout.shape) and _static_dims(buf.shape) and \
                tuple(map(int, layout.shape)) != tuple(buf.shape):
            raise CompileError(f"T.annotate_layout: the layout of {buf.name} is for shape {list(layout.shape)}, "
                               f"the buffer has shape {list(buf.shape)}", loc)
        buf.annotated_layout = layout  # T.Layout / T.Fragment: see tritile/language/layout.py
    p.emit(ir.Evaluate("annotate_layout", tuple(b.name for b in layout_map), loc=loc))


def let(p, a, loc):
    """TVM's `T.let(v, value)`: binds Var `v` (made by `v = T.int32()`) to `value` for the rest of
    the block (a `Let`); `T.let(v, value, body)`: the expression `body` with `v` = `value`."""
    var, value = a["v"], p.scalar(a["value"], loc)
    if not isinstance(var, ir.Var):
        raise CompileError(f"T.let binds a variable made by `v = T.int32()` (or another dtype), got {var!r}", loc)
    value = exprs.cast(value, var.dtype, loc)
    if a["body"] is not None:
        return substitute_vars(p.scalar(a["body"], loc), {var: value})
    p.require_kernel("T.let", loc)
    p.emit(ir.Let(var, value, loc=loc))
    p.let_values[id(var)] = value
    return None


def func_attr(p, a, loc):
    if not isinstance(a["attrs"], dict):
        raise CompileError(f"T.func_attr takes a dict of attributes, got {a['attrs']!r}", loc)


def annotate_safe_value(p, a, loc):
    """`T.annotate_safe_value({A: v})`: out-of-bounds reads of global tensor A give v (for the
    whole kernel; TileLang scopes it to the enclosing block)."""
    p.require_kernel("T.annotate_safe_value", loc)
    safe_values = a["safe_value_map"]
    if not isinstance(safe_values, dict):
        raise CompileError("T.annotate_safe_value takes a dict {global tensor: value}", loc)
    for buf, value in safe_values.items():
        if not isinstance(buf, ir.Buffer) or buf.scope != "global":
            raise CompileError(f"T.annotate_safe_value keys must be global tensors, got {buf!r}", loc)
        if isinstance(value, ir.Const):
            value = value.value
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise CompileError(f"T.annotate_safe_value: the value of {buf.name} must be a number known at "
                               f"compile time, got {value!r}", loc)
        buf.safe_value = value
    p.emit(ir.Evaluate("annotate_safe_value", tuple((b.name, v) for b, v in safe_values.items()), loc=loc))


def assume(p, a, loc):
    """`T.assume(cond)`: a hint TVM's simplifier may use; tritile checks it is an expression and
    drops it (no pass here reasons about value ranges)."""
    p.require_kernel("T.assume", loc)
    if a["cond"] is not None:
        p.scalar(a["cond"], loc)


def device_assert(p, a, loc):
    p.require_kernel("T.device_assert", loc)
    msg = a["msg"]
    if not isinstance(msg, str) or not msg.isascii() or not msg.isprintable():
        raise CompileError(f"T.device_assert: msg must be a string of printable ASCII characters, got {msg!r}",
                           loc)
    cond = p.scalar(a["condition"], loc)
    if not isinstance(cond, ir.Expr):
        if not cond:
            raise CompileError(f"T.device_assert({cond!r}) always fails: {msg}", loc)
        return
    p.emit(ir.DeviceAssert(exprs.truth(cond), msg, loc=loc))


def sync_threads(p, a, loc):
    p.require_kernel("T.sync_threads", loc)
    if p.parallel_depth:
        raise CompileError("T.sync_threads inside T.Parallel: every thread must reach the barrier", loc)
    if a["barrier_id"] is not None or a["arrive_count"] is not None:
        count = a["arrive_count"].value if isinstance(a["arrive_count"], ir.Const) else a["arrive_count"]
        if getattr(p, "per_thread", None) is not None and isinstance(count, int):
            p.emit(ir.ThreadBarrier(loc=loc, participants=count))  # per_thread.py checks who arrives
            return
        raise CompileError("T.sync_threads(barrier_id=, arrive_count=) (a named barrier for part of the program's "
                           "threads) is supported only in per-thread code, with a compile-time arrive_count", loc)
    p.emit(ir.ThreadBarrier(loc=loc))


def annotate_pass_configs(p, a, loc):
    configs = a["configs"]
    if not isinstance(configs, dict):
        raise CompileError(f"T.annotate_pass_configs takes a dict {{PassConfigKey: value}}, got {configs!r}", loc)
    p.pass_configs.update(configs)


def annotate_compile_flags(p, a, loc):
    flags = a["flags"]
    if not isinstance(flags, (list, tuple)) or not all(isinstance(f, str) for f in flags):
        raise CompileError(f"T.annotate_compile_flags takes a list of strings, got {flags!r}", loc)
    p.compile_flags = list(flags)


def _static_dims(shape) -> bool:
    return all(isinstance(d, int) for d in shape)


def print_(p, a, loc):
    """`T.print`: an `ir.Print` of a scalar, a whole on-chip buffer (or region), or `msg` alone;
    the default message is TileLang's (`buffer<name, dtype>`, `expr<...>`)."""
    p.require_kernel("T.print", loc)
    if p.parallel_depth:
        raise CompileError("T.print inside T.Parallel is not supported: print the buffer after the loop", loc)
    obj, msg = a["obj"], a["msg"]
    if not isinstance(msg, str) or not msg.isascii() or not msg.isprintable():
        raise CompileError(f"T.print: msg must be a string of printable ASCII characters, got {msg!r}", loc)
    for key in ("warp_group_id", "warp_id"):
        if _int(a[key], f"T.print {key}", loc) < 0:
            raise CompileError(f"T.print: {key} must be >= 0, got {a[key]}", loc)
    if isinstance(obj, str):
        raise CompileError("T.print(obj, msg=...): pass the message as msg=..., obj=None prints it alone", loc)
    if obj is None:
        if not msg:
            raise CompileError("T.print() needs an object to print or a non-empty msg", loc)
        p.emit(ir.Print(None, msg, loc=loc))
        return
    tile = isinstance(obj, acc.BufferAccess) and not obj.is_point or (
        isinstance(obj, ir.Buffer) and obj.scope not in ("var", "local"))
    if tile:
        region = acc.region(obj, loc, "T.print obj")
        if region.buffer.scope == "global":
            raise CompileError(f"T.print of global tensor {region.buffer.name}: T.copy the tile to print into a "
                               f"fragment or shared buffer and print that", loc)
        p.emit(ir.Print(region, msg or f"buffer<{region.buffer.name}, {region.buffer.dtype}>", loc=loc))
        return
    if isinstance(obj, ir.Buffer) and obj.scope == "local":
        if any(d != 1 for d in obj.shape):
            raise CompileError(f"T.print of local buffer {obj.name}{list(obj.shape)}: print its elements", loc)
        obj = acc.BufferAccess(obj, tuple(0 for _ in obj.shape), loc)
    value = p.scalar(obj, loc)
    if not isinstance(value, ir.Expr):
        value = exprs.make_const(value, exprs.python_dtype(value))
    p.emit(ir.Print(value, msg or f"expr<{exprs.expr_str(value)}>", loc=loc))


# --------------------------------------------------------------------------------------
# loops
# --------------------------------------------------------------------------------------


def _range(p, start, stop, step, loc):
    if stop is None:
        start, stop = 0, start
    return (p.scalar(start, loc), p.scalar(stop, loc), 1 if step is None else p.scalar(step, loc))


def _int_list(value, what, loc):
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise CompileError(f"{what} must be a list of ints", loc)
    return [_int(v, what, loc) for v in value]


def pipelined(p, a, loc):
    start, stop, step = _range(p, a["start"], a["stop"], None, loc)
    order, stage = _int_list(a["order"], "order", loc), _int_list(a["stage"], "stage", loc)
    if (order is None) != (stage is None) or (order is not None and len(order) != len(stage)):
        raise CompileError("T.Pipelined: order and stage must be given together, with one entry per "
                           "statement", loc)
    num_stages = _int(a["num_stages"], "num_stages", loc)
    if num_stages < 0:
        raise CompileError(f"T.Pipelined: num_stages={num_stages} must be 0 (no pipelining) or more", loc)
    return LoopSpec("pipelined", start, stop, step, num_stages=num_stages, order=order, stage=stage)


def serial(p, a, loc):
    return LoopSpec("serial", *_range(p, a["start"], a["stop"], a["step"], loc))


def unroll(p, a, loc):
    return LoopSpec("unroll", *_range(p, a["start"], a["stop"], a["step"], loc))


def vectorized(p, a, loc):
    """Inside `T.Parallel`, from 0 to a constant: one more parallel dimension (the parser fuses
    `for i in T.Parallel(M): for j in T.vectorized(N)` into `T.Parallel(M, N)`); otherwise a
    serial loop, which computes the same values (a vectorizable loop carries no dependence)."""
    start, stop, step = _range(p, a["start"], a["stop"], None, loc)
    extent = exprs.static_difference(stop, start)
    if p.parallel_depth and exprs.static_difference(start, 0) == 0 and extent is not None and extent >= 1:
        return LoopSpec("parallel", extents=(extent,))
    return LoopSpec("serial", start, stop, step)


def lower_parallel(p, a, loc):
    """TVM's `T.parallel(start, stop=None)` (TileLang's tir script): a parallel `For`, which TileLang
    lowers as a one-dimensional `T.Parallel` over ``[start, stop)`` (nested ones form one nest); here a
    `T.Parallel(stop)` whose lanes below a nonzero `start` are masked off (the parser's guard)."""
    start, stop, _ = _range(p, a["start"], a["stop"], None, loc)
    stop = exprs.cast(stop, "int32", loc) if isinstance(stop, ir.Expr) else _int(stop, "T.parallel stop", loc)
    if not isinstance(start, ir.Expr):
        start = _int(start, "T.parallel start", loc)
        if start < 0:
            raise CompileError(f"T.parallel: a negative start ({start}) is not supported", loc)
    return LoopSpec("parallel", start=start, extents=(stop,))


def parallel(p, a, loc):
    extents = a["extents"]
    if len(extents) == 1 and isinstance(extents[0], (tuple, list)):
        extents = tuple(extents[0])
    if not extents:
        raise CompileError("T.Parallel needs at least one extent", loc)
    # an extent known only at run time (a scalar parameter, a min of one) is the parser's to bound
    return LoopSpec("parallel", extents=tuple(exprs.cast(p.scalar(e, loc), "int32", loc)
                                              if isinstance(e, (ir.Expr, acc.BufferAccess, ir.Buffer))
                                              else _int(e, "T.Parallel extent", loc) for e in extents))


# --------------------------------------------------------------------------------------
# scalar math on runtime values (Python numbers fold in tritile.language itself)
# --------------------------------------------------------------------------------------


def _binary(op):
    return lambda p, a, loc: exprs.binary(op, *(p.scalar(v, loc) for v in a.values()), loc)


def _binary_xy(op):
    """A tvm.tir operator `T.<name>(x, y, span=None)`: `span` (TVM's source span) is ignored."""
    return lambda p, a, loc: exprs.binary(op, p.scalar(a["x"], loc), p.scalar(a["y"], loc), loc)


def _intrinsic(fn):
    return lambda p, a, loc: exprs.math_call(fn, [p.scalar(v, loc) for v in a.values()], loc)


def ceildiv(p, a, loc):
    x, y = p.scalar(a["a"], loc), p.scalar(a["b"], loc)
    return exprs.binary("//", exprs.binary("-", exprs.binary("+", x, y, loc), 1, loc), y, loc)


def align_up(p, a, loc):
    """TVM's `align_up(x, y)`: ``ceildiv(x, y) * y``."""
    return exprs.binary("*", ceildiv(p, {"a": a["x"], "b": a["y"]}, loc), p.scalar(a["y"], loc), loc)


_LOGICAL_OF_ELEMENTS = 64  # the most elements T.any_of / T.all_of reads one by one


def _logical_of(name, op):
    """`T.any_of` / `T.all_of(buffer)`: the `or` / `and` of the truth of each element of a buffer
    or region of static extents (TileLang's flags of a block mask), each read as an element."""

    def handler(p, a, loc):
        region = acc.region(a["buffer"], loc, f"T.{name}")
        if prod(region.extents) > _LOGICAL_OF_ELEMENTS:
            raise CompileError(f"T.{name} of {region.buffer.name}: {prod(region.extents)} elements, more than the "
                               f"{_LOGICAL_OF_ELEMENTS} it reads one by one; reduce the region with T.reduce_* first",
                               loc)
        result = None
        for point in itertools.product(*(range(e) for e in region.extents)):
            index = tuple(exprs.binary("+", start, offset, loc) if offset else start
                          for start, offset in zip(region.starts, point))
            value = exprs.truth(ir.Load(region.buffer, index, region.buffer.dtype))
            result = value if result is None else exprs.binary(op, result, value, loc)
        return result

    return handler


def if_then_else(p, a, loc):
    cond = p.scalar(a["cond"], loc)
    return exprs.select(cond, p.scalar(a["true_value"], loc), p.scalar(a["false_value"], loc), loc)


def cast(p, a, loc):
    return exprs.cast(p.scalar(a["value"], loc), _dtype(a["dtype"], loc), loc)


def reinterpret(p, a, loc):
    """TileLang's `T.reinterpret(value, dtype)`: the bits of `value` read as `dtype`, a type of the
    same width (a Python int is an int32, a float a float32, as TVM's constants)."""
    value, dtype = p.scalar(a["value"], loc), _dtype(a["dtype"], loc)
    if exprs.is_python_scalar(value):
        value = exprs.make_const(value, exprs.python_dtype(value))
    if not isinstance(value, ir.Expr) or value.dtype.bits != dtype.bits or dtype.kind == "bool" or value.dtype.kind == "bool":
        raise CompileError(f"T.reinterpret: {getattr(value, 'dtype', value)} and {dtype} are not of the same width", loc)
    if value.dtype == dtype:
        return value
    if isinstance(value, ir.Const):  # folded: backends cannot bitcast a literal
        return exprs.make_const(reinterpret_bits(value.value, value.dtype, dtype), dtype)
    return ir.Call("reinterpret", (value,), dtype)


def infinity(p, a, loc):
    dtype = _dtype(a["dtype"], loc)
    if not dtype.is_float:  # TileLang (TVM) cannot decide one either
        raise CompileError(f"T.infinity takes a float dtype, not {dtype}", loc)
    return ir.Call("infinity", (), dtype)


def clamp(p, a, loc):
    """TileLang's `T.clamp`: ``T.min(T.max(dst, min_val), max_val)``."""
    low = exprs.binary("max", p.scalar(a["dst"], loc), p.scalar(a["min_val"], loc), loc)
    return exprs.binary("min", low, p.scalar(a["max_val"], loc), loc)


def select(p, a, loc):
    cond = p.scalar(a["condition"], loc)
    return exprs.select(cond, p.scalar(a["true_value"], loc), p.scalar(a["false_value"], loc), loc)


def _float_predicate(fn):
    """`T.isnan` / `T.isinf` / `T.isfinite`: a bool; integers are never NaN or infinite."""

    def handler(p, a, loc):
        x = p.scalar(a["x"], loc)
        if not x.dtype.is_float:
            return ir.Const(fn == "isfinite", bool_)
        return ir.Call(fn, (x,), bool_)

    return handler


HANDLERS = {
    "Kernel": kernel, "const": const, "empty": empty,
    "alloc_shared": _alloc("shared"), "alloc_fragment": _alloc("fragment"), "alloc_local": _alloc("local"),
    "alloc_var": alloc_var,
    "make_tensor": make_tensor, "match_buffer": match_buffer,
    "alloc_global": alloc_global,
    "alloc_reducer": alloc_reducer, "reducer_init": reducer_init, "reducer_update": reducer_update,
    "finalize_reducer": finalize_reducer,
    "reshape": views.reshape, "view": views.view,
    "copy": copy, "transpose": transpose, "im2col": im2col, "c2d_im2col": im2col, "gemm": gemm, "wgmma_gemm": wgmma_gemm, "wait_wgmma": wait_wgmma, "set_max_nreg": register_hint("set_max_nreg", ("reg_count", "is_inc")),
    "no_set_max_nreg": register_hint("no_set_max_nreg"),
    "disable_warp_group_reg_alloc": register_hint("disable_warp_group_reg_alloc"),
    "annotate_producer_reg_dealloc": register_hint("annotate_producer_reg_dealloc", ("reg_count",)),
    "annotate_consumer_reg_alloc": register_hint("annotate_consumer_reg_alloc", ("reg_count",)),
    "fence_proxy_async": register_hint("fence_proxy_async"), "fill": fill, "clear": clear, "cumsum": cumsum, "cummax": _cum_extremum("max"), "cummin": _cum_extremum("min"),
    "atomic_add": _atomic("add"), "atomic_max": _atomic("max"), "atomic_min": _atomic("min"),
    "atomic_addx2": _atomic_add_vector(2), "atomic_addx4": _atomic_add_vector(4),
    "atomic_load": atomic_load, "atomic_store": atomic_store,
    "reduce_max": _reduce("max"), "reduce_min": _reduce("min"), "reduce_sum": _reduce("sum"),
    "reduce_abssum": _reduce("abssum"), "reduce_absmax": _reduce("absmax"),
    **{f"reduce_{kind}": _reduce(kind) for kind in ("bitand", "bitor", "bitxor")},
    "use_swizzle": use_swizzle, "annotate_layout": annotate_layout, "annotate_safe_value": annotate_safe_value,
    "func_attr": func_attr, "print": print_, "let": let,
    "assume": assume, "device_assert": device_assert, "sync_threads": sync_threads, "annotate_pass_configs": annotate_pass_configs,
    "annotate_compile_flags": annotate_compile_flags,
    "Pipelined": pipelined, "serial": serial, "unroll": unroll, "Parallel": parallel, "parallel": lower_parallel,
    "vectorized": vectorized, "alloc_buffer": alloc_buffer,
    "ceildiv": ceildiv, "align_up": align_up, "any_of": _logical_of("any_of", "or"),
    "all_of": _logical_of("all_of", "and"), "floordiv": _binary("//"), "floormod": _binary("%"), "truncdiv": _binary("/"),
    "max": _binary("max"), "min": _binary("min"), "pow": _intrinsic("pow"),
    "get_thread_binding": thread_ranges.get_thread_binding, "thread_binding": thread_ranges.thread_binding,
    "tvm_warp_shuffle": thread_ranges.tvm_warp_shuffle,
    "rng_init": random.rng_init, "rng_rand": random.rng_rand,
    "if_then_else": if_then_else, "cast": cast, "Cast": cast, "reinterpret": reinterpret, "infinity": infinity,
    "clamp": clamp, "Select": select, **{fn: _float_predicate(fn) for fn in ("isnan", "isinf", "isfinite")},
    "shift_left": _binary_xy("<<"), "shift_right": _binary_xy(">>"), "bitwise_and": _binary_xy("&"),
    "bitwise_or": _binary_xy("|"), "bitwise_xor": _binary_xy("^"),
    "bitwise_not": lambda p, a, loc: exprs.unary("~", p.scalar(a["x"], loc), loc),
    **{fn: _intrinsic(fn) for fn in ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "abs", "tanh", "sin",
                                     "cos", "floor", "ceil", "sigmoid")},
}
