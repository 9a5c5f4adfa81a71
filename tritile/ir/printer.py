"""Readable text form of the tile IR (TileLang-like), used by `kernel.get_source(stage)`."""
from __future__ import annotations

from tritile.ir import nodes as ir

_PRECEDENCE = {"or": 1, "and": 2, "not": 3, "<": 4, "<=": 4, ">": 4, ">=": 4, "==": 4, "!=": 4,
               "|": 5, "^": 6, "&": 7, "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10,
               "//": 10, "%": 10, "**": 12}


def expr_str(e, parent_prec: int = 0) -> str:
    if isinstance(e, ir.Var):
        return e.name
    if isinstance(e, ir.Const):
        if isinstance(e.value, bool):
            return str(e.value)
        if e.dtype.is_float and not isinstance(e.value, float):
            return repr(float(e.value))
        return repr(e.value)
    if isinstance(e, (int, float)):
        return repr(e)
    if isinstance(e, ir.BinOp):
        if e.op in ("max", "min"):
            return f"T.{e.op}({expr_str(e.lhs)}, {expr_str(e.rhs)})"
        prec = _PRECEDENCE[e.op]
        text = f"{expr_str(e.lhs, prec)} {e.op} {expr_str(e.rhs, prec + 1)}"
        return f"({text})" if prec < parent_prec else text
    if isinstance(e, ir.UnaryOp):
        sep = " " if e.op == "not" else ""
        return f"{e.op}{sep}{expr_str(e.operand, 11)}"
    if isinstance(e, ir.Call):
        return f"T.{e.fn}({', '.join(expr_str(a) for a in e.args)})"
    if isinstance(e, ir.Cast):
        return f"T.cast({expr_str(e.value)}, {e.dtype})"
    if isinstance(e, ir.Load):
        return f"{e.buffer.name}[{', '.join(expr_str(i) for i in e.indices)}]"
    if isinstance(e, ir.TableRead):
        return f"{e.table.name}@{e.table.digest}[{expr_str(e.index)}]"
    return repr(e)


def region_str(r: ir.Region) -> str:
    parts = []
    for start, extent, full in zip(r.starts, r.extents, r.buffer.shape):
        if extent == 1:
            parts.append(expr_str(start))
        elif isinstance(start, ir.Const) and start.value == 0 and extent == full:
            parts.append(":")
        else:
            s = expr_str(start)
            parts.append(f"{s}:{s} + {extent}" if not (isinstance(start, ir.Const)) else f"{start.value}:{start.value + extent}")
    return f"{r.buffer.name}[{', '.join(parts)}]"


def _shape_str(shape) -> str:
    return "[" + ", ".join(expr_str(s) for s in shape) + "]"


def _operand(x) -> str:
    return region_str(x) if isinstance(x, ir.Region) else expr_str(x)


