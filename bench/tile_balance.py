"""How evenly do persistent programs share the benchmark's tiles?  A CPU-only count, for the
gap statements: each program's work under lowering/persistent_tiles.py's two ways of dealing
tiles - the rounds (`round_loads`: tile = round * P + pid, rounds alternating direction) and
the schedule table (`deal_longest_first`, used for tiles of different costs) - against the
mean, and a greedy longest-first assignment of all tiles at once (no windows: what balance
alone could reach, ignoring L2), in units of one key/K-block iteration.

A tile's cost is its pipelined loop's trip count: K / block_K for the GEMM, S / block_N for
attention, and for causal attention (row block bx of 128 rows, 128-key blocks) bx + 1.
Run: PYTHONPATH=$PWD python bench/tile_balance.py
"""
from __future__ import annotations

import heapq
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tritile.lowering.persistent_tiles import deal_longest_first, round_loads  # noqa: E402

P = 132  # H100 SMs


def longest_first_makespan(costs: list, programs: int = P) -> int:
    heap = [(0, p) for p in range(programs)]
    for cost in sorted(costs, reverse=True):
        load, p = heapq.heappop(heap)
        heapq.heappush(heap, (load + cost, p))
    return max(load for load, _ in heap)


def main():
    cases = {  # name -> (tile costs in launch order, tiles in a row of the first grid dim)
        "GEMM 4096^3, 128x256 tiles": ([4096 // 64] * (32 * 16), 16),
        "GEMM 8192^3, 128x256 tiles": ([8192 // 64] * (64 * 32), 32),
        "attention 4x32x4096x128": ([32] * (4 * 32 * 32), 32),
        "attention 4x32x4096x128 causal": ([bx + 1 for _ in range(4 * 32) for bx in range(32)], 32),
    }
    print(f"{'case':34s} {'tiles':>6s} {'rounds':>7s} {'rounds/mean':>12s} {'table/mean':>11s} "
          f"{'longest-first/mean':>19s}")
    for name, (costs, row) in cases.items():
        mean = sum(costs) / P
        table = max(sum(costs[t] for t in tiles) for tiles in deal_longest_first(costs, P, row))
        print(f"{name:34s} {len(costs):6d} {len(costs) / P:7.2f} {max(round_loads(costs, P)) / mean:12.3f} "
              f"{table / mean:11.3f} {longest_first_makespan(costs) / mean:19.3f}")


if __name__ == "__main__":
    main()
