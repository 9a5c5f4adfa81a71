"""The tile IR: plain, typed dataclasses.

Every stage of the compiler (the frontend's output and the output of every pass) is a
`PrimFunc` made of these nodes, can be printed (`tritile.ir.printer`) and executed by the
reference interpreter (`tritile.interpreter`).

Identity rules
--------------
* `Var` and `Buffer` are compared by identity (``eq=False``): two buffers with the same
  name are different buffers.  Passes that change a buffer (versioning adds a leading
  stage dimension) build a new `Buffer` whose `origin` points at the frontend's buffer, and
  substitute it everywhere in one step (`tritile.ir.transform.substitute_buffers`).  No pass
  ever expands a buffer that already has versions.
* All other nodes are values; passes rebuild them with `dataclasses.replace`.

Shapes and regions
------------------
A buffer's `shape` is its allocation shape; entries are `int` or an `Expr` (a runtime
`T.dynamic` dimension of a global tensor).  Tile ops address buffers through `Region`s:
a start per dimension and a static extent per dimension.  A tile op's operand shape is the
region's extents with unit dimensions dropped (`Region.tile_shape`), so `A_shared` of a
versioned buffer ``[4, 64, 32]`` is addressed as ``A_shared[slot, 0:64, 0:32]`` with extents
``(1, 64, 32)`` and tile shape ``(64, 32)``.

Async model (after `pipeline_injection`)
----------------------------------------
* `AsyncCopy` issues a global->shared copy whose data becomes visible only when a
  `WaitGroup` covers the commit group it belongs to.
* `CommitGroup` closes the current group of async copies (possibly empty).
* `WaitGroup(pending=n)` blocks until at most `n` committed groups are still in flight.
* `Gemm(is_async=True)` reads its A/B operands until a `WaitMMA(pending=n)` leaves at most
  `n` async gemms in flight; its accumulator may not be touched before that either.
The `iteration`/`slot` fields on these nodes are descriptive (which pipeline iteration and
which buffer version they serve); code generators use them to index mbarrier rings, the
interpreter uses them to check that a wait really covers what it claims to cover.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Optional, Union

from tritile.ir.dtypes import DType, bool_, float32, int32

# --------------------------------------------------------------------------------------
# source locations
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceLoc:
    filename: str
    lineno: int
    col: int = 0
    line: str = ""

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}"


# --------------------------------------------------------------------------------------
# expressions
# --------------------------------------------------------------------------------------


class Expr:
    """A scalar expression.  Python's arithmetic operators build IR (folding and promoting as
    in a kernel body), so helper code run by Python on runtime sizes - `M // block_M`,
    `n % 4` on a `T.dynamic` dimension - works as in TileLang.  Comparisons are not
    overloaded: IR nodes compare as values (or, Vars, by identity)."""

    dtype: DType

    def _binary(self, op, lhs, rhs):
        from tritile.frontend.exprs import binary  # the frontend owns folding and promotion rules

        other = rhs if lhs is self else lhs
        if not isinstance(other, (Expr, int, float)):
            return NotImplemented  # the other operand's reflected operator may know it (an element access)
        return binary(op, lhs, rhs)

    def __add__(self, other):
        return self._binary("+", self, other)

    def __radd__(self, other):
        return self._binary("+", other, self)

    def __sub__(self, other):
        return self._binary("-", self, other)

    def __rsub__(self, other):
        return self._binary("-", other, self)

    def __mul__(self, other):
        return self._binary("*", self, other)

    def __rmul__(self, other):
        return self._binary("*", other, self)

    def __truediv__(self, other):
        return self._binary("/", self, other)

    def __rtruediv__(self, other):
        return self._binary("/", other, self)

    def __floordiv__(self, other):
        return self._binary("//", self, other)

    def __rfloordiv__(self, other):
        return self._binary("//", other, self)

    def __mod__(self, other):
        return self._binary("%", self, other)

    def __rmod__(self, other):
        return self._binary("%", other, self)

    def __neg__(self):
        from tritile.frontend.exprs import unary

        return unary("-", self)

    def astype(self, dtype):
        """TVM's `PrimExpr.astype(dtype)` (`A[i].astype(accum_dtype)`): the value cast to `dtype`."""
        from tritile.frontend.exprs import cast

        return cast(self, dtype)


