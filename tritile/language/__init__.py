"""The `T` namespace: TileLang's language surface (`import tritile.language as T`).

Contract
--------
* Names, signatures and defaults follow `tilelang.language` (see docs/architecture.md and the
  TileLang reference).  The frontend (`tritile.frontend`) reads a kernel's source and
  recognises these objects by identity; it binds each call against the Python signature
  declared here, so arity and keyword mistakes are reported exactly as TileLang spells them.
* Tile operations (`T.copy`, `T.gemm`, `T.Kernel`, `T.alloc_*`, loops, ...) have no Python
  behaviour: calling one directly raises `RuntimeError` telling the user it only works
  inside a kernel compiled by tritile - except from Python code the frontend runs while it
  traces a kernel (a lambda, a library function given runtime values): `TRACING` then lowers
  the call into that kernel, at the traced line.
* Pure helpers work anywhere: dtypes, `T.Tensor`/`T.Buffer` specs, `T.dynamic`,
  `T.GemmWarpPolicy`, `T.prim_func`, `T.macro`, and the arithmetic helpers (`T.ceildiv`,
  `T.max`, `T.exp`, ...) when all their arguments are Python numbers (they fold).
"""
from __future__ import annotations

import builtins as _builtins
import math
import threading as _threading

from tritile.ir import nodes as _ir
from tritile.ir import dtypes as _dtypes
from tritile.ir.dtypes import (  # noqa: F401  (re-exported dtypes)
    DType, as_dtype, bfloat16, bool_, float4_e2m1fn, float8_e4m3, float8_e5m2, float8_e8m0fnu, float16, float32,
    float64, int4, int8, int16, int32, int64, tfloat32, uint4, uint8, uint16, uint32, uint64,
)

from tritile.language.layout import Fragment, Layout  # noqa: F401,E402  (T.Layout, T.Fragment)

bool = bool_  # noqa: A001 - TileLang spells it T.bool
float = float32  # noqa: A001 - TileLang's T.float
float8_e4m3fn = float8_e4m3
float8_e5m2fn = float8_e5m2
dtype = as_dtype
dtypes = _dtypes.ALL  # TileLang's list of the scalar dtypes
# TVM's C-style names (`T.int`, `T.uint`, ...), served by `__getattr__` below, not bound as this
# module's globals: `int` there would shadow the builtin in this module's own code
_C_STYLE_DTYPES = {"int": int32, "uint": uint32, "short": int16, "long": int64, "ulong": uint64, "half": float16,
                   "double": float64}


def __getattr__(name):
    if name in _C_STYLE_DTYPES:
        return _C_STYLE_DTYPES[name]
    raise AttributeError(f"module 'tritile.language' has no attribute {name!r}")


globals().update({d.name: d for d in _dtypes.VECTORS})  # T.float32x2, T.float16x8, ...

# The frontend's table: stub function -> how it is lowered.  Filled by `_tile_op`.
TILE_OPS = {}


class _Tracing(_threading.local):
    """While the frontend runs Python code of the user's during a trace (`lower` set): how a T
    operation that code calls is lowered, ``lower(stub, args, kwargs)``, into the kernel."""

    lower = None


TRACING = _Tracing()


def _tile_op(fn):
    """Mark `fn` as an operation the frontend lowers; calling it from Python is an error."""
    name = fn.__name__

    def outside_kernel(*args, **kwargs):
        if TRACING.lower is not None:
            return TRACING.lower(outside_kernel, args, kwargs)
        raise RuntimeError(f"T.{name} can only be used inside a kernel compiled by tritile "
                           f"(@T.prim_func or @tritile.jit); it was called directly from Python")

    outside_kernel.__name__ = name
    outside_kernel.__qualname__ = name
    outside_kernel.__doc__ = fn.__doc__
    outside_kernel.__wrapped__ = fn  # the signature the frontend binds calls against
    TILE_OPS[outside_kernel] = fn
    return outside_kernel


def _foldable(name, fn):
    """An arithmetic helper: folds on Python numbers anywhere; the frontend lowers it on
    runtime values (it binds calls against `fn`'s signature)."""

    def helper(*args, **kwargs):
        values = list(args) + list(kwargs.values())
        if all(v is None or isinstance(v, (int, _builtins.float, str, DType)) for v in values):
            return fn(*args, **kwargs)
        if TRACING.lower is not None:
            return TRACING.lower(helper, args, kwargs)
        raise RuntimeError(f"T.{name} on runtime values can only be used inside a kernel compiled "
                           f"by tritile")

    helper.__name__ = name
    helper.__qualname__ = name
    helper.__wrapped__ = fn
    TILE_OPS[helper] = fn
    return helper