class _Printer:
    def __init__(self):
        self.lines = []

    def emit(self, depth: int, text: str):
        self.lines.append("    " * depth + text)

    def seq(self, body, depth):
        stmts = body.stmts if isinstance(body, ir.Seq) else [body]
        if not stmts:
            self.emit(depth, "pass")
        for s in stmts:
            self.stmt(s, depth)

    def stmt(self, s, d):  # noqa: C901 - one branch per node kind is the clearest form
        if isinstance(s, ir.Seq):
            self.seq(s, d)
        elif isinstance(s, ir.Alloc) and s.buffer.view_of is not None:
            self.emit(d, _view_str(s.buffer))
        elif isinstance(s, ir.Alloc):
            b = s.buffer
            fn = {"shared": "alloc_shared", "fragment": "alloc_fragment", "local": "alloc_local",
                  "var": "alloc_var"}[b.scope]
            extra = f", init={expr_str(s.init)}" if s.init is not None else ""
            note = f"  # {b.num_versions} versions of {b.root.name}" if b.num_versions > 1 else ""
            layout = f"  # layout: {b.layout}" if b.layout is not None else ""
            shape = "" if b.scope == "var" else _shape_str(b.shape) + ", "
            self.emit(d, f"{b.name} = T.{fn}({shape}{b.dtype}{extra}){note}{layout}")
        elif isinstance(s, ir.Let):
            self.emit(d, f"{s.var.name} = {expr_str(s.value)}")
        elif isinstance(s, ir.Store):
            idx = ", ".join(expr_str(i) for i in s.indices)
            self.emit(d, f"{s.buffer.name}[{idx}] = {expr_str(s.value)}")
        elif isinstance(s, ir.Copy):
            self.emit(d, f"T.copy({region_str(s.src)}, {region_str(s.dst)})")
        elif isinstance(s, ir.AsyncCopy):
            tag = f"  # iteration {expr_str(s.iteration)}" if s.iteration is not None else ""
            self.emit(d, f"T.async_copy({region_str(s.src)}, {region_str(s.dst)}){tag}")
        elif isinstance(s, ir.CommitGroup):
            tag = f"  # iteration {expr_str(s.iteration)}" if s.iteration is not None else ""
            self.emit(d, f"T.commit_group(){tag}")
        elif isinstance(s, ir.WaitGroup):
            tag = f"  # completes iteration {expr_str(s.iteration)}" if s.iteration is not None else ""
            self.emit(d, f"T.wait_group({s.pending}){tag}")
        elif isinstance(s, ir.Gemm):
            args = [region_str(s.a), region_str(s.b), region_str(s.c)]
            if s.transpose_a:
                args.append("transpose_A=True")
            if s.transpose_b:
                args.append("transpose_B=True")
            if s.policy != "Square":
                args.append(f"policy=T.GemmWarpPolicy.{s.policy}")
            if s.clear_accum:
                args.append("clear_accum=True")
            if s.is_async:
                args.append("is_async=True")
            if s.tf32:
                args.append("tf32=True")
            self.emit(d, f"T.gemm({', '.join(args)})")
        elif isinstance(s, ir.WaitMMA):
            self.emit(d, f"T.wait_mma({s.pending})")
        elif isinstance(s, ir.Fill):
            self.emit(d, f"T.fill({region_str(s.dst)}, {expr_str(s.value)})")
        elif isinstance(s, ir.Reduce):
            nan = ", nan_propagate=True" if s.nan_propagate else ""
            self.emit(d, f"T.reduce_{s.kind}({region_str(s.src)}, {region_str(s.dst)}, dim={s.dim}, clear={s.clear}{nan})")
        elif isinstance(s, ir.Cumsum):
            self.emit(d, f"T.cumsum({region_str(s.src)}, {region_str(s.dst)}, dim={s.dim}, reverse={s.reverse})")
        elif isinstance(s, ir.CumExtremum):
            self.emit(d, f"T.cum{s.kind}({region_str(s.src)}, {region_str(s.dst)}, dim={s.dim}, reverse={s.reverse})")
        elif isinstance(s, ir.AtomicAdd):
            order = "" if s.sem == "relaxed" else f", memory_order={s.sem!r}"
            op = "atomic_store" if s.kind == "exchange" else f"atomic_{s.kind}"
            prev = ("", "") if s.prev is None else (f"{s.prev.name} = ", ", return_prev=True")
            self.emit(d, f"{prev[0]}T.{op}({region_str(s.dst)}, {_operand(s.value)}{order}{prev[1]})")
        elif isinstance(s, ir.Evaluate):
            self.emit(d, f"T.{s.name}({', '.join(repr(a) for a in s.args)})")
        elif isinstance(s, ir.ThreadBarrier):
            self.emit(d, "T.sync_threads()")
        elif isinstance(s, ir.DeviceAssert):
            self.emit(d, f"T.device_assert({expr_str(s.cond)}, {s.msg!r})")
        elif isinstance(s, ir.Print):
            value = "None" if s.value is None else _operand(s.value)
            self.emit(d, f"T.print({value}, msg={s.msg!r})")
        elif isinstance(s, ir.For):
            self._for(s, d)
        elif isinstance(s, ir.Parallel):
            names = ", ".join(v.name for v in s.vars)
            self.emit(d, f"for {names} in T.Parallel({', '.join(str(e) for e in s.extents)}):")
            self.seq(s.body, d + 1)
        elif isinstance(s, ir.If):
            self.emit(d, f"if {expr_str(s.cond)}:")
            self.seq(s.then_body, d + 1)
            if s.else_body is not None and s.else_body.stmts:
                self.emit(d, "else:")
                self.seq(s.else_body, d + 1)
        elif isinstance(s, ir.While):
            self.emit(d, f"while {expr_str(s.cond)}:")
            self.seq(s.body, d + 1)
        elif isinstance(s, ir.AllocBarrier):
            counts = list(s.arrive_counts)
            self.emit(d, f"{s.buffer.name} = T.alloc_barrier({counts[0] if len(counts) == 1 else counts})")
        elif isinstance(s, ir.BarrierArrive):
            self.emit(d, f"T.barrier_arrive({s.buffer.name}[{expr_str(s.index)}])")
        elif isinstance(s, ir.BarrierWait):
            self.emit(d, f"T.barrier_wait({s.buffer.name}[{expr_str(s.index)}], {expr_str(s.parity)})")
        elif isinstance(s, ir.WarpGroups):
            self.emit(d, f"with T.ws({', '.join(map(str, s.groups))}):")
            self.seq(s.body, d + 1)
        elif isinstance(s, ir.ConsumerPartitions):
            self.emit(d, f"for {s.var.name} in T.consumer_partitions({s.count}):  # concurrently, private fragments")
            self.seq(s.body, d + 1)
        else:
            self.emit(d, f"<{type(s).__name__}>")

    def _for(self, s: ir.For, d):
        rng = f"{expr_str(s.start)}, {expr_str(s.stop)}"
        if not (isinstance(s.step, ir.Const) and s.step.value == 1):
            rng += f", {expr_str(s.step)}"
        if s.kind == "pipelined":
            extra = f", num_stages={s.num_stages}"
            if s.order is not None:
                extra += f", order={s.order}"
            if s.stage is not None:
                extra += f", stage={s.stage}"
            head = f"for {s.var.name} in T.Pipelined({rng}{extra}):"
            if s.schedule is not None:
                head += f"  # planned stages={s.schedule.stages} orders={s.schedule.orders}"
                if s.schedule.staged:
                    head += f" staged={list(s.schedule.staged)}"
        else:
            fn = "T.unroll" if s.kind == "unroll" else "T.serial"
            head = f"for {s.var.name} in {fn}({rng}):"
            if s.pipelined_from:
                head += f"  # software-pipelined, {s.pipelined_from} stages"
                if s.trips is not None:
                    head += f", epilogue folded in ({expr_str(s.trips)} iterations)"
                if s.release_ahead:
                    head += ", slots released at the step that read them"
        self.emit(d, head)
        self.seq(s.body, d + 1)


