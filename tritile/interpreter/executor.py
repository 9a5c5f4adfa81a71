"""Statement execution of the reference interpreter: grid, control flow, `T.Parallel`.

Contract
--------
`execute(func, args, dim_values)` runs `func.kernel.body` once per block of the grid with
the block Vars bound, on the caller's tensors (`args`, in `func.params` order, written in
place).  It accepts the IR of every stage: a not-yet-injected pipelined `For` runs as a
serial loop; versioned buffers and async nodes follow `tritile.interpreter.hazards`.
Arguments are checked before anything runs (TypeError for type/dtype, ValueError for
rank/shape/missing dims, each naming the argument).

`T.Parallel` is vectorised: its body runs once with lane variable k of n bound to an
int64 ``arange`` shaped ``[1, .., extent_k, .., 1]``; an `If`/`While`/`For` whose
condition or bounds depend on lanes narrows the active-lane `mask` instead of branching;
`Let` binds lane tensors.  Statements run in order for all lanes at once (sound because
lanes of a parallel loop are independent).  Serial loops and blocks are Python loops.

`T.print` (`ir.Print`) writes to stdout when the block reaches it, in Triton's
`device_print` format with the message munged as Triton does (" msg: "), block indices
padded to three:
    pid (bx, by, bz) idx () msg: value            a scalar
    pid (bx, by, bz) idx (i, j) msg: value        each element of a buffer, row-major
    pid (bx, by, bz) msg                          obj=None
floats as C's %f, integers and bools as integers.  Blocks run in launch order (bx fastest),
so the interpreter's output is deterministic; the GPU's lines come from every thread that
holds a value, in no fixed order.  TRITILE_BLOCK_ORDER=reversed runs them last to first
(`switches.blocks_reversed`): a result that changes has racing blocks.
"""
from __future__ import annotations

import itertools

import torch

from tritile.errors import CompileError, DeviceAssertError
from tritile.interpreter import tile_ops
from tritile.interpreter.barriers import Barriers
from tritile.interpreter import values as V
from tritile.interpreter.expressions import Evaluator
from tritile.interpreter.hazards import AsyncTracker
from tritile.interpreter.memory import Memory
from tritile.ir import nodes as ir
from tritile.ir.affine import solve_dim
from tritile.switches import blocks_reversed


def execute(func: ir.PrimFunc, args: list, dim_values: dict) -> None:
    """Run `func` on CPU tensors, mutating its output tensors in place."""
    scalars = _bind_arguments(func, args, dim_values)
    storage = {buf: V.storage_view(t, buf.dtype) for buf, t in zip(func.params, args)}
    kernel = func.kernel
    grid_eval = Evaluator(dict(scalars), Memory(AsyncTracker(()), storage))
    grid_eval.stmt = kernel
    grid = [int(grid_eval.scalar(g)) for g in kernel.grid]
    # bx varies fastest, as block ids are numbered on the GPU
    blocks = itertools.product(*(range(g) for g in reversed(grid)))
    for block in reversed(list(blocks)) if blocks_reversed() else blocks:
        block = tuple(reversed(block))
        env = dict(scalars)
        env.update(zip(kernel.block_vars, block))
        runner = BlockRunner(env, Memory(AsyncTracker(block), storage), kernel.threads)
        runner.exec(kernel.body)
        runner.tracker.check_drained()