# --------------------------------------------------------------------------------------
# types and symbols
# --------------------------------------------------------------------------------------


class Tensor:
    """A global tensor type: `T.Tensor((M, K), T.float16)` or `T.Tensor[(M, K), "float16"]`; called in
    a kernel with `data=B.data`, a view of B's storage (tritile/frontend/views.py)."""

    default_scope = "global"

    def __init__(self, shape, dtype="float32", data=None, scope=None):
        if isinstance(shape, (int, _ir.Expr)):
            shape = (shape,)
        self.shape = tuple(shape)
        self.dtype = _dtypes.int64 if dtype is ptr else _dtypes.element_dtype(dtype)
        self.scope = self.default_scope

    def __class_getitem__(cls, keys):
        # TileLang's rule: keys holding a tuple, list or str (a dtype is a str) are the
        # arguments, (shape, dtype, ...); otherwise they are the shape: T.Tensor[M, N]
        if isinstance(keys, tuple) and any(isinstance(k, (tuple, list, str)) for k in keys):
            return cls(*keys)
        return cls(keys)

    def __repr__(self) -> str:
        return f"T.Tensor({list(self.shape)}, {self.dtype})"


Buffer = Tensor


class StridedTensor(Tensor):
    """A global tensor of given element strides, `T.StridedTensor((M, N), (ldA, 1), T.float16)`: the
    call's tensor must have them (a view such as `x[:, :N]` or a permuted slice, passed without a
    copy).  Strides are ints or expressions of runtime dims, or `T.dynamic` symbols bound from the
    tensor's strides.  The frontend checks them (a CompileError at the annotation's line)."""

    def __init__(self, shape, strides, dtype="float32", scope=None, *, data=None):
        super().__init__(shape, dtype)
        self.strides = tuple(strides) if isinstance(strides, (tuple, list)) else strides
        self.data = data

    def __repr__(self) -> str:
        return f"T.StridedTensor({list(self.shape)}, {self.strides!r}, {self.dtype})"


class _ScopedBuffer(Tensor):
    """TileLang's `T.SharedBuffer` / `T.FragmentBuffer` / `T.LocalBuffer` (tilelang/language/proxy.py):
    a buffer type of that scope, which annotates `@T.macro` parameters (the macro takes the caller's
    buffer as it is; TileLang ignores the annotation there too).  A kernel parameter so annotated
    is a CompileError (a kernel's tensors are global)."""

    def __init__(self, shape, dtype="float32", data=None, strides=None, elem_offset=None, scope=None, align=None,
                 offset_factor=None, buffer_type="", axis_separators=None):
        super().__init__(shape, dtype)
        self.scope = scope or self.default_scope

    def __repr__(self) -> str:
        return f"T.{type(self).__name__}({list(self.shape)}, {self.dtype})"


class SharedBuffer(_ScopedBuffer):
    default_scope = "shared.dyn"


class FragmentBuffer(_ScopedBuffer):
    default_scope = "local.fragment"


class LocalBuffer(_ScopedBuffer):
    default_scope = "local"


class GemmWarpPolicy:
    Square = "Square"
    FullRow = "FullRow"
    FullCol = "FullCol"


def dynamic(name: str, dtype="int32"):
    """A runtime dimension (one kernel for every value); "m, n" gives a tuple."""
    names = [n for n in name.replace(",", " ").split()]
    symbols = tuple(_ir.Var(n, as_dtype(dtype)) for n in names)
    return symbols[0] if len(symbols) == 1 else symbols


symbolic = dynamic  # deprecated TileLang spelling


def prim_func(fn=None, **options):
    """Parse `fn` into a tile-IR `PrimFunc` (closure values are compile-time constants)."""
    import sys

    from tritile.frontend import parse_prim_func

    caller_locals = sys._getframe(1).f_locals  # annotations may use the enclosing function's locals
    if fn is None:
        return lambda f: parse_prim_func(f, caller_locals)
    return parse_prim_func(fn, caller_locals)