def format_func(func: ir.PrimFunc) -> str:
    """`func` as TileLang source; a function of several kernels (`parts`) prints its workspaces
    and then each part's kernel, headed by the part's name."""
    p = _Printer()
    call_params = func.call_params()
    params = ", ".join(_tensor_type_str(b) if isinstance(b, ir.Buffer) else f"{b.name}: T.{b.dtype}"
                       for b in call_params)
    p.emit(0, "@T.prim_func")
    p.emit(0, f"def {func.name}({params}):")
    if func.out_idx:
        p.emit(1, f"# out_idx={func.out_idx}")
    if func.dynamic_vars:
        p.emit(1, "# dynamic: " + ", ".join(_divisor_note(v) for v in func.dynamic_vars))
    divisible_scalars = [v for v in func.scalar_vars if v.multiple_of > 1]
    if divisible_scalars:  # a divisibility variant (ir/divisibility.py): its own text, its own cache key
        p.emit(1, "# scalars: " + ", ".join(_divisor_note(v) for v in divisible_scalars))
    for b in func.workspaces:
        p.emit(1, f"{b.name} = T.alloc_global({_shape_str(b.shape)}, {b.dtype})")
    for b in func.views:
        p.emit(1, _view_str(b))
    for part in func.parts:
        p.emit(1, f"# kernel {part.name}")
        _kernel(p, part)
    if not func.parts:
        _kernel(p, func)
    return "\n".join(p.lines) + "\n"


def _tensor_type_str(b: ir.Buffer) -> str:
    if b.strides is None:
        return f"{b.name}: T.Tensor({_shape_str(b.shape)}, {b.dtype})"
    return f"{b.name}: T.StridedTensor({_shape_str(b.shape)}, {_shape_str(b.strides)}, {b.dtype})"


def _view_str(b: ir.Buffer) -> str:
    return f"{b.name} = T.view({b.view_of.name}, {_shape_str(b.shape)}, {b.dtype})"


def _divisor_note(v: ir.Var) -> str:
    return v.name + (f" (multiple of {v.multiple_of})" if v.multiple_of > 1 else "")


def _kernel(p, func: ir.PrimFunc):
    """The `with T.Kernel` block of one-kernel `func`, after the facts passes recorded about it."""
    ws = func.attrs.get("warp_specialization")
    if ws is not None:
        p.emit(1, f"# warp specialized: a producer of {ws.producer_warps} warp(s), {ws.producer_registers} registers, "
                  f"issues the async copies of loop(s) {', '.join(ws.loops)}"
                  + (f" and the per-tile load(s) of {', '.join(ws.tile_loads)}" if ws.tile_loads else ""))
    if "consumer_partitions" in func.attrs:
        p.emit(1, f"# consumer partitions: {func.attrs['consumer_partitions']}")
    k = func.kernel
    if k is None:
        p.emit(1, "# no `with T.Kernel(...)` block: host code only, which tritile does not compile")
        return
    grid = ", ".join(expr_str(g) for g in k.grid)
    names = ", ".join(v.name for v in k.block_vars)
    p.emit(1, f"with T.Kernel({grid}, threads={k.threads}) as ({names}):")
    if k.swizzle is not None:
        p.emit(2, f"T.use_swizzle({k.swizzle[0]}, order={k.swizzle[1]!r})")
    p.seq(k.body, 2)


def format_node(node) -> str:
    if isinstance(node, ir.PrimFunc):
        return format_func(node)
    if isinstance(node, ir.Expr):
        return expr_str(node)
    p = _Printer()
    p.stmt(node, 0)
    return "\n".join(p.lines) + "\n"