class BlockRunner(Evaluator):
    """Executes statements of one thread block."""

    def __init__(self, env: dict, memory: Memory, threads: int):
        super().__init__(env, memory)
        memory.scalars = lambda: self.env  # T.make_tensor addresses
        self.tracker = memory.tracker
        self.lane_ndim = 0  # number of lane dimensions of the enclosing T.Parallel loops
        self.lane_shape = ()  # their extents
        self.threads = threads  # threads running the current statement (a `T.ws` narrows them)
        self.barriers = Barriers()

    def exec(self, s):
        handler = self._STMTS.get(type(s))
        if handler is None:
            raise CompileError(f"the interpreter cannot execute {type(s).__name__}", getattr(s, "loc", None))
        self.stmt = s
        handler(self, s)

    def starts(self, region: ir.Region) -> tuple:
        return tuple(int(self.scalar(x)) for x in region.starts)

    # ------------------------------------------------------------------ statements
    def _seq(self, s: ir.Seq):
        for child in s.stmts:
            self.exec(child)

    def _alloc(self, s: ir.Alloc):
        if self.lane_ndim:
            raise self.error(f"{s.buffer.name} is allocated inside T.Parallel")
        if s.buffer.view_of is not None:
            self.memory.bind_view(s.buffer, s)
            return
        self.memory.allocate(s.buffer, tuple(int(self.scalar(d)) for d in s.buffer.shape))
        if s.init is not None:
            self.memory.store(s.buffer, [0] * s.buffer.ndim, self.scalar(s.init), None, s)

    def _let(self, s: ir.Let):
        self.env[s.var] = self.eval(s.value)

    def _store(self, s: ir.Store):
        indices = [self.eval(i) for i in s.indices]
        self.memory.store(s.buffer, indices, self.eval(s.value), self.mask, s)

    def _evaluate(self, s: ir.Evaluate):
        pass  # markers (T.use_swizzle, T.annotate_layout) have no effect on values

    def _print(self, s: ir.Print):
        if self.lane_ndim:
            raise self.error("T.print inside T.Parallel")
        pid = "pid ({}, {}, {})".format(*(tuple(self.tracker.block) + (0, 0, 0))[:3])
        if s.value is None:
            print(pid + _print_prefix(s.msg, False))
            return
        prefix = _print_prefix(s.msg, True)
        if isinstance(s.value, ir.Region):
            tile = self.memory.read_region(s.value, self.starts(s.value), s)
            for index in itertools.product(*(range(n) for n in tile.shape)):
                print(f"{pid} idx ({', '.join(map(str, index))}){prefix}{_print_value(tile[index].item())}")
        else:
            print(f"{pid} idx (){prefix}{_print_value(self.scalar(s.value))}")

    def _device_assert(self, s: ir.DeviceAssert):
        holds = self.eval(s.cond)
        if V.is_tensor(holds):
            failed = ~holds.to(torch.bool)
            if self.mask is not None:
                failed = failed & self.mask
            if bool(failed.any()):
                lanes = failed.nonzero().tolist()[0] if failed.dim() else []
                raise DeviceAssertError(f"T.device_assert failed in block {tuple(self.tracker.block)}"
                                        f"{f' at T.Parallel lane {tuple(lanes)}' if lanes else ''}: {s.msg}", s.loc)
        elif not holds:
            raise DeviceAssertError(f"T.device_assert failed in block {tuple(self.tracker.block)}: {s.msg}", s.loc)

    def _thread_barrier(self, s: ir.ThreadBarrier):
        if self.lane_ndim:
            raise self.error("T.sync_threads inside T.Parallel")

    def _tile_op(self, s):
        if self.lane_ndim and not (isinstance(s, ir.AtomicAdd) and not isinstance(s.value, ir.Region)):
            raise self.error(f"tile operation {type(s).__name__} inside T.Parallel")
        self._TILE_OPS[type(s)](self, s)

    _TILE_OPS = {ir.Copy: tile_ops.copy, ir.AsyncCopy: tile_ops.async_copy,
                 ir.CommitGroup: tile_ops.commit_group, ir.WaitGroup: tile_ops.wait_group,
                 ir.Gemm: tile_ops.gemm, ir.WaitMMA: tile_ops.wait_mma, ir.Fill: tile_ops.fill,
                 ir.Reduce: tile_ops.reduce, ir.Cumsum: tile_ops.cumsum,
                 ir.CumExtremum: tile_ops.cum_extremum, ir.AtomicAdd: tile_ops.atomic_add}

    # ------------------------------------------------------------------ warp specialization
    def _alloc_barrier(self, s: ir.AllocBarrier):
        self.barriers.allocate(s.buffer, s.arrive_counts)

    def _barrier_op(self, s):
        if self.lane_ndim:
            raise self.error(f"{type(s).__name__} inside T.Parallel")
        index = int(self.scalar(s.index))
        try:
            if isinstance(s, ir.BarrierArrive):
                self.barriers.arrive(s.buffer, index, self.threads)
            else:
                self.barriers.wait(s.buffer, index, int(self.scalar(s.parity)))
        except ValueError as err:
            raise self.error(str(err)) from None

    def _warp_groups(self, s: ir.WarpGroups):
        outer = self.threads
        self.threads = s.threads
        try:
            self.exec(s.body)
        finally:
            self.threads = outer

    # ------------------------------------------------------------------ control flow
    def _for(self, s: ir.For):
        step = self.scalar(s.step)
        start, stop = self.eval(s.start), self.eval(s.stop)
        if not V.is_tensor(start) and not V.is_tensor(stop):
            for value in range(int(start), int(stop), int(step)):
                self.env[s.var] = value
                self.exec(s.body)
            return
        # lane-dependent bounds: one scalar loop over the union, each lane active in its range
        if step <= 0:
            raise self.error("a loop with lane-dependent bounds needs a positive step")
        outer = self.mask
        for value in range(int(V.as_tensor(start).min()), int(V.as_tensor(stop).max()), step):
            inside = (value >= start) & (value < stop)
            if step != 1:
                inside = inside & ((value - start) % step == 0)
            self.env[s.var] = value
            self._masked(s.body, inside, outer)
        self.mask = outer

    def _consumer_partitions(self, s: ir.ConsumerPartitions):
        for partition in range(s.count):
            self.env[s.var] = partition
            self.exec(s.body)

    def _if(self, s: ir.If):
        cond = self.eval(s.cond)
        if not V.is_tensor(cond) or (cond.dim() == 0 and self.mask is None):
            taken = self.truth(cond)
            branch = s.then_body if taken else s.else_body
            if branch is not None:
                self.exec(branch)
            self._skipped(s.else_body if taken else s.then_body)
            return
        outer = self.mask
        cond = cond.to(torch.bool)
        if not self._masked(s.then_body, cond, outer):
            self._skipped(s.then_body)
        if s.else_body is not None and not self._masked(s.else_body, ~cond, outer):
            self._skipped(s.else_body)
        self.mask = outer

    def _skipped(self, body):
        """A branch inside T.Parallel that ran for no lane: its `Let`s hold 0.  The frontend merges
        a per-lane variable assigned in a branch after it (``T.if_then_else(cond, then, else)``):
        such a value is read, but never selected (the GPU computes a branch's values for every
        lane, masked)."""
        if not self.lane_ndim or body is None:
            return
        for stmt in body.stmts:
            if isinstance(stmt, ir.Let):
                self.env.setdefault(stmt.var, 0)
            elif isinstance(stmt, ir.Seq):
                self._skipped(stmt)

    def _while(self, s: ir.While):
        outer = self.mask
        alive = None  # lanes that have not left the loop yet
        while True:
            self.stmt = s
            cond = self.eval(s.cond)
            if not V.is_tensor(cond) and alive is None:
                if not cond:
                    break
                self.exec(s.body)
                continue
            cond = V.as_tensor(cond).to(torch.bool)
            alive = cond if alive is None else alive & cond
            if not self._masked(s.body, alive, outer):
                break
        self.mask = outer

    def _masked(self, body: ir.Seq, lanes: torch.Tensor, outer) -> bool:
        """Run `body` for the lanes in `lanes` (and `outer`); False when none is active."""
        active = lanes if outer is None else outer & lanes
        if not bool(active.any()):
            return False
        self.mask = active
        self.exec(body)
        self.mask = outer
        return True

    def _parallel(self, s: ir.Parallel):
        extents = [int(self.scalar(e)) for e in s.extents]
        saved_env, saved_mask, saved_ndim, saved_shape = self.env, self.mask, self.lane_ndim, self.lane_shape
        new = len(extents)
        # lane tensors of enclosing Parallel loops get trailing unit dims for the new lanes
        self.env = {k: _widen(v, saved_ndim, new) for k, v in saved_env.items()}
        self.mask = None if saved_mask is None else _widen(saved_mask, saved_ndim, new)
        self.lane_ndim = saved_ndim + new
        self.lane_shape = saved_shape + tuple(extents)
        for k, (var, extent) in enumerate(zip(s.vars, extents)):
            shape = [1] * self.lane_ndim
            shape[saved_ndim + k] = extent
            self.env[var] = torch.arange(extent, dtype=torch.int64).view(shape)
        try:
            self.exec(s.body)
        finally:
            self.env, self.mask, self.lane_ndim, self.lane_shape = saved_env, saved_mask, saved_ndim, saved_shape

    _STMTS = {ir.Seq: _seq, ir.Alloc: _alloc, ir.Let: _let, ir.Store: _store, ir.Evaluate: _evaluate,
              ir.Print: _print, ir.DeviceAssert: _device_assert,
              ir.ThreadBarrier: _thread_barrier,
              ir.For: _for, ir.If: _if, ir.While: _while, ir.Parallel: _parallel,
              ir.ConsumerPartitions: _consumer_partitions,
              ir.AllocBarrier: _alloc_barrier, ir.BarrierArrive: _barrier_op, ir.BarrierWait: _barrier_op,
              ir.WarpGroups: _warp_groups,
              **dict.fromkeys(_TILE_OPS, _tile_op)}