class Macro:
    """`@T.macro`: a Python function whose body the frontend inlines at each call site."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = fn.__name__

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"T.macro {self.fn.__name__} can only be called inside a kernel")


class Ref:
    """`@T.macro def f(x: T.Ref)`: the parameter refers to the caller's buffer element (`f(A[i])`) or
    `T.alloc_var` variable; assigning it in the macro (`x = v`) writes there, reading it reads there."""


def macro(fn=None, **options):
    return Macro(fn) if fn is not None else Macro


# --------------------------------------------------------------------------------------
# kernel, buffers, loops (lowered by the frontend)
# --------------------------------------------------------------------------------------


@_tile_op
def Kernel(*blocks, threads=128, prelude=None, is_cpu=False):
    """`with T.Kernel(gx, gy, threads=128) as (bx, by):` — one CTA grid."""


@_tile_op
def const(names, dtype="int32"):
    """Eager style: compile-time dimensions taken from the argument shapes."""


@_tile_op
def empty(*shape, dtype="float32"):
    """Eager style: an output tensor the runtime allocates and the kernel returns."""


@_tile_op
def alloc_shared(shape, dtype, scope="shared.dyn"):
    pass


@_tile_op
def alloc_fragment(shape, dtype, scope="local.fragment"):
    pass


@_tile_op
def alloc_local(shape, dtype, scope="local"):
    pass


@_tile_op
def alloc_var(dtype, init=None, scope="local.var"):
    pass


@_tile_op
def alloc_barrier(arrive_count):
    """mbarriers (one, or one per entry of a list of arrive counts) for explicit warp
    specialization; see `tritile.ir.nodes.AllocBarrier` for their semantics."""


@_tile_op
def barrier_arrive(mbarrier):
    """Every thread running it arrives once at `mbarrier` (a barrier or `mbars[i]`)."""


@_tile_op
def barrier_wait(mbarrier, parity):
    """Wait until the phase of parity `parity` (0 / 1) of `mbarrier` has completed."""


@_tile_op
def mbarrier_arrive(mbarrier, cta_id=None):
    """TileLang's name of `T.barrier_arrive` (`cta_id=`, a peer CTA's cluster barrier: CompileError)."""


@_tile_op
def mbarrier_wait_parity(mbarrier, parity):
    """TileLang's name of `T.barrier_wait`."""


@_tile_op
def tma_copy(src, dst, *, barrier=None, cluster_mask=None, leader_scope_threads=None,
             eviction_policy=None, annotations=None):
    """A copy the program synchronises itself through `barrier` (TileLang's split-phase TMA)."""


@_tile_op
def ws(*warp_group_idx):
    """`with T.ws(0):` - code run only by the listed warp groups (128 threads each)."""


WarpSpecialize = ws


@_tile_op
def alloc_global(shape, dtype, scope="global"):
    """A global workspace tensor: allocated by the runtime for each call (contents undefined),
    shared by the function's `with T.Kernel` blocks; outside them."""


@_tile_op
def alloc_reducer(shape, dtype, op="sum", replication=None):
    """A fragment that `T.Parallel` loops update with ``r[i] = r[i] + x[i, j]`` (op "sum"),
    ``T.max`` / ``T.min`` (op "max" / "min") or `T.reducer_update`, reducing over the loop
    variable the index leaves out (tritile/frontend/reducers.py)."""


@_tile_op
def reducer_init(reducer, init=None):
    """Start `reducer` from its op's identity, or from `init`."""


@_tile_op
def reducer_update(target, value):
    """`target` (``r[i]``) combined with `value` by the reducer's op, inside `T.Parallel`."""


@_tile_op
def finalize_reducer(reducer, dst=None, batch=1, annotations=None):
    """End the reduction: the reducer holds its values (tritile reduces after each loop);
    with `dst` they are copied there."""


def ptr(dtype=None, storage_scope="global"):
    """TileLang's pointer type, here as the element type of a table of device addresses:
    `T.Tensor([n], T.ptr)` is a tensor of int64 (`tensor.data_ptr()` values) whose elements
    `T.make_tensor` turns into tensors; and as an eager kernel's parameter annotation, `A: T.ptr`,
    a tensor parameter whose type `A = T.match_buffer(A, shape, dtype)` gives in the body."""
    raise TypeError("T.ptr is only supported as a T.Tensor element type (a table of int64 addresses)")


