"""mbarriers of explicit warp specialization (`ir.AllocBarrier`, `ir.BarrierArrive`,
`ir.BarrierWait`) in the reference interpreter.

The interpreter runs a block's warp groups (`ir.WarpGroups`) one after another in program
order, so a barrier's state is exact: per mbarrier the arrivals of the current phase and the
number of completed phases.  Contract: an arrival adds the threads running the statement (the
enclosing `T.ws` groups' threads, else the kernel's); the phase completes when they reach the
arrive count; more arrivals than a phase expects is an error (the counts do not match the
threads).  A wait for parity p returns when the phase of parity p has completed, i.e. the
completed phase count's parity differs from p; a wait that program order cannot satisfy
would hang on the GPU too unless another warp group arrives concurrently, which the program
order already ran: it is reported as an error (a deadlock, or a schedule the interpreter's
serial order cannot show correct).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _MBarrier:
    arrive_count: int
    arrived: int = 0
    phases: int = 0  # completed phases


class Barriers:
    """The mbarriers of one thread block."""

    def __init__(self):
        self._state = {}

    def allocate(self, buffer, arrive_counts):
        self._state[buffer] = [_MBarrier(c) for c in arrive_counts]

    def _get(self, buffer, index: int) -> _MBarrier:
        bars = self._state.get(buffer)
        if bars is None:
            raise ValueError(f"barrier {buffer.name} is used before T.alloc_barrier")
        if not 0 <= index < len(bars):
            raise ValueError(f"barrier index {index} is out of range for {buffer.name} ({len(bars)} mbarriers)")
        return bars[index]

    def arrive(self, buffer, index: int, threads: int):
        bar = self._get(buffer, index)
        if bar.arrived + threads > bar.arrive_count:
            raise ValueError(f"{threads} threads arrive at {buffer.name}[{index}], whose phase expects "
                             f"{bar.arrive_count} arrivals and has {bar.arrived} already")
        bar.arrived += threads
        if bar.arrived == bar.arrive_count:
            bar.arrived = 0
            bar.phases += 1

    def wait(self, buffer, index: int, parity: int):
        if parity not in (0, 1):
            raise ValueError(f"T.barrier_wait parity must be 0 or 1, got {parity}")
        bar = self._get(buffer, index)
        if bar.phases % 2 == parity:
            raise ValueError(f"T.barrier_wait({buffer.name}[{index}], {parity}) never returns in program order: "
                             f"{bar.phases} phase(s) completed, {bar.arrived} of {bar.arrive_count} arrivals in the "
                             f"current one (a deadlock, or a schedule that needs warp groups to run concurrently)")
