"""How evenly do persistent programs share the benchmark's tiles?  A CPU-only count, for the
gap statements: each program's work under tritile's persistent schedule
(lowering/persistent_tiles.py: tile = round * P + pid, rounds alternating direction) against
the mean and against a greedy longest-first assignment (what a host-computed schedule table
could reach), in units of one key/K-block iteration.

A tile's cost is its pipelined loop's trip count: K / block_K for the GEMM, S / block_N for
attention, and for causal attention (row block bx of 128 rows, 128-key blocks) bx + 1.
Run: python bench/tile_balance.py
"""
from __future__ import annotations

import heapq

P = 132  # H100 SMs


def persistent_loads(costs: list, programs: int = P) -> list:
    loads = [0] * programs
    for tile, cost in enumerate(costs):
        round_, pos = divmod(tile, programs)
        loads[pos if round_ % 2 == 0 else programs - 1 - pos] += cost
    return loads


def longest_first_makespan(costs: list, programs: int = P) -> int:
    heap = [(0, p) for p in range(programs)]
    for cost in sorted(costs, reverse=True):
        load, p = heapq.heappop(heap)
        heapq.heappush(heap, (load + cost, p))
    return max(load for load, _ in heap)


def main():
    cases = {
        "GEMM 4096^3, 128x256 tiles": [4096 // 64] * (32 * 16),
        "GEMM 8192^3, 128x256 tiles": [8192 // 64] * (64 * 32),
        "attention 4x32x4096x128": [32] * (4 * 32 * 32),
        "attention 4x32x4096x128 causal": [bx + 1 for _ in range(4 * 32) for bx in range(32)],
    }
    print(f"{'case':34s} {'tiles':>6s} {'rounds':>7s} {'busiest/mean':>13s} {'longest-first/mean':>19s}")
    for name, costs in cases.items():
        mean = sum(costs) / P
        busiest = max(persistent_loads(costs))
        print(f"{name:34s} {len(costs):6d} {len(costs) / P:7.2f} {busiest / mean:13.3f} "
              f"{longest_first_makespan(costs) / mean:19.3f}")


if __name__ == "__main__":
    main()