@_tile_op
def match_buffer(param, shape=None, dtype="float32", data=None, strides=None, elem_offset=None, scope="global",
                 align=-1, offset_factor=0, buffer_type="default", axis_separators=None):
    """Eager style: `A = T.match_buffer(A, [M, N], T.float32)` gives the parameter `A: T.ptr` its
    tensor type (shape, dtype, `strides=`) in the body - what `A: T.Tensor[[M, N], T.float32]` does."""


@_tile_op
def make_tensor(ptr, shape, dtype="float32", strides=None):
    """A global tensor of `shape` and `dtype` (row-major) at the device address `ptr` (an int64
    value, such as an element of a `T.Tensor([n], T.ptr)` table) - TileLang's `T.make_tensor`.
    Read and written by masked loads and stores (never TMA); the memory must stay alive, and
    hold the whole shape, for the call (tritile/frontend/builtins.py)."""


@_tile_op
def reshape(src, shape):
    """A view of `src`'s storage with another shape of as many elements (tritile/frontend/views.py)."""


@_tile_op
def view(src, shape=None, dtype=None):
    """A view of `src`'s storage with another shape and / or dtype of as many bits."""


@_tile_op
def copy(src, dst, coalesced_width=None, disable_tma=False, eviction_policy=None,
         prefer_instruction=None, annotations=None, loop_layout=None):
    pass


@_tile_op
def let(v, value, body=None):
    """TVM's let: `v` (from `v = T.int32()`) bound to `value` for the rest of the block, or, with
    `body`, the expression `body` with `v` = `value`."""


@_tile_op
def any_of(buffer):
    """Whether any element of `buffer` (a buffer or a region of one) is true: a bool."""


@_tile_op
def all_of(buffer):
    """Whether every element of `buffer` (a buffer or a region of one) is true: a bool."""


@_tile_op
def transpose(src, dst, annotations=None):
    """``dst[j, i] = src[i, j]`` of a 2-D tile: dst (N, M) from src (M, N)."""


@_tile_op
def im2col(img, col, nhw_step, c_step, kernel, stride, dilation, pad, eviction_policy=None, annotations=None):
    """The (block_M, block_K) tile (`nhw_step`, `c_step`) of the im2col matrix of the NHWC
    image `img` for a square `kernel` convolution (tritile/frontend/builtins.py `im2col`)."""


@_tile_op
def c2d_im2col(img, col, nhw_step, c_step, kernel, stride, dilation, pad, eviction_policy=None, annotations=None):
    """TileLang's deprecated name of `T.im2col`."""


@_tile_op
def gemm(A, B, C, transpose_A=False, transpose_B=False, policy=GemmWarpPolicy.Square,
         clear_accum=False, k_pack=1, wg_wait=0, mbar=None, annotations=None):
    pass


@_tile_op
def wgmma_gemm(A, B, C, transpose_A=False, transpose_B=False, policy=GemmWarpPolicy.Square, clear_accum=False,
               annotations=None):
    """TileLang's explicit asynchronous Hopper WGMMA GEMM (with `T.wait_wgmma`, hand-made warp
    specialization): `T.gemm`.  tritile's tile statements complete in program order; its own
    passes issue and wait for wgmma."""


@_tile_op
def wait_wgmma(id):
    """TileLang's wait for the `T.wgmma_gemm`s in flight: nothing is in flight (see `T.wgmma_gemm`)."""


@_tile_op
def set_max_nreg(reg_count, is_inc):
    """TileLang's `setmaxnreg` hint of a hand-made warp-specialized kernel: accepted, no code
    (tritile's own warp specialization sets the partitions' registers)."""


@_tile_op
def no_set_max_nreg():
    """TileLang's switch-off of warp specialization's register reallocation: accepted, no code
    (tritile's own warp specialization sets the partitions' registers)."""


@_tile_op
def disable_warp_group_reg_alloc():
    """TileLang's alias of `T.no_set_max_nreg`: accepted, no code."""


@_tile_op
def annotate_producer_reg_dealloc(reg_count=24):
    """TileLang's register count for the producer warp group: accepted, no code (tritile gives its
    TMA producer 24)."""


@_tile_op
def annotate_consumer_reg_alloc(reg_count=240):
    """TileLang's register count for the consumer warp groups: accepted, no code (tritile gives
    them 240, or an even share of what the producer leaves)."""


