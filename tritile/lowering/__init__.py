"""Lowering passes over the tile IR, one per module, run in the order of `PASSES`.

Each pass is ``fn(func: PrimFunc, target: Target) -> PrimFunc``; its module docstring states
what it assumes and what it guarantees.  The output of every pass is printable and
executable by the reference interpreter, and `tritile.ir.verifier.verify` runs after each.
`kernel.get_source(name)` shows the IR after the pass called `name`.
"""
from __future__ import annotations

import importlib

# (stage name, module under tritile.lowering); the module defines `run(func, target)`.
PASSES = [
    ("warp_group_serialization", "warp_group_serialization"),
    ("buffer_views", "buffer_views"),
    ("flat_reshapes", "flat_reshapes"),
    ("accumulator_init", "accumulator_init"),
    ("pipeline_planning", "pipeline_planning"),
    ("buffer_versioning", "buffer_versioning"),
    ("shared_slots", "shared_slots"),
    ("pipeline_injection", "pipeline_injection"),
    ("warp_specialization", "warp_specialization"),
    ("consumer_loop_folding", "consumer_loop_folding"),
    ("release_ahead", "release_ahead"),
    ("consumer_partitions", "consumer_partitions"),
    ("uniform_selects", "uniform_selects"),
    ("shared_memory_budget", "shared_memory_budget"),
    ("layout_inference", "layout_inference"),
    ("persistent_tiles", "persistent_tiles"),
]

PASS_NAMES = [name for name, _ in PASSES]


def run_passes(func, target, stop_after: str = None):
    """Run the pass list; returns [(stage name, func)] starting with ("tile", frontend IR)."""
    from tritile.ir.verifier import verify

    stages = [("tile", func)]
    for name, module in PASSES:
        fn = importlib.import_module(f"tritile.lowering.{module}").run
        func = fn(func, target)
        verify(func, stage=name)
        stages.append((name, func))
        if name == stop_after:
            break
    return stages