_var_ids = itertools.count()


@dataclass(eq=False)
class Var(Expr):
    """A scalar name: loop variable, block index, runtime dimension or `Let` binding.

    `multiple_of` is a divisor its value is known to have: a runtime dimension of a program
    specialised at launch on its divisibility (`tritile.ir.divisibility`) carries 16; 1 says
    nothing.  Passes asking whether an expression is aligned (`tritile.ir.instructions`) read it."""

    name: str
    dtype: DType = int32
    uid: int = field(default_factory=lambda: next(_var_ids))
    multiple_of: int = 1

    def __repr__(self) -> str:
        return f"Var({self.name})"


@dataclass
class Const(Expr):
    value: Union[int, float, bool]
    dtype: DType = int32


BINARY_OPS = ("+", "-", "*", "/", "//", "%", "**", "<", "<=", ">", ">=", "==", "!=",
              "and", "or", "&", "|", "^", "<<", ">>", "max", "min")
COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")


@dataclass
class BinOp(Expr):
    """``lhs op rhs``.  ``//`` and ``%`` are floor division / floor modulo (Python and
    TileLang's `T.floordiv` / `T.floormod`); ``/`` on integers is C-style truncation as in
    TileLang.  `dtype` is the result type (bool for comparisons and logic)."""

    op: str
    lhs: Expr
    rhs: Expr
    dtype: DType = int32


UNARY_OPS = ("-", "not", "~")


@dataclass
class UnaryOp(Expr):
    op: str
    operand: Expr
    dtype: DType = int32


# math intrinsics understood by every backend; "if_then_else" has three arguments
INTRINSICS = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "abs", "max", "min", "if_then_else",
              "floor", "ceil", "tanh", "sin", "cos", "sigmoid", "infinity", "pow", "fma",
              "isnan", "isinf", "isfinite",  # these three: float -> bool predicates
              "philox",  # (seed, subsequence, position), int64 -> uint32: draw `position` of cuRAND's
                         # curand_init(seed, subsequence, 0) Philox4_32_10 stream (frontend/random.py)
              "reinterpret")  # (value,): its bits read as the call's dtype, of the same width


@dataclass
class Call(Expr):
    fn: str
    args: tuple
    dtype: DType = float32


@dataclass
class Cast(Expr):
    value: Expr
    dtype: DType = float32


@dataclass
class Load(Expr):
    """Element read ``buffer[indices]`` (one index per buffer dimension)."""

    buffer: "Buffer"
    indices: tuple
    dtype: DType = float32


@dataclass(frozen=True, eq=False)
class ConstTable:
    """A table of int32 values fixed at compile time that a kernel reads at run time (the
    persistent tile schedule of lowering/persistent_tiles.py).  Backends pass it to the
    kernel as one more global tensor, which the runtime fills once per device; `digest`
    names the contents, so two programs print alike only if their tables are equal."""

    name: str
    values: tuple

    @property
    def digest(self) -> str:
        import hashlib

        return hashlib.sha256(repr(self.values).encode()).hexdigest()[:12]


@dataclass
class TableRead(Expr):
    """``table[index]``: one entry of a `ConstTable` (the index is a scalar in range)."""

    table: ConstTable
    index: Expr
    dtype: DType = int32


# --------------------------------------------------------------------------------------
# buffers and regions
# --------------------------------------------------------------------------------------

SCOPES = ("global", "shared", "fragment", "local", "var")


