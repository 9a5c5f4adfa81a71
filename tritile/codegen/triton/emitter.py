"""triton.language source emitter: the state and helpers the per-node rules (`rules.py`) share.

Input: a `PrimFunc` at the backend's start stage (`start_stage` in `tritile/codegen`'s
`BACKENDS`: after `accumulator_init`, before any pipeline pass), so on-chip buffers have no
versions and the program has no async statements.  Output (`kernel_module.emit_module`): a module with one
``@triton.jit`` kernel and its host launcher.

The model of the generated code: every on-chip buffer (shared, fragment) is one register
tile, a Python variable holding a ``tl`` tensor of the buffer's shape, reassigned whole by
every write - Triton decides what lives in shared memory, and its pipeliner stages the
loads of a ``tl.range(..., num_stages=S)`` loop.  A `T.alloc_var` / unit `T.alloc_local`
is a 0-d tensor; a larger `T.alloc_local` a 1-D tensor of its flattened (power-of-two padded)
elements, read and written through a lane mask.  A `T.Parallel` is one tile expression:
each loop variable is a ``tl.arange`` broadcast along its own axis (``i[:, None]``), over
the next power of two of its extent with the extra lanes masked off.  A global tile is read
and written by `load_tile` / `store_tile`: through a TMA descriptor argument where
`descriptors.py` proves the hardware's out-of-bounds rule the same as the masks' (sm_90,
sm_100), else a masked ``tl.load`` / ``tl.store``.

Conventions: names come from the user's program (clashes get a numeric suffix,
temporaries start with ``_``); a global tensor's strides are row-major ones derived from its
shape (a contiguous `T.Tensor`) or a `T.StridedTensor`'s declared ones - the runtime checks
them before a launch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tritile.codegen import semantics
from tritile.codegen.semantics import HELPER_NAMES, Val, dtype_text
from tritile.codegen.source_writer import SourceWriter, paren
from tritile.codegen.tma_descriptors import DescriptorArg
from tritile.codegen.triton.descriptors import DescriptorPlan
from tritile.errors import CompileError
from tritile.ir import nodes as ir
from tritile.ir.padding import padded, padded_shape
from tritile.ir.transform import address_tensors, walk

_RESERVED = {"tl", "triton", "_tl_core", "range", "float", "int", "min", "max", "abs", "tritile_launch",
             *HELPER_NAMES}


def unsupported(what: str, loc=None) -> CompileError:
    return CompileError(f"{what} is not supported by the triton.language backend", loc)


@dataclass
class ParallelContext:
    """A `T.Parallel` being emitted: its loop, the shape of its lane tensors (the extents, each
    rounded up to a power of two), each var's index text (``i[:, None]``), and the predicate of
    the lanes that write: inside the extents and the enclosing `if`s inside the loop."""

    loop: ir.Parallel
    shape: list
    index: dict = field(default_factory=dict)  # Var -> index tensor text
    cond: str = None


def axis_index(text: str, axis: int, rank: int) -> str:
    """`text` (a 1-D tensor) expanded to `rank` dims, varying along `axis`."""
    if rank == 1:
        return text
    return f"{text}[{', '.join(':' if a == axis else 'None' for a in range(rank))}]"


def padded_size(buf: ir.Buffer) -> int:
    """Elements of a buffer's flattened tile: a `T.alloc_local` array's, rounded up to a power
    of two (a tensor's size); a shared / fragment tile's padded shape's (ir/padding.py)."""
    if buf.scope == "local":
        return semantics.local_array_lanes(buf)
    n = 1
    for d in padded_shape(buf.shape):
        n *= d
    return n


def is_scalar_buffer(buf: ir.Buffer) -> bool:
    """A `T.alloc_var`, or a `T.alloc_local` of one element: a 0-d tensor."""
    return buf.scope == "var" or (buf.scope == "local" and all(d == 1 for d in buf.shape))


class Emitter(SourceWriter):
    lang = "tl"  # the language module of the generated code (codegen/semantics.py)
    backend = "triton.language"

    def __init__(self, func: ir.PrimFunc, target, warp_size: int):
        super().__init__(func, _RESERVED)
        self.target = target
        # Triton wants a power of two; a tile program means the same on any number of warps, so
        # TileLang's 384-thread kernels (three warpgroups) run on 8.
        self.num_warps = 1 << (max(1, func.kernel.threads // warp_size).bit_length() - 1)
        self.par = None  # ParallelContext inside a T.Parallel
        self.let_dims = {}  # id(Var) of a Let inside a T.Parallel -> the dims its value varies along
        self.descriptor_plan = DescriptorPlan(func, target)
        self.descriptors = {}  # (param index, block) -> DescriptorArg: the kernel's TMA descriptor arguments
        self.param_index = {id(p): i for i, p in enumerate(func.params)}
        self.address_tensors = address_tensors(func.kernel.body)  # T.make_tensor's: id(Var) -> Buffers

    def expr(self, e) -> Val:
        from tritile.codegen.triton.rules import lower_expr

        return lower_expr(self, e)

    def body(self, seq):
        from tritile.codegen.triton.rules import lower_stmt

        stmts = seq.stmts if isinstance(seq, ir.Seq) else [seq]
        start = len(self.lines)
        for s in stmts:
            lower_stmt(self, s)
        if len(self.lines) == start:
            self.emit("pass")

    # ---------------------------------------------------------------- values
    def tensor(self, e, v: Val = None) -> str:
        """`e` (emitted as `v`) as a tensor of `e.dtype`: a scalar computed from constants,
        block indices and loop counters only may be a Python number (a literal; a loop
        counter under Triton's interpreter), and becomes a 0-d tensor."""
        v = v or self.expr(e)
        if v.dims or any(isinstance(n, (ir.Load, ir.TableRead)) for n in walk(e)):
            return v.text
        if e.dtype.is_float and e.dtype.bits == 8:
            return v.text  # fp8 has no literals: semantics.py emitted a tensor
        return f"tl.full([], {v.text}, {dtype_text(e.dtype, 'tl')})"

    def splat(self, e, v: Val, dst, shape: list) -> str:
        """`e` (emitted as `v`, of any dims) converted to `dst` and broadcast to `shape`.
        fp8 broadcasts its bytes as int8 (see the Gluon backend's `broadcast_text`: Triton
        converts fp8 in pairs, and a broadcast pair read garbage on the H100)."""
        if semantics.is_constant(e) and not (dst.is_float and dst.bits == 8):
            # converted at compile time with the interpreter's meaning (semantics.lower_scalar_expr)
            return f"tl.full({shape}, {self.expr(ir.Cast(e, dst)).text}, {dtype_text(dst, 'tl')})"
        value = semantics.cast_text(self.tensor(e, v), e.dtype, dst, "tl")
        if dst.is_float and dst.bits == 8:
            byte = f"tl.broadcast_to({value}.to(tl.int8, bitcast=True), {shape})"
            return f"{byte}.to({dtype_text(dst, 'tl')}, bitcast=True)"
        return f"tl.broadcast_to({value}, {shape})"

    # ---------------------------------------------------------------- globals
    def load_tile(self, region: ir.Region, shape: list, loc) -> str:
        """Text of global `region` read as a tensor of `shape` (`global_tile`), out-of-bounds
        elements 0 (or the tensor's `T.annotate_safe_value`): a descriptor load where
        `descriptors.py` allows one, else a masked load."""
        desc = self._descriptor(region, shape, loc)
        if desc is None:
            ptr, mask = self.global_tile(region, shape, loc)
            return semantics.tile_load_text("tl", ptr, mask, region.buffer)
        value = f"{desc}.load([{self._starts(region)}])"
        return value if list(region.extents) == list(shape) else f"tl.reshape({value}, {list(shape)})"

    def store_tile(self, region: ir.Region, value: str, shape: list, loc):
        """Emit the write of `value` (a tensor of `shape`, of the global's dtype) to global
        `region`, out-of-bounds elements dropped: a descriptor store (`semantics.tma_may_store`) or a
        masked store."""
        desc = self._descriptor(region, shape, loc) if semantics.tma_may_store(self, region) else None
        if desc is None:
            ptr, mask = self.global_tile(region, shape, loc)
            self.emit(f"tl.store({ptr}, {value}{semantics.mask_argument(mask)})")
            return
        if list(region.extents) != list(shape):
            value = f"tl.reshape({value}, {list(region.extents)})"
        self.emit(f"{desc}.store([{self._starts(region)}], {value})")

    def _descriptor(self, region: ir.Region, shape: list, loc):
        """The name of the descriptor argument serving global `region` as a tile of `shape`, or
        None (`descriptors.DescriptorPlan`); one argument per (tensor, block)."""
        self._tile_dims(region, shape, loc)
        box = self.descriptor_plan.box(region)
        if box is None:
            return None
        buf = region.buffer
        key = (self.param_index[id(buf)], box)
        if key not in self.descriptors:
            self.descriptors[key] = DescriptorArg(self.fresh(f"{self.name(buf)}_desc"), key[0], box, buf.dtype,
                                                  strides=self.host_strides(buf))
        return self.descriptors[key].name

    def _starts(self, region: ir.Region) -> str:
        return ", ".join(self.expr(x).text for x in region.starts)

    def _tile_dims(self, region: ir.Region, shape: list, loc) -> list:
        """The dims of global `region` that a tensor of `shape` runs along: its non-unit
        extents, or its trailing extents (a register tile keeping unit dims, e.g. a keep-dim
        reduction's (1, N))."""
        tdims = [d for d, e in enumerate(region.extents) if e != 1]
        if [region.extents[d] for d in tdims] != list(shape) or len(tdims) != len(shape):
            if tuple(region.extents[len(region.extents) - len(shape):]) != tuple(shape):
                raise unsupported(f"a copy between {region.buffer.name}{list(region.extents)} and a tile of shape "
                                  f"{list(shape)}", loc)
            tdims = list(range(len(region.extents) - len(shape), len(region.extents)))
        return tdims

    def global_tile(self, region: ir.Region, shape: list, loc) -> tuple:
        """(pointer text, mask text) of the tile of global `region` as a tensor of `shape`
        (`_tile_dims`).  Out-of-bounds lanes are masked off: the mask tests each dim the tile
        may leave (`semantics.tile_inside`, `tile_starts_inside`) and the pad lanes; None where
        nothing is left to test."""
        buf = region.buffer
        tdims = self._tile_dims(region, shape, loc)
        strides = self.strides(buf)
        offs, masks = [], []
        for d, (start, extent) in enumerate(zip(region.starts, region.extents)):
            s = self.expr(start).text
            if d in tdims:
                name, lanes = self.tmp("i"), padded(extent)  # a padded extent's pad lanes masked off
                if lanes != extent:
                    lane = self.tmp("lane")
                    self.emit(f"{lane} = tl.arange(0, {lanes})")
                    self.emit(f"{name} = {'' if s == '0' else paren(s) + ' + '}{lane}")
                    masks.append(f"({axis_index(lane, tdims.index(d), len(shape))} < {extent})")
                else:
                    self.emit(f"{name} = {'' if s == '0' else paren(s) + ' + '}tl.arange(0, {extent})")
                idx = axis_index(name, tdims.index(d), len(shape))
            else:
                idx = s
            offs.append(idx if strides[d] == "1" else f"{paren(idx)} * {paren(strides[d])}")
            if not semantics.tile_inside(self, start, extent, buf.shape[d]):
                masks.append(f"({idx} < {self.shape_text(buf.shape[d])})")
            if not semantics.tile_starts_inside(self, start):
                masks.append(f"({idx} >= 0)")
        return f"{self.name(buf)} + " + " + ".join(offs), " & ".join(masks) or None