@_tile_op
def fence_proxy_async(*args):
    """TileLang's `fence.proxy.async` of a hand-made warp-specialized kernel (shared memory written
    by threads, then read by wgmma / TMA): accepted, no code (tritile's backends fence every such
    write themselves; the warp groups' sections run in program order)."""


@_tile_op
def clear(buffer, annotations=None):
    pass


@_tile_op
def fill(buffer, value, annotations=None):
    pass


@_tile_op
def Pipelined(start, stop=None, num_stages=0, order=None, stage=None, sync=None, group=None,
              annotations=None):
    pass


@_tile_op
def Parallel(*extents, coalesced_width=None, loop_layout=None, prefer_async=None, annotations=None):
    pass


@_tile_op
def parallel(start, stop=None, *, annotations=None):
    """TVM's parallel `For` over ``[start, stop)`` (``range(start)`` without `stop`): TileLang lowers it
    as the one-dimensional `T.Parallel`; nested in one another (or in `T.Parallel`) they form one nest."""


@_tile_op
def serial(start, stop=None, step=None, annotations=None):
    pass


@_tile_op
def thread_binding(begin, end, thread="threadIdx.x", annotations=None):
    """TVM's launch-thread form `tx = T.thread_binding(0, n, thread="threadIdx.x")`: the kernel's
    thread index of that dimension, as `T.get_thread_binding(dim)` (tritile/frontend/per_thread.py)."""


@_tile_op
def get_thread_binding(dim=0):
    """TileLang's thread index of the kernel (dim 0, 1 or 2): 0 in a kernel of ``threads=1``;
    elsewhere a CompileError (tritile has no per-thread code; tritile/frontend/random.py)."""


@_tile_op
def tvm_warp_shuffle(mask, value, lane, width, warp_size):
    """TVM's warp shuffle (``__shfl_sync(mask, value, lane, width)``): kernels of ``threads=1``,
    where it is the thread's own `value` (tritile/frontend/random.py)."""


@_tile_op
def rng_init(seed, seq=None, off=0, generator="curandStatePhilox4_32_10_t"):
    """TileLang's ``curand_init(seed, seq, off)`` of the kernel's Philox4_32_10 generator (``seq``
    defaults to TileLang's ``tx + bx * threads``); kernels of ``threads=1`` (tritile/frontend/random.py)."""


@_tile_op
def rng_rand():
    """TileLang's ``curand()``: the generator's next uint32 (T.Parallel elements draw in row-major
    order; tritile/frontend/random.py)."""


@_tile_op
def Persistent(domain, wave_size, index, group_size=8):
    """`for bx, by in T.Persistent([m_tiles, n_tiles], sm_num, block_id):` - program `index` of
    `wave_size` walks the tiles of `domain`, in groups of `group_size` along the last
    dimension (tritile/frontend/persistent.py)."""


@_tile_op
def unroll(start, stop=None, step=None, explicit=False, unroll_factor=None, annotations=None):
    pass


Serial, Unroll = serial, unroll


@_tile_op
def vectorized(start, stop=None, *, annotations=None):
    """A loop whose iterations are independent (TVM vectorizes it): inside `T.Parallel` one more
    parallel dimension, elsewhere a serial loop."""


Vectorized = vectorized


@_tile_op
def alloc_buffer(shape, dtype="float32", data=None, strides=None, elem_offset=None, scope="global", align=-1,
                 offset_factor=0, buffer_type="default", axis_separators=None, annotations=None):
    """TVM's allocation, by `scope`: "shared" / "shared.dyn" (T.alloc_shared), "local.fragment"
    (T.alloc_fragment), "local" (T.alloc_local), "local.var" (T.alloc_var), "global" (T.alloc_global)."""


@_tile_op
def reduce_max(buffer, out, dim=-1, clear=True, batch=1, nan_propagate=False, annotations=None):
    pass


@_tile_op
def reduce_min(buffer, out, dim=-1, clear=True, batch=1, nan_propagate=False, annotations=None):
    pass


@_tile_op
def reduce_sum(buffer, out, dim=-1, clear=True, batch=1, annotations=None):
    pass


@_tile_op
def reduce_bitand(buffer, out, dim=-1, clear=True, batch=1, annotations=None):
    """The bitwise and of an integer tile along `dim`."""


@_tile_op
def reduce_bitor(buffer, out, dim=-1, clear=True, batch=1, annotations=None):
    """The bitwise or of an integer tile along `dim`."""