@dataclass(eq=False)
class Buffer:
    """A tensor argument (scope "global") or an on-chip allocation.

    `origin` is the frontend's buffer this one was derived from (None for frontend
    buffers); `num_versions` is how many versions the leading dimension holds (1 = not
    versioned): one per pipeline stage, or one per consumer partition.  `layout` is filled
    by layout inference (a codegen encoding object); `annotated_layout` is what the user
    pinned with `T.annotate_layout`.  `safe_value` (a global tensor's `T.annotate_safe_value`) is
    what an out-of-bounds read of it gives, converted to its dtype; None: 0.

    `view_of` is set on a *view* (`T.reshape`, `T.view`, `T.Tensor(shape, dtype, A.data)`):
    the buffer whose storage this one reinterprets - the same bytes from the first, in
    row-major order, in this buffer's shape and dtype (same total bits).  It is always a
    buffer with storage of its own (a view of a view is a view of that one's storage) and
    of the same scope.  A global view is a `PrimFunc.views` entry; an on-chip view is
    declared by an `Alloc` after its storage's, allocates nothing, and exists only until
    `lowering/buffer_views.py`.

    `strides` (global tensors only) are a `T.StridedTensor`'s element strides, one per dim:
    ints or `Expr`s of the runtime dims like `shape` (a `T.dynamic` Var only a stride names is
    bound from the call's tensor, `PrimFunc.stride_bindings`).  None: row-major, the strides of
    a contiguous tensor of `shape` (`T.Tensor`).

    `address` (global tensors only) is set on a `T.make_tensor(address, shape, dtype)` tensor: the
    int64 Var (bound by a `Let` before the tensor's uses) holding the device address of its first
    element; such a tensor is no parameter: every backend addresses it as a pointer cast from
    that value (row-major, unaligned as far as the compiler knows: no TMA), the interpreter as a
    view of the memory at it.
    """

    name: str
    shape: tuple
    dtype: DType
    scope: str
    origin: Optional["Buffer"] = None
    num_versions: int = 1
    layout: object = None
    annotated_layout: object = None
    loc: Optional[SourceLoc] = None
    safe_value: object = None
    view_of: Optional["Buffer"] = None
    strides: Optional[tuple] = None
    address: Optional["Var"] = None

    @property
    def root(self) -> "Buffer":
        return self.origin.root if self.origin is not None else self

    @property
    def tile_shape(self) -> tuple:
        """Shape of one version (the allocation shape without the stage dimension)."""
        return tuple(self.shape[1:]) if self.num_versions > 1 else tuple(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"Buffer({self.name}, {list(self.shape)}, {self.dtype}, {self.scope})"


@dataclass
class Region:
    """``buffer[starts[i] : starts[i] + extents[i], ...]`` with static extents."""

    buffer: Buffer
    starts: tuple
    extents: tuple

    @property
    def tile_shape(self) -> tuple:
        shape = tuple(e for e in self.extents if e != 1)
        return shape if shape else (1,)

    @staticmethod
    def full(buffer: Buffer) -> "Region":
        return Region(buffer, tuple(Const(0) for _ in buffer.shape), tuple(buffer.shape))


# --------------------------------------------------------------------------------------
# statements
# --------------------------------------------------------------------------------------


class Stmt:
    loc: Optional[SourceLoc]


@dataclass
class Seq(Stmt):
    stmts: list
    loc: Optional[SourceLoc] = None


@dataclass
class Alloc(Stmt):
    """Declares an on-chip buffer; for scope "var" `init` is its initial value.  Of a view
    (`buffer.view_of` set) it allocates nothing: from here on `buffer` names that storage."""

    buffer: Buffer
    init: Optional[Expr] = None
    loc: Optional[SourceLoc] = None


@dataclass
class Let(Stmt):
    """Binds an immutable scalar: ``var = value`` for the rest of the enclosing Seq."""

    var: Var
    value: Expr
    loc: Optional[SourceLoc] = None


@dataclass
class Store(Stmt):
    """Element write ``buffer[indices] = value``."""

    buffer: Buffer
    indices: tuple
    value: Expr
    loc: Optional[SourceLoc] = None


@dataclass
class Copy(Stmt):
    """Tile copy with TileLang semantics: out-of-bounds global reads give 0 and
    out-of-bounds global writes are dropped; values are cast to the destination dtype."""

    src: Region
    dst: Region
    loc: Optional[SourceLoc] = None


@dataclass
class AsyncCopy(Stmt):
    """A global->shared `Copy` whose data is visible only after a covering `WaitGroup`.
    `iteration` is the pipeline iteration it loads for; `slot` the version it writes."""

    src: Region
    dst: Region
    iteration: Optional[Expr] = None
    slot: Optional[Expr] = None
    loc: Optional[SourceLoc] = None


@dataclass
class CommitGroup(Stmt):
    iteration: Optional[Expr] = None
    loc: Optional[SourceLoc] = None


@dataclass
class WaitGroup(Stmt):
    """Wait until at most `pending` commit groups are in flight.  `iteration` names the
    group this wait is meant to complete (checked by the interpreter)."""

    pending: int
    iteration: Optional[Expr] = None
    loc: Optional[SourceLoc] = None


GEMM_POLICIES = ("Square", "FullRow", "FullCol")


@dataclass
class Gemm(Stmt):
    """``C (+)= op(A) @ op(B)``; transpose_A means A is stored (K, M), transpose_B means B
    is stored (N, K).  clear_accum=True overwrites C.  tf32=True: float32 A and B are read as
    TF32, their mantissas truncated to 10 bits as the tensor cores do (TileLang's
    `T.tfloat32` operands); otherwise float32 operands keep float32's precision."""

    a: Region
    b: Region
    c: Region
    transpose_a: bool = False
    transpose_b: bool = False
    policy: str = "Square"
    clear_accum: bool = False
    is_async: bool = False
    tf32: bool = False
    loc: Optional[SourceLoc] = None


@dataclass
class WaitMMA(Stmt):
    pending: int
    loc: Optional[SourceLoc] = None


@dataclass
class Fill(Stmt):
    dst: Region
    value: Expr
    loc: Optional[SourceLoc] = None


REDUCE_KINDS = ("max", "min", "sum", "abssum", "absmax", "bitand", "bitor", "bitxor")  # bit*: integers


@dataclass
class Reduce(Stmt):
    """``dst (op)= reduce_op(src, dim)``; with clear=False the old `dst` takes part.
    `nan_propagate` (max/min/absmax of floats): a NaN makes the result NaN; without it NaNs
    are ignored, the result is NaN only when every value is (docs/semantics.md)."""

    kind: str
    src: Region
    dst: Region
    dim: int
    clear: bool = True
    loc: Optional[SourceLoc] = None
    nan_propagate: bool = False


@dataclass
class Cumsum(Stmt):
    src: Region
    dst: Region
    dim: int = 0
    reverse: bool = False
    loc: Optional[SourceLoc] = None


@dataclass
class CumExtremum(Stmt):
    """`T.cummax` / `T.cummin` (`kind` "max" / "min"): the running maximum / minimum of `src`
    along tile dimension `dim` (from the end when `reverse`) into `dst`; NaN propagates
    (torch.cummax's rule)."""

    kind: str
    src: Region
    dst: Region
    dim: int = 0
    reverse: bool = False
    loc: Optional[SourceLoc] = None


@dataclass
class AtomicAdd(Stmt):
    """``dst += value`` atomically, or with `kind` "max" / "min" ``dst = max(dst, value)`` /
    ``min`` (`T.atomic_max` / `T.atomic_min`; of floats NaN-ignoring in the interpreter, a NaN
    is unspecified on the GPU), or with `kind` "exchange" ``dst = value`` (`T.atomic_store`);
    `value` is a Region (tile form) or an Expr (scalar form, `dst` then has all extents 1).
    Inside `T.Parallel` the scalar form is one atomic per lane, whether or not its address and
    value vary with the lane (TileLang runs every iteration).  `sem` is the memory order of
    each element's atomic in Triton's words ("relaxed", "acquire", "release", "acq_rel"):
    TileLang's `memory_order`, relaxed by default as its CUDA atomicAdd.  `prev` (scalar form
    only: `return_prev=True`, `T.atomic_load`) is bound, like a `Let`'s var, to the element's
    value just before this atomic, for the rest of the enclosing Seq (per lane inside
    `T.Parallel`: lanes of one element see each other's updates in some order)."""

    dst: Region
    value: Union[Region, Expr]
    loc: Optional[SourceLoc] = None
    kind: str = "add"
    sem: str = "relaxed"
    prev: Optional[Var] = None


@dataclass
class Evaluate(Stmt):
    """A side-effect-free marker kept for printing (e.g. `T.use_swizzle`,
    `T.annotate_layout`); `args` are plain Python values."""

    name: str
    args: tuple = ()
    loc: Optional[SourceLoc] = None


@dataclass
class Print(Stmt):
    """`T.print(obj, msg)`: print at run time `value` - a scalar `Expr`, an on-chip buffer's
    `Region` (every element with its index) or None (`msg` alone) - after `msg`, in Triton's
    `device_print` format (tritile/interpreter/executor.py: once per block there; on the GPU
    from every thread holding a value).  It reads and never writes; passes treat it as any
    other statement."""

    value: Union[Region, Expr, None]
    msg: str
    loc: Optional[SourceLoc] = None


@dataclass
class ThreadBarrier(Stmt):
    """`T.sync_threads()`: every thread of the program waits here until all have arrived, and
    their memory operations before it (shared and global) are visible to each other after it
    (CUDA's `__syncthreads`).  Programs order one thread's global writes before a gpu-scope
    atomic that another program acquires (split-K's last-arrival fixup) with it.  The
    interpreter runs a program's threads in lockstep, so there it orders nothing new.
    `participants`: a named barrier of that many threads (`T.sync_threads(barrier_id,
    arrive_count)`), only in per-thread code, which frontend/per_thread.py removes."""

    loc: Optional[SourceLoc] = None
    participants: Optional[int] = None


@dataclass
class DeviceAssert(Stmt):
    """`T.device_assert(cond, msg)`: the program is wrong where `cond` is false (for any active
    lane inside `T.Parallel`).  The interpreter raises `tritile.errors.DeviceAssertError` with
    `msg`; the GPU backends emit Triton's device_assert, which Triton compiles only in debug
    mode (TRITON_DEBUG=1) and drops otherwise.  It reads and never writes."""

    cond: Expr
    msg: str
    loc: Optional[SourceLoc] = None


@dataclass
class PipelineSchedule:
    """Per top-level body statement of a pipelined loop: its stage and its order; `staged`
    names the shared buffers the loop versions as register-staged wgmma operands
    (lowering/buffer_versioning.py)."""

    stages: list
    orders: list
    staged: tuple = ()


LOOP_KINDS = ("serial", "unroll", "pipelined")


@dataclass
class For(Stmt):
    """``for var in range(start, stop, step)``.

    kind "pipelined" carries TileLang's `num_stages` / `order` / `stage`; `schedule` is
    filled by pipeline planning.  After pipeline injection the loop is "serial" again and
    `pipelined_from` keeps the number of stages it was software-pipelined with; `foldable`
    says that every unit of its body but the async copies runs at the pipeline's last stage
    (its epilogue is its body without the copies, see lowering/consumer_loop_folding.py),
    and `trips`, set when that pass folded the epilogue in, is the pipeline's iteration
    count n (the loop then runs to ``n + D``; without it, n is `stop`).  `release_ahead`: a
    warp-specialized consumer releases the slot each step read at the step's copies
    (lowering/release_ahead.py)."""

    var: Var
    start: Expr
    stop: Expr
    body: Seq
    kind: str = "serial"
    step: Expr = field(default_factory=lambda: Const(1))
    num_stages: int = 0
    order: Optional[list] = None
    stage: Optional[list] = None
    schedule: Optional[PipelineSchedule] = None
    pipelined_from: int = 0
    foldable: bool = False
    trips: Optional[Expr] = None
    release_ahead: bool = False
    loc: Optional[SourceLoc] = None

    @property
    def pipeline_trips(self) -> Expr:
        """The iteration count of the pipeline whose steady state this loop is (see above)."""
        return self.stop if self.trips is None else self.trips


@dataclass
class Parallel(Stmt):
    """``for i, j in T.Parallel(M, N)``: every point of the iteration space is independent."""

    vars: tuple
    extents: tuple
    body: Seq
    loc: Optional[SourceLoc] = None


@dataclass
class If(Stmt):
    cond: Expr
    then_body: Seq
    else_body: Optional[Seq] = None
    loc: Optional[SourceLoc] = None


@dataclass
class While(Stmt):
    cond: Expr
    body: Seq
    loc: Optional[SourceLoc] = None


# Explicit warp specialization (TileLang's `T.alloc_barrier`, `T.ws`, `T.barrier_*`): the
# program itself names which warp groups run which code and synchronises them through
# mbarriers.  A barrier is a `Buffer` of scope "barrier" (one mbarrier per element); it
# starts in phase 0 with no arrivals; a phase completes once `arrive_counts[i]` threads
# have arrived, and `BarrierWait(parity=p)` returns once the phase of parity p has
# completed (so it returns at once for p = 1 on a fresh barrier: mbarrier try_wait.parity).


@dataclass
class AllocBarrier(Stmt):
    """`T.alloc_barrier(arrive_count)`: declares the mbarriers of `buffer`, element i
    expecting `arrive_counts[i]` thread arrivals per phase."""

    buffer: Buffer
    arrive_counts: tuple
    loc: Optional[SourceLoc] = None


@dataclass
class BarrierArrive(Stmt):
    """Every thread running this statement arrives once at mbarrier `buffer[index]`."""

    buffer: Buffer
    index: Expr
    loc: Optional[SourceLoc] = None


@dataclass
class BarrierWait(Stmt):
    """Blocks until the phase of parity `parity` (0 or 1) of mbarrier `buffer[index]` completed."""

    buffer: Buffer
    index: Expr
    parity: Expr
    loc: Optional[SourceLoc] = None


@dataclass
class WarpGroups(Stmt):
    """`with T.ws(*groups):` - `body` runs only on the warp groups (128 threads each, by thread
    index) listed in `groups`; other warp groups skip it."""

    groups: tuple
    body: Seq
    loc: Optional[SourceLoc] = None

    @property
    def threads(self) -> int:
        return WARP_GROUP_THREADS * len(self.groups)


WARP_GROUP_THREADS = 128


@dataclass
class ConsumerPartitions(Stmt):
    """The kernel's compute split across `count` consumer partitions of a warp-specialized
    kernel (lowering/consumer_partitions.py): `body` runs once per partition, with `var` =
    0 .. count - 1, concurrently, each partition on ``threads // count`` of the kernel's
    threads.  Buffers allocated in `body` are private to a partition; shared buffers
    allocated before this statement are common to all.  The partitions share only data the
    producer's async copies write (the same for every partition) and write disjoint
    places, so running them one after another, as the interpreter does, gives the values
    of running them at once."""

    var: Var
    count: int
    body: Seq
    loc: Optional[SourceLoc] = None


# --------------------------------------------------------------------------------------
# the kernel
# --------------------------------------------------------------------------------------


@dataclass
class Kernel:
    """One `with T.Kernel(*grid, threads=...) as (bx, by, bz)` block."""

    grid: tuple  # Exprs, 1 to 3
    block_vars: tuple  # Vars bound to the program ids
    threads: int
    body: Seq
    swizzle: Optional[tuple] = None  # (panel_size, order) from T.use_swizzle
    loc: Optional[SourceLoc] = None

    @property
    def partition_threads(self) -> int:
        """The threads that run one instance of the body's code: `threads`, or
        ``threads // count`` when the body is split into `ConsumerPartitions`."""
        for s in self.body.stmts:
            if isinstance(s, ConsumerPartitions):
                return self.threads // s.count
        return self.threads


@dataclass(frozen=True)
class WarpSpecialization:
    """The warp-specialization plan of a kernel (``PrimFunc.attrs["warp_specialization"]``,
    lowering/warp_specialization.py): a producer partition of `producer_warps` warps with
    `producer_registers` registers issues the async copies of the pipelined loops `loops`
    (their loop variables' names) and, once per tile, the synchronous copies filling the
    shared buffers named in `tile_loads` (FlashAttention's Q tile); the kernel's own warps
    consume."""

    producer_warps: int
    producer_registers: int
    loops: tuple
    tile_loads: tuple = ()


@dataclass
class PrimFunc:
    """A compiled-program unit: global tensor parameters, runtime scalars and one kernel.

    `params` are the global Buffers in call order; `out_idx` the indices of params the
    runtime allocates and returns; `dynamic_vars` the `T.dynamic` Vars, each bound at
    call time from `dim_bindings[var] = (param index, dim)` (the tensor's size there) or, for
    a Var only a `T.StridedTensor`'s strides name, `stride_bindings[var] = (param index, dim)`
    (its stride there).  `scalar_params` are the
    runtime scalar parameters (`valid_len: T.int32`): ``(position, Var)`` pairs, the Var of
    the parameter's dtype and `position` its index in the call's parameter list, which
    interleaves them with the tensors (`call_params`).  Both kinds of Var are read-only
    values of the whole kernel, passed to it after the tensors (`runtime_vars`).

    A function of several `with T.Kernel` blocks, or with `T.alloc_global` workspaces, has
    `kernel` None: `workspaces` are its global Buffers the runtime allocates for each call
    (shapes of ints and the call's runtime scalars), and `parts` its kernels in launch order,
    each a complete one-kernel `PrimFunc` whose `params` are the call's tensors followed by the
    workspaces (its `out_idx` empty: the program allocates the outputs; the same runtime Vars).
    The pass list, the backends and the interpreter see only such one-kernel functions; the
    runtime launches the parts one after another on the same tensors.

    `views` are the function's global views (`T.reshape` / `T.view` of a tensor parameter or
    workspace, `T.Tensor(shape, dtype, A.data)`: Buffers whose `view_of` is one of those): a
    function with views is a function of `parts` too, and each part takes the views after the
    workspaces, as ordinary tensor parameters the runtime derives from the call's tensors
    (`tensor.view(dtype).view(shape)`), so every backend addresses a view as a tensor of its own.

    A `@T.prim_func` with no `with T.Kernel` block (TileLang's host code only) has `kernel`
    None and no `parts`: it can be built and printed, and compiling it is a CompileError."""

    name: str
    params: list
    kernel: Optional[Kernel]
    out_idx: list = field(default_factory=list)
    dynamic_vars: list = field(default_factory=list)
    dim_bindings: dict = field(default_factory=dict)
    stride_bindings: dict = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)  # facts passes record (e.g. "shared_bytes")
    loc: Optional[SourceLoc] = None
    scalar_params: list = field(default_factory=list)
    workspaces: list = field(default_factory=list)
    parts: list = field(default_factory=list)
    views: list = field(default_factory=list)

    @property
    def kernels(self) -> list:
        """The kernels in launch order: `kernel`, or each part's (none for host code only)."""
        if self.parts:
            return [part.kernel for part in self.parts]
        return [self.kernel] if self.kernel is not None else []

    @property
    def scalar_vars(self) -> list:
        return [var for _, var in self.scalar_params]

    @property
    def runtime_vars(self) -> list:
        """The scalars the kernel takes after its tensors: the `T.dynamic` dims, then the scalar params."""
        return [*self.dynamic_vars, *self.scalar_vars]

    def call_params(self) -> list:
        """The call's parameters in order: tensor Buffers and scalar-parameter Vars."""
        out = list(self.params)
        for position, var in sorted(self.scalar_params, key=lambda entry: entry[0]):
            out.insert(position, var)
        return out


def const(value, dtype: DType = None) -> Const:
    if dtype is None:
        dtype = bool_ if isinstance(value, bool) else int32 if isinstance(value, int) else float32
    return Const(value, dtype)
