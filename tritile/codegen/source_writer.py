"""`SourceWriter`: the text-emission state every backend's emitter builds on.

It owns the generated lines and their indentation, the names (a Buffer or Var keeps the
user's name unless it clashes with a reserved or already taken one; temporaries start with
``_``), the Vars bound so far, and the text of a global tensor's dims and strides (a
`T.StridedTensor`'s declared ones, else row-major: a `T.Tensor` is contiguous, the runtime
checks it).  Subclasses provide
``expr(e) -> Val`` (codegen/semantics.py) and the rules that call `emit`.
"""
from __future__ import annotations

import itertools
import keyword

from tritile.errors import CompileError
from tritile.ir import nodes as ir


class SourceWriter:
    def __init__(self, func: ir.PrimFunc, reserved):
        self.func = func
        self.lines = []
        self.depth = 1
        self._names = {}
        self._taken = set(reserved)
        self._tmp = itertools.count()
        self.defined = set()  # ids of Vars bound so far (dims, block ids, loop vars, lets)

    def expr(self, e):
        raise NotImplementedError

    # ---------------------------------------------------------------- output
    def emit(self, text: str):
        self.lines.append("    " * self.depth + text)

    def tmp(self, hint: str = "t") -> str:
        return self.fresh(f"_{hint}{next(self._tmp)}")

    def fresh(self, base: str) -> str:
        """A new unique identifier derived from `base`."""
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in base) or "v"
        if base[0].isdigit() or keyword.iskeyword(base):
            base = "v_" + base
        cand, n = base, 0
        while cand in self._taken:
            n += 1
            cand = f"{base}_{n}"
        self._taken.add(cand)
        return cand

    def define(self, var: ir.Var) -> str:
        self.defined.add(id(var))
        return self.name(var)

    def name(self, obj) -> str:
        """The generated name of a Buffer or Var (the user's name unless it clashes)."""
        key = id(obj)
        if key not in self._names:
            # the object is kept with its name: a temporary Var freed after use would
            # otherwise pass its id, and so its name, on to the next object allocated there
            self._names[key] = (obj, self.fresh(obj.name))
        return self._names[key][1]

    # ---------------------------------------------------------------- globals
    def shape_text(self, dim) -> str:
        return str(dim) if isinstance(dim, int) else self.expr(dim).text

    def strides(self, buf: ir.Buffer) -> list:
        """The element stride of each dim of global `buf` as text: a `T.StridedTensor`'s declared
        ones, else row-major ones from its dims."""
        if buf.strides is not None:
            return [self.shape_text(s) for s in buf.strides]
        out, acc = [], None
        for dim in reversed(buf.shape):
            out.append(acc or "1")
            d = self.shape_text(dim)
            acc = d if acc is None else f"{acc} * {paren(d)}"
        return list(reversed(out))

    def host_strides(self, buf: ir.Buffer):
        """A `T.StridedTensor`'s declared strides as host expressions (a TMA descriptor's, in the
        launcher), None for a row-major `T.Tensor`."""
        return None if buf.strides is None else tuple(host_expr(s, self) for s in buf.strides)


def paren(text: str) -> str:
    if text.replace("_", "").replace(".", "").isalnum() or _wrapped(text):
        return text
    return f"({text})"


def _wrapped(text: str) -> bool:
    """True when `text` is one parenthesised group, e.g. "(a + b)" but not "(a) + (b)"."""
    if not (text.startswith("(") and text.endswith(")")):
        return False
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and i < len(text) - 1:
            return False
    return True


def static_int(x):
    """The Python int of a static extent / Const, else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, ir.Const) and isinstance(x.value, int) and not isinstance(x.value, bool):
        return x.value
    return None


# a `T.unroll` loop of more trips stays a loop: Triton's frontend unrolls a static_range body by
# body, and 4096 trips of decoding's combine kept the Gluon compile going for minutes (a mutated
# program, bench/NOTES.md session 29)
UNROLL_LIMIT = 256


def unrolled(s: ir.For) -> bool:
    """Is loop `s` emitted unrolled (``static_range``): a `T.unroll` of static bounds and at most
    `UNROLL_LIMIT` trips.  Any other loop is a loop - the same program, its variable a runtime
    value as a `T.serial`'s."""
    bounds = [static_int(e) for e in (s.start, s.stop, s.step)]
    return (s.kind == "unroll" and None not in bounds and bounds[2] != 0
            and len(range(*bounds)) <= UNROLL_LIMIT)


def is_pow2(n) -> bool:
    return isinstance(n, int) and n > 0 and n & (n - 1) == 0


_HOST_OPS = {"+", "-", "*", "//", "%", "<", "<=", ">", ">=", "==", "!=", "&", "|", "^", "<<", ">>"}


def runtime_arg_types(func: ir.PrimFunc) -> list:
    """Triton's signature type of each of `func.runtime_vars`, the scalars a kernel takes after
    its tensors: i32 for a `T.dynamic` dim, the parameter's dtype for a scalar parameter."""
    from tritile.codegen.semantics import SCALAR_TYPES

    return ["i32"] * len(func.dynamic_vars) + [SCALAR_TYPES[v.dtype.name] for v in func.scalar_vars]


def host_expr(e, em) -> str:
    """A grid expression as host Python (runtime dims and scalar parameters are launcher arguments)."""
    if isinstance(e, int):
        return str(e)
    if isinstance(e, ir.Var):
        return em.name(e)
    if isinstance(e, ir.Const):
        return repr(e.value)
    if isinstance(e, ir.BinOp):
        a, b = host_expr(e.lhs, em), host_expr(e.rhs, em)
        if e.op in ("max", "min"):
            return f"{e.op}({a}, {b})"
        op = "//" if e.op == "/" else e.op
        if op in _HOST_OPS:
            return f"({a} {op} {b})"
    raise CompileError(f"grid extent {e!r} cannot be computed on the host")