@_tile_op
def reduce_bitxor(buffer, out, dim=-1, clear=True, batch=1, annotations=None):
    """The bitwise xor of an integer tile along `dim`."""


@_tile_op
def reduce_abssum(buffer, out, dim=-1, batch=1, annotations=None):
    pass


@_tile_op
def reduce_absmax(buffer, out, dim=-1, clear=True, batch=1, nan_propagate=False, annotations=None):
    pass


@_tile_op
def cumsum(src, dst=None, dim=0, reverse=False, annotations=None):
    pass


@_tile_op
def cummax(src, dst=None, dim=0, reverse=False, annotations=None):
    """Running maximum of `src` along `dim` into `dst` (in place when `dst` is None)."""


@_tile_op
def cummin(src, dst=None, dim=0, reverse=False, annotations=None):
    """Running minimum of `src` along `dim` into `dst` (in place when `dst` is None)."""


@_tile_op
def atomic_add(dst, value, memory_order=None, return_prev=False, use_tma=False, annotations=None):
    pass


@_tile_op
def assume(cond=None):
    """A fact the compiler may rely on (TVM's `T.assume`): accepted, and used by nothing."""


@_tile_op
def sync_threads(barrier_id=None, arrive_count=None):
    """Every thread of the program waits here for all the others, their memory writes before it
    visible after it (CUDA's `__syncthreads`)."""


@_tile_op
def sync_grid():
    """Every block of the grid waits here for all the others (TileLang's cooperative grid barrier):
    tritile splits the kernel here into kernels launched one after another
    (tritile/frontend/grid_sync.py)."""


@_tile_op
def device_assert(condition, msg="", no_stack_info=False):
    """Fail where `condition` is false: the interpreter raises `tritile.errors.DeviceAssertError`
    with `msg`; on the GPU, Triton's device_assert (compiled only with TRITON_DEBUG=1)."""


@_tile_op
def annotate_pass_configs(configs):
    """`pass_configs` written in the kernel's body; those given to `tritile.jit` / `compile` win."""


@_tile_op
def annotate_compile_flags(flags):
    """Compile flags written in the kernel's body (recorded, like `compile_flags=`: nvcc's
    flags have no Triton counterpart)."""


@_tile_op
def atomic_max(dst, value, memory_order=None, return_prev=False, annotations=None):
    """``dst = max(dst, value)`` atomically (an element, or a tile as `T.atomic_add`'s)."""


@_tile_op
def atomic_min(dst, value, memory_order=None, return_prev=False, annotations=None):
    """``dst = min(dst, value)`` atomically (an element, or a tile as `T.atomic_add`'s)."""


@_tile_op
def atomic_load(src, memory_order="seq_cst"):
    """The value of one element of `src`, read atomically with `memory_order` ("relaxed",
    "consume", "acquire" or "seq_cst")."""


@_tile_op
def atomic_store(dst, src, memory_order="seq_cst"):
    """Write `src` to one element of `dst` atomically with `memory_order` ("relaxed", "release"
    or "seq_cst")."""


@_tile_op
def atomic_addx2(dst, value, return_prev=False):
    """`dst[..., j:j + 2] += value[..., j:j + 2]` (head addresses or 2-element regions)."""


@_tile_op
def atomic_addx4(dst, value, return_prev=False):
    """`dst[..., j:j + 4] += value[..., j:j + 4]` (head addresses or 4-element regions)."""


@_tile_op
def use_swizzle(panel_size, order="row", enable=True):
    pass


@_tile_op
def annotate_layout(layout_map):
    pass


@_tile_op
def func_attr(attrs):
    """TVM's function attributes (``T.func_attr({"tir.noalias": True})``): accepted and ignored -
    they direct TVM's own passes, which tritile does not run."""


@_tile_op
def annotate_safe_value(safe_value_map):
    """What out-of-bounds reads of each global tensor give ({tensor: value}; default 0)."""


@_tile_op
def print(obj=None, msg="", warp_group_id=0, warp_id=0):  # noqa: A001 - TileLang's name
    """Print at run time, once per block: a scalar or buffer element, a whole fragment or
    shared buffer (each element with its index), or, with `obj=None`, `msg` alone.  Output
    format: `tritile.ir.nodes.Print`.  `warp_group_id` / `warp_id` (TileLang's choice of the
    printing warp) are accepted; on the GPU every thread prints the values it holds."""


