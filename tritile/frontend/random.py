"""TileLang's `T.rng_init` / `T.rng_rand` (tilelang/cuda/language/random.py).

TileLang keeps one cuRAND `curandStatePhilox4_32_10_t` per thread: ``T.rng_init(seed, seq, off)``
is ``curand_init(seed, seq, off, &state)`` and each ``T.rng_rand()`` a ``curand(&state)`` - the
next uint32 of the stream.  tritile has no per-thread code, so it models the one kernel shape in
which that stream's order is the program's: ``threads=1``, where TileLang's T.Parallel runs its
elements one after another in row-major order.  The frontend keeps the stream's state per
`with T.Kernel` (`Stream`: seed, subsequence, offset and the draws made so far, a compile-time
count) and lowers each draw to the pure call ``Call("philox", (seed, subsequence, position),
uint32)`` (int64 arguments): word ``position % 4`` of Philox4x32-10 of counter
``(position // 4, subsequence)`` keyed by the seed - cuRAND's draw number `position` of
``curand_init(seed, subsequence, 0)``; draw n after ``curand_init(seed, seq, off)`` is position
``off + n``.  The interpreter evaluates it with tritile/interpreter/philox.py, both backends
with the `_philox_word` helper (tritile/codegen/semantics.py, Triton's `philox_impl`).

Where the draw number is a compile-time function of the element, the lowering is exact:

* outside T.Parallel a call is one draw;
* in a T.Parallel of static extents (one, not nested) with c calls in its body, call k of the
  element of row-major index n is draw ``drawn + n * c + k``; after the loop `drawn` grows by
  the loop's size times c.

Refused with a CompileError at the user's line: `T.rng_rand` before `T.rng_init`, inside a
serial / unrolled / pipelined loop or `while` (its draws depend on the trip), inside a T.Parallel
of runtime extent or nested T.Parallel; `T.rng_init` anywhere but the kernel body's own level
(not under an `if`, a loop or T.Parallel) or in a kernel of ``threads`` other than 1 (TileLang's
threads each draw their own stream for the elements its loop partition gives them).  A
deviation, documented: a draw under an `if` advances the stream whether or not its branch runs
(TileLang's thread skips the `curand` call of an element whose condition fails, and the later
elements draw earlier numbers).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from tritile.errors import CompileError
from tritile.frontend import exprs
from tritile.frontend.thread_ranges import require_one_thread
from tritile.ir import nodes as ir
from tritile.ir.dtypes import int64, uint32
from tritile.ir.transform import substitute_vars


@dataclass
class Stream:
    """The generator state of one kernel: `T.rng_init`'s arguments (int64 Exprs) and the draws
    made so far (a compile-time count)."""

    seed: ir.Expr
    subsequence: ir.Expr
    offset: ir.Expr
    drawn: int = 0


@dataclass
class ParallelDraws:
    """A T.Parallel whose body is being parsed: its lane variables, extents (ints when static) and
    the draws its body has made per element so far; `per_element` stands for their final count."""

    lanes: tuple
    extents: tuple
    calls: int = 0
    per_element: ir.Var = field(default_factory=lambda: ir.Var("rng_calls", int64))

    @property
    def static(self) -> bool:
        return all(isinstance(e, int) for e in self.extents)


def _int64(p, value, what, loc) -> ir.Expr:
    value = p.scalar(value, loc)
    if isinstance(value, bool) or not isinstance(value, (int, ir.Expr)) or \
            isinstance(value, ir.Expr) and not value.dtype.is_int:
        raise CompileError(f"T.rng_init: {what} must be an integer, got {value!r}", loc)
    if isinstance(value, int):  # curand_init's unsigned long long: its bits, as int64
        value &= 0xFFFFFFFFFFFFFFFF
        return ir.Const(value - (1 << 64) if value >> 63 else value, int64)
    return exprs.cast(value, int64, loc)


def _bound(p, value, name, loc) -> ir.Expr:
    """`value` as of `T.rng_init`: a Let (a later write of a buffer it reads must not change it)."""
    if isinstance(value, (ir.Const, ir.Var)):
        return value
    var = ir.Var(p.unique_name(name), int64)
    p.emit(ir.Let(var, value, loc=loc))
    return var


_RNG_THREADS = ("TileLang's threads each hold their own generator and draw for the elements its loop partition "
                "gives them, which tritile models only with threads=1 (one thread draws every element in row-major "
                "order)")


def rng_init(p, a, loc):
    p.require_kernel("T.rng_init", loc)
    require_one_thread(p, "T.rng_init", loc, _RNG_THREADS)
    if a["generator"] != "curandStatePhilox4_32_10_t":
        raise CompileError(f"T.rng_init(generator={a['generator']!r}): tritile implements cuRAND's "
                           f"curandStatePhilox4_32_10_t only", loc)
    if len(p.blocks) != p.kernel_block_depth:
        raise CompileError("T.rng_init inside an `if`, a loop or T.Parallel: tritile keeps the generator's state "
                           "at compile time; initialize it at the kernel body's own level", loc)
    seq = a["seq"]
    if seq is None:  # TileLang's default: tx + bx * thread extent, i.e. bx with one thread
        seq = p.kernel_block_vars[0]
    seed = _bound(p, _int64(p, a["seed"], "seed", loc), "rng_seed", loc)
    subsequence = _bound(p, _int64(p, seq, "seq", loc), "rng_seq", loc)
    offset = _bound(p, _int64(p, a["off"], "off", loc), "rng_off", loc)
    p.rng = Stream(seed, subsequence, offset)


def rng_rand(p, a, loc):
    p.require_kernel("T.rng_rand", loc)
    stream = p.rng
    if stream is None:
        raise CompileError("T.rng_rand() before T.rng_init(...) in this kernel", loc)
    if p.serial_loop_depth:
        raise CompileError("T.rng_rand() inside a serial, unrolled or pipelined loop or a `while`: its draws "
                           "depend on the trip, which tritile's compile-time stream position cannot follow; draw "
                           "in a T.Parallel of static extents outside the loop", loc)
    draws = p.rng_parallel
    if not draws:
        position = exprs.binary("+", stream.offset, ir.Const(stream.drawn, int64), loc)
        stream.drawn += 1
    else:
        frame = draws[-1]
        if len(draws) > 1:
            raise CompileError("T.rng_rand() inside nested T.Parallel loops is not supported; draw in one "
                               "T.Parallel over all the axes", loc)
        if not frame.static:
            raise CompileError("T.rng_rand() inside a T.Parallel of runtime extent: which draw an element gets "
                               "depends on the extent; use static extents (guard the tail with an `if`)", loc)
        index = None  # the element's row-major index
        for lane, extent in zip(frame.lanes, frame.extents):
            lane = exprs.cast(lane, int64, loc)
            index = lane if index is None else exprs.binary(
                "+", exprs.binary("*", index, ir.Const(extent, int64), loc), lane, loc)
        draw = exprs.binary("+", exprs.binary("*", index, frame.per_element, loc),
                            ir.Const(stream.drawn + frame.calls, int64), loc)
        position = exprs.binary("+", stream.offset, draw, loc)
        frame.calls += 1
    return ir.Call("philox", (stream.seed, stream.subsequence, position), uint32)


def leave_parallel(p, frame: ParallelDraws, body: ir.Seq) -> ir.Seq:
    """The T.Parallel body parsed with `frame`: its per-element draw count filled in, and the
    stream advanced past the loop's draws."""
    if not frame.calls:
        return body
    p.rng.drawn += prod(max(e, 0) for e in frame.extents) * frame.calls
    return substitute_vars(body, {frame.per_element: ir.Const(frame.calls, int64)})
