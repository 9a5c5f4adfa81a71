"""`codegen/signs.py`'s upper bounds, by which a global tile drops the test of a dim it cannot
leave (`semantics.tile_inside`): an unsound bound would write outside a tensor, so every bound
is checked against the largest value found by running the loops.

A block index `bx` (grid G), a `Let` ``first = a * bx`` (or ``bx // d``), and a loop
``for t in range(start, stop)`` whose stop may depend on `first` (``C - first``,
``max(C - first, 1)``: the shapes pipeline injection gives a causal backward's query loop);
the expression bounded is ``(cf * first + ct * t + c) * k``.
"""
from hypothesis import given
from hypothesis import strategies as st

import irb
from tritile.codegen.signs import NonNegative


def _program(grid, first_kind, scale, count, start_kind, stop_kind):
    """(func, bx, first, t, value of first(bx), start(first), stop(first))."""
    bx, first, t = irb.var("bx"), irb.var("first"), irb.var("t")
    if first_kind == "times":
        first_value, first_of = irb.mul(bx, scale), (lambda b: b * scale)
    else:
        first_value, first_of = irb.floordiv(bx, scale), (lambda b: b // scale)
    start, start_of = {"zero": (0, lambda f: 0), "one": (1, lambda f: 1), "first": (first, lambda f: f)}[start_kind]
    stop, stop_of = {
        "count": (count, lambda f: count),
        "count - first": (irb.sub(count, first), lambda f: count - f),
        "max(count - first, 1)": (irb.binop("max", irb.sub(count, first), 1), lambda f: max(count - f, 1)),
    }[stop_kind]
    body = irb.seq(irb.ir.Let(first, first_value, loc=irb.LOC), irb.for_(t, start, stop))
    func = irb.prim_func("bounds", [], grid=(grid,), block_vars=(bx,), body=body)
    return func, bx, first, t, first_of, start_of, stop_of


@given(grid=st.integers(1, 8), first_kind=st.sampled_from(["times", "floordiv"]), scale=st.integers(1, 3),
       count=st.integers(1, 30), start_kind=st.sampled_from(["zero", "one", "first"]),
       stop_kind=st.sampled_from(["count", "count - first", "max(count - first, 1)"]),
       cf=st.integers(-2, 3), ct=st.integers(-2, 3), c=st.integers(-5, 5), k=st.integers(1, 64))
def test_upper_bound_is_never_below_a_value_the_loops_reach(grid, first_kind, scale, count, start_kind, stop_kind,
                                                             cf, ct, c, k):
    func, bx, first, t, first_of, start_of, stop_of = _program(grid, first_kind, scale, count, start_kind,
                                                               stop_kind)
    expr = irb.mul(irb.add(irb.add(irb.mul(cf, first), irb.mul(ct, t)), c), k)
    reached = [(cf * f + ct * i + c) * k for f in map(first_of, range(grid))
               for i in range(start_of(f), stop_of(f))]
    bound = NonNegative(func).upper_bound(expr)
    if reached and bound is not None:
        assert bound >= max(reached), (bound, max(reached))


def test_upper_bound_follows_a_loop_whose_stop_falls_as_its_block_rises():
    """The causal backward's query rows: ``(first + t - 1) * 64`` for t in [1, 64 - first),
    first = 2 * bx, bx < 32 - at most 62 * 64 (intervals alone: 124 * 64); in its last step,
    t = max(64 - first, 1), at most 63 * 64."""
    func, bx, first, t, *_ = _program(32, "times", 2, 64, "one", "count - first")
    rows = irb.mul(irb.sub(irb.add(first, t), 1), 64)
    analysis = NonNegative(func)
    assert analysis.interval(rows)[1] == 124 * 64
    assert analysis.upper_bound(rows) == 62 * 64
    last = irb.mul(irb.add(first, irb.sub(irb.binop("max", irb.sub(64, first), 1), 1)), 64)
    assert analysis.upper_bound(last) == 63 * 64


@given(grid=st.integers(1, 8), first_kind=st.sampled_from(["times", "floordiv"]), scale=st.integers(1, 3),
       count=st.integers(1, 30), start_kind=st.sampled_from(["zero", "one", "first"]),
       stop_kind=st.sampled_from(["count", "count - first", "max(count - first, 1)"]),
       lag=st.integers(-2, 2), span=st.integers(0, 2), cf=st.integers(-2, 3), ct=st.integers(-2, 3),
       c=st.integers(-5, 5), k=st.integers(1, 64))
def test_bounds_at_an_iteration_hold_every_value_the_copy_loads(grid, first_kind, scale, count, start_kind,
                                                                stop_kind, lag, span, cf, ct, c, k):
    """`at_iteration`: a copy of iteration ``t - lag`` in a loop over t that runs `span` steps past
    the trip count (a folded loop, a producer's groups: the copy is guarded off there) loads only
    iterations in [0, trips); the bounds of its start over those are never inside the values it
    loads."""
    func, bx, first, t, first_of, start_of, stop_of = _program(grid, first_kind, scale, count, start_kind,
                                                               stop_kind)
    trips = func.kernel.body.stmts[1].stop
    func.kernel.body.stmts[1].stop = irb.add(trips, span)
    expr = irb.mul(irb.add(irb.add(irb.mul(cf, first), irb.mul(ct, t)), c), k)
    reached = [(cf * f + ct * i + c) * k for f in map(first_of, range(grid))
               for i in range(start_of(f), stop_of(f) + span) if 0 <= i - lag < stop_of(f)]
    analysis = NonNegative(func)
    at = analysis.at_iteration(expr, irb.sub(t, lag) if lag else t, trips)
    lo, hi = analysis.interval(at)[0], analysis.upper_bound(at)
    if reached:
        assert lo is None or lo <= min(reached), (lo, min(reached))
        assert hi is None or hi >= max(reached), (hi, max(reached))


def test_a_producers_copy_is_bounded_by_the_iterations_it_loads():
    """A producer partition's V copy of group g, iteration g - 1 of 8, for g in [0, 9): its rows
    ``(g - 1) * 128`` lie in [0, 7 * 128] - not [-128, 7 * 128 + 128] as g's own range says."""
    g = irb.var("g")
    func = irb.prim_func("producer", [], grid=(1,), block_vars=(irb.var("bx"),), body=irb.seq(irb.for_(g, 0, 9)))
    rows = irb.mul(irb.sub(g, 1), 128)
    analysis = NonNegative(func)
    assert analysis.interval(rows) == (-128, 7 * 128)
    at = analysis.at_iteration(rows, irb.sub(g, 1), irb.ex(8))
    assert analysis.interval(at)[0] == 0 and analysis.upper_bound(at) == 7 * 128