# --------------------------------------------------------------------------------------
# scalar math (fold on Python numbers; lowered to IR expressions on runtime values)
# --------------------------------------------------------------------------------------

def _ceildiv(a, b):
    return -(-a // b)


def _rsqrt(x):
    return 1.0 / math.sqrt(x)


def _if_then_else(cond, true_value, false_value):
    return true_value if cond else false_value


def _cast(value, dtype):
    dt = as_dtype(dtype)
    return _builtins.float(value) if dt.is_float else (value != 0) if dt.kind == "bool" else int(value)


def _reinterpret(value, dtype):
    """The bits of a Python number read as `dtype` (an int is an int32, a float a float32, as
    TVM's constants)."""
    from tritile.interpreter.values import reinterpret_bits

    src = as_dtype("float32" if isinstance(value, _builtins.float) else "int32")
    dst = as_dtype(dtype)
    if dst.bits != 32:
        raise TypeError(f"T.reinterpret: {src} and {dst} are not of the same width")
    return reinterpret_bits(value, src, dst)


def _infinity(dtype):
    if not as_dtype(dtype).is_float:
        raise TypeError(f"T.infinity takes a float dtype, not {as_dtype(dtype)}")
    return math.inf


ceildiv = _foldable("ceildiv", _ceildiv)
floordiv = _foldable("floordiv", lambda a, b: a // b)
floormod = _foldable("floormod", lambda a, b: a % b)
truncdiv = _foldable("truncdiv", lambda a, b: int(a / b))
max = _foldable("max", lambda a, b: a if a >= b else b)  # noqa: A001
min = _foldable("min", lambda a, b: a if a <= b else b)  # noqa: A001
exp = _foldable("exp", lambda x: math.exp(x))
exp2 = _foldable("exp2", lambda x: 2.0 ** x)
log = _foldable("log", lambda x: math.log(x))
log2 = _foldable("log2", lambda x: math.log2(x))
sqrt = _foldable("sqrt", lambda x: math.sqrt(x))
rsqrt = _foldable("rsqrt", _rsqrt)
abs = _foldable("abs", lambda x: x if x >= 0 else -x)  # noqa: A001
tanh = _foldable("tanh", lambda x: math.tanh(x))
sin = _foldable("sin", lambda x: math.sin(x))
cos = _foldable("cos", lambda x: math.cos(x))
floor = _foldable("floor", lambda x: math.floor(x))
ceil = _foldable("ceil", lambda x: math.ceil(x))
sigmoid = _foldable("sigmoid", lambda x: 1.0 / (1.0 + math.exp(-x)))
pow = _foldable("pow", lambda x, y: x ** y)  # noqa: A001
if_then_else = _foldable("if_then_else", _if_then_else)
cast = _foldable("cast", _cast)
Cast = _foldable("Cast", lambda dtype, value: _cast(value, dtype))  # TileLang's T.Cast(dtype, value)
infinity = _foldable("infinity", _infinity)
reinterpret = _foldable("reinterpret", lambda value, dtype: _reinterpret(value, dtype))

# TileLang's tvm.tir spellings of expressions above (tilelang/language/customize.py, tir/ir.py)
align_up = _foldable("align_up", lambda x, y: _ceildiv(x, y) * y)
clamp = _foldable("clamp", lambda dst, min_val, max_val: _builtins.min(_builtins.max(dst, min_val), max_val))
Select = _foldable("Select", lambda condition, true_value, false_value, span=None:
                   true_value if condition else false_value)
isnan = _foldable("isnan", lambda x, span=None: math.isnan(x))
isinf = _foldable("isinf", lambda x, span=None: math.isinf(x))
isfinite = _foldable("isfinite", lambda x, span=None: math.isfinite(x))
shift_left = _foldable("shift_left", lambda x, y, span=None: x << y)
shift_right = _foldable("shift_right", lambda x, y, span=None: x >> y)
bitwise_and = _foldable("bitwise_and", lambda x, y, span=None: x & y)
bitwise_or = _foldable("bitwise_or", lambda x, y, span=None: x | y)
bitwise_xor = _foldable("bitwise_xor", lambda x, y, span=None: x ^ y)
bitwise_not = _foldable("bitwise_not", lambda x, span=None: ~x)