def _print_prefix(msg: str, has_value: bool) -> str:
    """The message as the GPU prints it: " msg: " before a value (`tl.device_print`'s
    munging), " msg" alone (the Gluon rule adds the space Triton omits for short ones)."""
    if not has_value:
        return msg if msg.startswith(" ") else " " + msg
    if not msg.endswith(" "):
        msg += " "
    if not msg.endswith(": "):
        msg = msg[:-1] + ": "
    return " " + msg if len(msg) > 2 and not msg.startswith(" ") else msg


def _print_value(value) -> str:
    return f"{value:f}" if isinstance(value, float) else str(int(value))


def _widen(value, ndim: int, new: int):
    """A lane tensor over `ndim` lane dims, reshaped to broadcast over `new` more."""
    if not V.is_tensor(value) or ndim == 0:
        return value
    return value.reshape((1,) * (ndim - value.dim()) + tuple(value.shape) + (1,) * new)


def _bind_arguments(func: ir.PrimFunc, args, dim_values) -> dict:
    """Check `args` against `func.params` and return the runtime scalars {Var: value}: the
    dims, and the scalar parameters (`dim_values` must hold each, of its dtype's kind)."""
    if not isinstance(args, (list, tuple)):
        raise TypeError(f"args must be a list of tensors, got {type(args).__name__}")
    if len(args) != len(func.params):
        raise TypeError(f"{func.name} takes {len(func.params)} tensors "
                        f"({', '.join(p.name for p in func.params)}), got {len(args)}")
    if not isinstance(dim_values, dict):
        raise TypeError(f"dim_values must be a dict {{Var: int}}, got {type(dim_values).__name__}")
    dims = {}
    for var, value in dim_values.items():
        if not isinstance(var, ir.Var):
            raise TypeError(f"dim_values keys must be Vars, got {var!r}")
        kind = var.dtype.kind if any(var is v for v in func.scalar_vars) else "int"
        if not isinstance(value, {"bool": (bool, int), "float": (float, int)}.get(kind, int)) \
                or (kind != "bool" and isinstance(value, bool)):
            raise TypeError(f"dim_values[{var.name}] must be {'an int' if kind != 'float' else 'a float'}, got "
                            f"{value!r}")
        dims[var] = value
    for buf, t in zip(func.params, args):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"argument {buf.name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != buf.dtype.torch:
            raise TypeError(f"argument {buf.name} must have dtype {buf.dtype}, got {t.dtype}")
        if t.dim() != buf.ndim:
            raise ValueError(f"argument {buf.name} must have rank {buf.ndim} (shape {list(buf.shape)}), "
                             f"got shape {list(t.shape)}")
    for var, (index, dim) in func.dim_bindings.items():
        if var not in dims:
            dims[var] = solve_dim(func.params[index].shape[dim], var, int(args[index].shape[dim]),
                                  f"argument {func.params[index].name}, dimension {dim}")
    for var, (index, dim) in func.stride_bindings.items():
        if var not in dims:
            dims[var] = solve_dim(func.params[index].strides[dim], var, int(args[index].stride(dim)),
                                  f"argument {func.params[index].name}, stride {dim}")
    for buf, t in zip(func.params, args):  # bare Vars in shapes bind themselves
        for d, size in zip(buf.shape, t.shape):
            if isinstance(d, ir.Var) and d not in dims:
                dims[d] = int(size)
    missing = [v.name for v in func.dynamic_vars if v not in dims]
    if missing:
        raise ValueError(f"no value for the dynamic dimension(s) {', '.join(missing)}")
    missing = [v.name for v in func.scalar_vars if v not in dims]
    if missing:
        raise ValueError(f"no value for the scalar parameter(s) {', '.join(missing)}")
    for v in func.runtime_vars:  # a variant specialised on divisibility (ir/divisibility.py) assumes it
        if v.multiple_of > 1 and dims[v] % v.multiple_of:
            kind = "dynamic dimension" if any(v is d for d in func.dynamic_vars) else "scalar parameter"
            raise ValueError(f"{kind} {v.name} = {dims[v]}: this program was specialised for a "
                             f"multiple of {v.multiple_of}")
    evaluator = Evaluator(dims, None)
    for buf, t in zip(func.params, args):
        expected = [evaluator.scalar(d) for d in buf.shape]
        if list(t.shape) != expected:
            raise ValueError(f"argument {buf.name} must have shape {expected}, got {list(t.shape)}")
    return dims
