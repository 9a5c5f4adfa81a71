"""Which integer expressions of a kernel are provably non-negative.

Contract
--------
`NonNegative(func)` bounds the Vars of `func`: block indices [0, grid - 1], `T.Parallel`
lanes [0, extent - 1], consumer-partition numbers [0, count - 1], runtime dimensions >= 0,
loop variables of loops counting up by a positive constant step [start, stop - 1], `Let`
bindings by their value.  `proves(e)` is true only when `e` >= 0 on every run; False means
"not proven", never "negative".

Bounds of an expression: `%` by a positive constant c is in [0, c - 1] (floor modulo),
`//`, min, max, `if_then_else`, casts and constant-table reads by interval arithmetic, and
a sum of products of such terms (each product over disjoint terms: multilinear, like the
persistent tile number ``it * P + pid + (it % 2) * (P - 1 - 2 * pid)``) by its smallest
value over the corners of its terms' ranges, where a multilinear function takes its
minimum.  Index arithmetic is assumed not to overflow.

A `max` / `min` whose operands' intervals decide it is its winning operand inside such a
sum (``max(64 - first, 1)`` for first <= 62 is ``64 - first``).

`upper_bound(e)` tightens the interval's upper end where `e` grows with the variable of a loop
(``e(v + 1) - e(v) >= 0`` over the ranges): `e` with the variable at its loop's last value,
``stop - 1``, keeps what intervals lose, that the variable and its stop move together - in a
loop over ``range(1, 64 - first)`` (a causal backward's query blocks, `first` = 2 * bx)
``(first + j - 1) * 64`` is at most 62 * 64 whatever `first` is (the form's `first`s cancel).
Only stops built of Vars, constants and arithmetic (no buffer loads) take part: a Var never
changes while its loop runs.

`at_iteration(e, iteration, trips)` reads an expression of a pipelined async copy, which runs
only for iterations in [0, trips) (`AsyncCopy.iteration`'s contract, lowering/pipeline_injection.py),
over that range: the iteration's term (its loop variable, or an epilogue's ``max(n, 2)``)
becomes a fresh variable holding the iteration, so that a warp producer's ``(g - 1) * 128`` or
a folded loop's copy, whose variable runs past the trip count while the copy itself is guarded
off, is bounded by the iterations the copy loads.

Both backends (Gluon, triton.language) emit integer `//` and `%` as Triton's truncating
division when both operands are proven non-negative (floor and truncation agree there): index arithmetic -
block and lane indices, loop counters, persistent tile numbers, buffer-version slots -
takes the plain instructions.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Optional

from tritile.ir import nodes as ir
from tritile.ir.transform import Transformer, substitute_vars, walk

_BIG = 1 << 40  # stands for an unbounded end when a multilinear form is evaluated at corners
_MAX_TERMS = 8  # corners evaluated: 2 ** terms
_MAX_LOOP_DEPTH = 4  # nested loops whose variables `upper_bound` moves to their last value


def of(em) -> "NonNegative":
    """The analysis of the kernel `em` (a backend's emitter, with `.func`) is emitting, made once per kernel."""
    cached = getattr(em, "_signs", None)
    if cached is None or cached.func is not em.func:
        cached = em._signs = NonNegative(em.func)
    return cached


class NonNegative:
    def __init__(self, func: ir.PrimFunc):
        self.func = func
        self.assumed = set()  # keys of expressions code generation knows to be >= 0 where used
        self.ranges = {}  # id(Var) -> (lo, hi), None = unbounded
        self.stops = {}  # id(Var) -> (var, stop) of a loop counting up to stop (exclusive)
        for v in func.dynamic_vars:
            self.ranges[id(v)] = (0, None)
        for v, extent in zip(func.kernel.block_vars, func.kernel.grid):
            hi = self.interval(extent)[1]
            self.ranges[id(v)] = (0, None if hi is None else hi - 1)
        for node in walk(func.kernel.body):  # pre-order: a binding is seen before its uses
            if isinstance(node, ir.Parallel):
                for v, extent in zip(node.vars, node.extents):
                    self.ranges[id(v)] = (0, _static(extent) - 1 if _static(extent) else None)
            elif isinstance(node, ir.ConsumerPartitions):
                self.ranges[id(node.var)] = (0, node.count - 1)
            elif isinstance(node, ir.For):
                step = _static(node.step)
                if step is not None and step > 0:
                    lo, hi = self.interval(node.start)[0], self.interval(node.stop)[1]
                    self.ranges[id(node.var)] = (lo, None if hi is None else hi - 1)
                    if not any(isinstance(n, ir.Load) for n in walk(node.stop)):
                        self.stops[id(node.var)] = (node.var, node.stop)
            elif isinstance(node, ir.Let):
                self.ranges[id(node.var)] = self.interval(node.value)

    def assume_nonnegative(self, e):
        """Record that `e` is >= 0 wherever the code being generated uses it (a Var of a loop
        the backend itself emits, or an iteration whose copy is predicated on being >= 0)."""
        self.assumed.add(_key(e))

    def proves(self, e) -> bool:
        """Whether `e` (an IR expression or a Python number) is >= 0 on every run."""
        lo = self.interval(e)[0]
        return lo is not None and lo >= 0

    def upper_bound(self, e, depth: int = 0) -> Optional[int]:
        """The largest value integer `e` takes (None: unbounded): `interval`'s upper end, or
        less where `e` grows with a loop's variable (module doc)."""
        best = self.interval(e)[1]
        if depth >= _MAX_LOOP_DEPTH or not isinstance(e, ir.Expr):
            return best
        loops = {id(n): self.stops[id(n)] for n in walk(e) if isinstance(n, ir.Var) and id(n) in self.stops}
        for var, stop in loops.values():
            after = substitute_vars(e, {var: ir.BinOp("+", var, ir.Const(1, var.dtype), var.dtype)})
            growth = self.interval(ir.BinOp("-", after, e, e.dtype))[0]
            if growth is None or growth < 0:
                continue
            last = self.upper_bound(substitute_vars(e, {var: ir.BinOp("-", stop, ir.Const(1, stop.dtype), stop.dtype)}),
                                    depth + 1)
            if last is not None and (best is None or last < best):
                best = last
        return best

    def at_iteration(self, e, iteration, trips):
        """`e`, evaluated only where the pipeline iteration `iteration` lies in [0, `trips`), as
        an expression of a fresh variable holding the iteration there (stop `trips`, so
        `upper_bound` moves it to ``trips - 1``; its range also within the iteration's own
        interval, a steady-state loop's): the iteration is ``term + c`` (a loop variable, or an
        epilogue's ``max(n, 2)``), and every occurrence of `term` in `e` becomes ``fresh - c``.
        A constant iteration (whose copy's starts are constants too) leaves `e` as it is."""
        term, offset = _term_and_offset(iteration)
        if term is None:
            return e
        fresh = ir.Var("iteration", term.dtype)
        (lo, hi), last = self.interval(iteration), self.interval(trips)[1]
        last = None if last is None else last - 1
        self.ranges[id(fresh)] = (0 if lo is None else max(lo, 0), _join(min, hi, last, False))
        if isinstance(trips, int) or not any(isinstance(n, ir.Load) for n in walk(trips)):
            self.stops[id(fresh)] = (fresh, trips if isinstance(trips, ir.Expr) else ir.Const(trips))
        value = ir.BinOp("-", fresh, ir.Const(offset, term.dtype), term.dtype) if offset else fresh
        key = _key(term)

        class _Replace(Transformer):
            def transform(self, node):
                node = super().transform(node)
                return value if isinstance(node, ir.Expr) and _key(node) == key else node

        return _Replace().transform(e)

    # ------------------------------------------------------------------ bounds
    def interval(self, e) -> tuple:
        """(lo, hi) with None for an unknown end."""
        if isinstance(e, (bool, int)):
            return int(e), int(e)
        if not isinstance(e, ir.Expr) or not (e.dtype.is_int or e.dtype.kind == "bool"):
            return None, None
        lo, hi = self._interval(e)
        if e.dtype.kind in ("uint", "bool"):
            lo = 0 if lo is None else max(lo, 0)
        return lo, hi

    def _interval(self, e) -> tuple:
        if self.assumed and _key(e) in self.assumed:
            return 0, None
        if isinstance(e, ir.Const):
            return int(e.value), int(e.value)
        if isinstance(e, ir.Var):
            return self.ranges.get(id(e), (None, None))
        if isinstance(e, ir.BinOp) and e.op in ("+", "-", "*"):
            return self._multilinear(e)
        if isinstance(e, ir.BinOp) and e.op in ("%", "//"):
            # a positive divisor [clo, chi] (a constant, `10 * 16`, or a panel width min(..., 10))
            clo, chi = self.interval(e.rhs)
            if clo is None or clo <= 0:
                return None, None
            lo, hi = self.interval(e.lhs)
            if e.op == "%":  # floor modulo: in [0, c - 1] whatever the sign of the dividend
                top = None if chi is None else chi - 1
                return 0, top if lo is None or lo < 0 or hi is None else _join(min, top, hi, False)
            return _floordiv_bound(lo, clo, chi, low=True), _floordiv_bound(hi, clo, chi, low=False)
        if isinstance(e, ir.BinOp) and e.op in ("max", "min") or isinstance(e, ir.Call) and e.fn in ("max", "min"):
            args, name = ((e.lhs, e.rhs), e.op) if isinstance(e, ir.BinOp) else (e.args, e.fn)
            (alo, ahi), (blo, bhi) = (self.interval(a) for a in args)
            pick = max if name == "max" else min
            return _join(pick, alo, blo, pick is min), _join(pick, ahi, bhi, pick is max)
        if isinstance(e, ir.Call) and e.fn == "if_then_else":  # either branch
            (alo, ahi), (blo, bhi) = self.interval(e.args[1]), self.interval(e.args[2])
            return _join(min, alo, blo, True), _join(max, ahi, bhi, True)
        if isinstance(e, ir.TableRead):
            return min(e.table.values, default=0), max(e.table.values, default=0)
        if isinstance(e, ir.Cast) and (e.value.dtype.is_int or e.value.dtype.kind == "bool"):
            # the value's interval where the target type holds it; a cast that may wrap (uint8 ->
            # int8 turns 128..255 negative) knows nothing
            lo, hi = self.interval(e.value)
            (tlo, thi), (slo, shi) = _type_range(e.dtype), _type_range(e.value.dtype)
            if tlo <= (slo if lo is None else lo) and (shi if hi is None else hi) <= thi:
                return lo, hi
        return None, None

    def _multilinear(self, e) -> tuple:
        """Bounds of a sum of products of terms over their ranges' corners (see module doc)."""
        terms = {}
        form = self._form(e, terms)
        if form is None or len(terms) > _MAX_TERMS or any(
                lo is None for lo, _ in terms.values()):
            return None, None
        keys = list(terms)
        values = []
        for corner in itertools.product(*[(terms[k][0], _BIG if terms[k][1] is None else terms[k][1])
                                          for k in keys]):
            values.append(form(dict(zip(keys, corner))))
        lo, hi = min(values), max(values)
        return (lo if lo > -_BIG // 2 else None), (hi if hi < _BIG // 2 else None)

    def _form(self, e, terms: dict):
        """A function of the terms' values computing `e`, or None when `e` is not multilinear
        in them; `terms` collects key -> (lo, hi)."""
        if isinstance(e, ir.Const) and isinstance(e.value, int):
            return lambda env, v=int(e.value): v
        if isinstance(e, ir.BinOp) and e.op in ("+", "-", "*") and e.dtype.is_int:
            left, right = {}, {}
            a, b = self._form(e.lhs, left), self._form(e.rhs, right)
            if a is None or b is None or e.op == "*" and set(left) & set(right):
                return None
            terms.update(left)
            terms.update(right)
            if e.op == "+":
                return lambda env: a(env) + b(env)
            if e.op == "-":
                return lambda env: a(env) - b(env)
            return lambda env: a(env) * b(env)
        decided = self._decided_extremum(e)
        if decided is not None:  # max(64 - first, 1) with first <= 62: 64 - first, still a form
            return self._form(decided, terms)
        key = _key(e)
        terms[key] = self.interval(e)
        return lambda env: env[key]

    def _decided_extremum(self, e):
        """The operand a `max` / `min` always returns by the operands' intervals, else None."""
        if isinstance(e, ir.BinOp) and e.op in ("max", "min"):
            name, args = e.op, (e.lhs, e.rhs)
        elif isinstance(e, ir.Call) and e.fn in ("max", "min") and len(e.args) == 2:
            name, args = e.fn, tuple(e.args)
        else:
            return None
        (alo, ahi), (blo, bhi) = (self.interval(a) for a in args)
        if name == "min":  # min(a, b) = -max(-a, -b): the same test on the other ends
            alo, ahi, blo, bhi = (None if x is None else -x for x in (ahi, alo, bhi, blo))
        if alo is not None and bhi is not None and alo >= bhi:
            return args[0]
        if blo is not None and ahi is not None and blo >= ahi:
            return args[1]
        return None


def _key(e):
    """A structural key of an expression (Vars, buffers and tables by identity, not by name)."""
    if isinstance(e, ir.Var):
        return ("var", e.uid)
    if isinstance(e, (ir.Buffer, ir.ConstTable)):
        return (type(e).__name__, id(e))
    if isinstance(e, (list, tuple)):
        return tuple(_key(x) for x in e)
    if isinstance(e, ir.Expr) and dataclasses.is_dataclass(e):
        return (type(e).__name__,) + tuple(_key(getattr(e, f.name)) for f in dataclasses.fields(e) if f.name != "loc")
    return repr(e)


def _term_and_offset(iteration) -> tuple:
    """(term, c) of an iteration ``term + c`` (``term - c``, nested; a constant: (None, c))."""
    if not isinstance(iteration, ir.Expr):
        return None, iteration
    if isinstance(iteration, ir.Const):
        return None, iteration.value
    if isinstance(iteration, ir.BinOp) and iteration.op in ("+", "-") and isinstance(iteration.rhs, ir.Const):
        term, offset = _term_and_offset(iteration.lhs)
        return term, offset + iteration.rhs.value if iteration.op == "+" else offset - iteration.rhs.value
    return iteration, 0


def _floordiv_bound(n, clo: int, chi, low: bool):
    """The lower (`low`) or upper bound of n // d for the bound `n` of the dividend (None:
    unknown) and d in [clo, chi] (clo > 0, chi None: unbounded): a non-negative n is divided by
    the largest d for the lower bound and the smallest for the upper, a negative one the other
    way round (an unbounded d takes n // d to 0 or -1)."""
    if n is None:
        return None
    if (n >= 0) == low:
        return (0 if n >= 0 else -1) if chi is None else n // chi
    return n // clo


def _static(e) -> Optional[int]:
    if isinstance(e, bool):
        return None
    if isinstance(e, int):
        return e
    if isinstance(e, ir.Const) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return e.value
    return None


def _type_range(dtype) -> tuple:
    """(least, greatest) value of an integer or bool IR dtype, as ints."""
    return int(dtype.min.value), int(dtype.max.value)


def _join(pick, a, b, unknown_wins: bool):
    """`pick`(a, b) of two bounds where None is unknown: the unknown end wins when picking
    toward it (min of lower bounds, max of upper bounds), else the known one does."""
    if a is None or b is None:
        return None if unknown_wins else (b if a is None else a)
    return pick(a, b)
