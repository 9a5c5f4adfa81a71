"""The async model of the reference interpreter: in-flight copies and gemms, and the
hazards that a software pipeline must not have.

Contract
--------
* A *box* is a tuple of half-open ``(lo, hi)`` integer ranges, one per buffer dimension;
  accesses conflict when their boxes overlap in every dimension.  Boxes are exact for
  tile ops and element accesses, and the bounding box of the active lanes inside
  `T.Parallel`, so a correct pipeline (copy into slot s+1 while slot s is read) never
  conflicts.
* `AsyncCopy` data is captured at issue time and written into its destination (by the
  `land` callback) when a `WaitGroup` completes its commit group.  Groups complete in FIFO
  order; `WaitGroup(n)` completes all but the n most recently committed groups; copies
  issued after the last commit belong to the still-open group and are not completed.
* An async `Gemm` computes eagerly; its A/B boxes stay "operand" accesses and its C box an
  "accumulator" access until `WaitMMA(n)` retires all but the n most recent async gemms.
* `check` raises `HazardError` for: reading a pending copy destination; writing a pending
  copy destination (WAW) or a pending gemm operand (WAR); touching a pending accumulator
  from anything but another async gemm on that accumulator.  `wait_group` raises when a
  wait claims to complete an iteration whose group is still pending; `check_drained`
  raises when the kernel ends with work in flight.  Every message names the buffer, the
  slot (leading index of a versioned buffer) and both statements with their locations.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

from tritile.errors import HazardError
from tritile.ir import nodes as ir
from tritile.ir.printer import format_node


def boxes_overlap(a: tuple, b: tuple) -> bool:
    return all(lo1 < hi2 and lo2 < hi1 for (lo1, hi1), (lo2, hi2) in zip(a, b))


@dataclass(eq=False)
class _AsyncOp:
    """One issued AsyncCopy or async Gemm."""

    stmt: ir.Stmt
    accesses: list = field(default_factory=list)
    land: Optional[Callable[[], None]] = None  # copies: makes the data visible
    iteration: object = None  # copies: the evaluated `AsyncCopy.iteration`

    def describe(self) -> str:
        text = describe_stmt(self.stmt)
        return text if self.iteration is None else f"{text} (issued for iteration {self.iteration})"


@dataclass(eq=False)
class _Access:
    buffer: ir.Buffer
    box: tuple
    role: str  # "copy" (destination of an async copy) | "operand" | "accumulator"
    op: _AsyncOp


@dataclass(eq=False)
class _Group:
    ops: list
    iteration: object
    commit: ir.Stmt
    landed: bool = False


def describe_stmt(stmt) -> str:
    """One line: the statement as the IR printer shows it, plus its source location."""
    if stmt is None:
        return "<unknown statement>"
    lines = format_node(stmt).strip().splitlines()
    text = lines[0] + (" ..." if len(lines) > 1 else "")
    loc = getattr(stmt, "loc", None)
    return f"{text}  [{loc}]" if loc is not None else text


def describe_place(buffer: ir.Buffer, box: tuple) -> str:
    """``A_shared slot 1`` for a versioned buffer, ``A_shared`` otherwise."""
    if buffer.num_versions > 1 and box:
        lo, hi = box[0]
        return f"{buffer.name} slot {lo}" if hi == lo + 1 else f"{buffer.name} slots {lo}..{hi - 1}"
    return buffer.name


def _intersection(a: tuple, b: tuple) -> tuple:
    return tuple((max(lo1, lo2), min(hi1, hi2)) for (lo1, hi1), (lo2, hi2) in zip(a, b))


class AsyncTracker:
    """In-flight async work of one thread block."""

    def __init__(self, block: tuple):
        self.block = block
        self._by_buffer: dict = {}  # Buffer -> [_Access]
        self._open: list = []  # copies issued since the last commit
        self._groups: deque = deque()  # committed, not yet completed
        self._group_of_iteration: dict = {}  # iteration value -> most recent _Group
        self._mmas: deque = deque()  # async gemms in issue order

    # ------------------------------------------------------------------ checks
    def busy(self, buffer: ir.Buffer) -> bool:
        """Cheap test used before computing the box of an access."""
        return bool(self._by_buffer.get(buffer))

    def check(self, buffer: ir.Buffer, box: tuple, stmt, *, write: bool, async_accumulate: bool = False):
        for access in self._by_buffer.get(buffer, ()):
            if not boxes_overlap(access.box, box):
                continue
            if access.role == "accumulator":
                if async_accumulate:
                    continue
                problem = (f"{'writes' if write else 'reads'} the accumulator {{place}} of an async "
                           f"T.gemm before a T.wait_mma retired it")
            elif access.role == "copy":
                problem = ("overwrites {place} while an async copy into it is still in flight (WAW)" if write
                           else "reads {place} before a T.wait_group made its async copy visible")
            elif write:
                problem = "overwrites {place} while an async T.gemm still reads it (no covering T.wait_mma)"
            else:
                continue
            self._raise(problem, access, box, stmt)

    def _raise(self, problem: str, access: _Access, box: tuple, stmt):
        place = describe_place(access.buffer, _intersection(access.box, box))
        raise HazardError(
            f"hazard in block {self.block}: {problem.format(place=place)}\n"
            f"  statement: {describe_stmt(stmt)}\n"
            f"  in flight: {access.op.describe()}")

    # ------------------------------------------------------------------ copies
    def issue_copy(self, stmt: ir.AsyncCopy, buffer: ir.Buffer, box: tuple, land: Callable[[], None],
                   iteration=None):
        op = _AsyncOp(stmt, land=land, iteration=iteration)
        self._add(op, buffer, box, "copy")
        self._open.append(op)

    def commit(self, stmt: ir.CommitGroup, iteration):
        group = _Group(self._open, iteration, stmt)
        self._open = []
        self._groups.append(group)
        if iteration is not None:
            self._group_of_iteration[iteration] = group

    def wait_group(self, stmt: ir.WaitGroup, iteration):
        while len(self._groups) > stmt.pending:
            group = self._groups.popleft()
            for op in group.ops:
                op.land()
                self._retire(op)
            group.landed = True
        if iteration is None:
            return
        group = self._group_of_iteration.get(iteration)
        if group is not None and not group.landed:
            newer = len(self._groups) - 1 - list(self._groups).index(group)
            places = ", ".join(describe_place(a.buffer, a.box) for op in group.ops for a in op.accesses)
            raise HazardError(
                f"hazard in block {self.block}: wait does not cover iteration {iteration}: "
                f"T.wait_group({stmt.pending}) leaves the {stmt.pending} most recent commit groups in flight "
                f"and the group of iteration {iteration} ({places or 'no copies'}) is one of them "
                f"({newer} committed after it)\n"
                f"  statement: {describe_stmt(stmt)}\n"
                f"  in flight: {group.ops[0].describe() if group.ops else describe_stmt(group.commit)}")

    # ------------------------------------------------------------------ gemms
    def issue_mma(self, stmt: ir.Gemm, operands: list, accumulator: tuple):
        """`operands`: [(buffer, box)] read by the gemm; `accumulator`: (buffer, box)."""
        op = _AsyncOp(stmt)
        for buffer, box in operands:
            self._add(op, buffer, box, "operand")
        self._add(op, accumulator[0], accumulator[1], "accumulator")
        self._mmas.append(op)

    def wait_mma(self, stmt: ir.WaitMMA):
        while len(self._mmas) > stmt.pending:
            self._retire(self._mmas.popleft())

    # ------------------------------------------------------------------ end of kernel
    def check_drained(self):
        pending = [op for group in self._groups for op in group.ops] + self._open + list(self._mmas)
        if pending:
            op = pending[0]
            access = op.accesses[-1] if op.land is None else op.accesses[0]
            what = "an async copy into" if op.land is not None else "an async T.gemm on"
            raise HazardError(
                f"hazard in block {self.block}: the kernel ends with {what} "
                f"{describe_place(access.buffer, access.box)} still in flight "
                f"({len(pending)} async operation(s) never waited for; the schedule must drain with "
                f"T.wait_group(0) / T.wait_mma(0))\n"
                f"  in flight: {op.describe()}")

    # ------------------------------------------------------------------ bookkeeping
    def _add(self, op: _AsyncOp, buffer: ir.Buffer, box: tuple, role: str):
        access = _Access(buffer, box, role, op)
        op.accesses.append(access)
        self._by_buffer.setdefault(buffer, []).append(access)

    def _retire(self, op: _AsyncOp):
        for access in op.accesses:
            self._by_buffer[access.buffer].remove(access)
