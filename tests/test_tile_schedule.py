"""Persistent tiles dealt from a schedule table (lowering/persistent_tiles.py,
`balanced_schedule`): tiles whose pipelined loop runs a different number of iterations go,
longest first within windows, to the program with the least work so far; the kernel reads its
share from a `ConstTable`.

Hypothesis generates GEMM-like programs whose K loop's trip count depends on the tile (a
"staircase": ``min((bx * a + by * b) % m + 1, K / block_K)`` K blocks), with random grids,
stage counts, program counts, and a producer warp or not, and checks:

* interpreter(original) == interpreter(persistent) == torch, with every output element written;
* the table deals every tile exactly once, and its busiest program has no more work than the
  alternating rounds would give it (else no table is made);
* with a producer warp, the generated module's mbarrier protocol replays clean on the host
  (partitions interleaved under several schedules) with the table's tile order.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tritile.language as T
from tritile.codegen.gluon import emit_module
from tritile.interpreter import execute
from tritile.ir import nodes as ir
from tritile.ir.transform import walk
from tritile.lowering import run_passes
from tritile.lowering.persistent_tiles import persist
from tritile.runtime.target import Target

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_programs import mbarrier_problems  # noqa: E402

H100 = Target("cuda", 90)
BM, BN, BK = 64, 32, 16


def staircase_matmul(grid_n, grid_m, k_blocks, stages, a, b, m):
    """C[tile] = A[rows, :n * BK] @ B[:n * BK, cols] with n = min((bx * a + by * b) % m + 1,
    k_blocks) for the tile at column block bx, row block by."""
    M, N, K = grid_m * BM, grid_n * BN, k_blocks * BK

    @T.prim_func
    def staircase(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"),
                  C: T.Tensor((M, N), "float32")):
        with T.Kernel(grid_n, grid_m, threads=128) as (bx, by):
            A_shared = T.alloc_shared((BM, BK), "float16")
            B_shared = T.alloc_shared((BK, BN), "float16")
            C_local = T.alloc_fragment((BM, BN), "float32")
            T.clear(C_local)
            for k in T.Pipelined(T.min((bx * a + by * b) % m + 1, k_blocks), num_stages=stages):
                T.copy(A[by * BM, k * BK], A_shared)
                T.copy(B[k * BK, bx * BN], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * BM, bx * BN])

    return staircase


def staircase_reference(A, B, grid_n, grid_m, k_blocks, a, b, m):
    C = torch.empty(A.shape[0], B.shape[1])
    for by in range(grid_m):
        for bx in range(grid_n):
            n = min((bx * a + by * b) % m + 1, k_blocks) * BK
            C[by * BM:(by + 1) * BM, bx * BN:(bx + 1) * BN] = \
                A[by * BM:(by + 1) * BM, :n].float() @ B[:n, bx * BN:(bx + 1) * BN].float()
    return C


def schedule_table(func) -> tuple:
    return next((n.table.values for n in walk(func.kernel.body) if isinstance(n, ir.TableRead)), ())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(grid_n=st.integers(2, 8), grid_m=st.integers(1, 4), k_blocks=st.integers(2, 6), stages=st.integers(1, 3),
       a=st.integers(1, 3), b=st.integers(0, 2), m=st.integers(3, 6), programs=st.integers(2, 5),
       producer=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_staircase_tiles_dealt_from_a_table_keep_their_values(grid_n, grid_m, k_blocks, stages, a, b, m, programs,
                                                              producer, seed):
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("TRITILE_PERSISTENT", "0")
        mp.setenv("TRITILE_WARP_SPECIALIZE", "1" if producer else "0")
        func = staircase_matmul(grid_n, grid_m, k_blocks, stages, a, b, m)
        persistent = persist(run_passes(func, H100)[-1][1], programs)
    finally:
        mp.undo()
    tiles = grid_n * grid_m
    table = schedule_table(persistent)
    if table:
        stride = (len(table) - programs) // programs
        dealt = [table[programs + p * stride:programs + p * stride + table[p]] for p in range(programs)]
        assert sorted(t for share in dealt for t in share) == list(range(tiles))

        def cost(t):  # K blocks + 1, as the pass counts a tile
            return min(((t % grid_n) * a + (t // grid_n) * b) % m + 1, k_blocks) + 1
        rounds = [0] * programs
        for t in range(tiles):
            round_, place = divmod(t, programs)
            rounds[programs - 1 - place if round_ % 2 else place] += cost(t)
        assert max(sum(cost(t) for t in share) for share in dealt) < max(rounds)
    torch.manual_seed(seed)
    A = torch.randn(grid_m * BM, k_blocks * BK, dtype=torch.float16)
    B = torch.randn(k_blocks * BK, grid_n * BN, dtype=torch.float16)
    ref = staircase_reference(A, B, grid_n, grid_m, k_blocks, a, b, m)
    for f in (func, persistent):
        C = torch.full((grid_m * BM, grid_n * BN), float("nan"))
        execute(f, [A, B, C], {})
        torch.testing.assert_close(C, ref, rtol=1e-3, atol=1e-3)
    if producer and "warp_specialization" in persistent.attrs and table:
        source = emit_module(persistent, H100).source
        assert "gl.load(tile_schedule + pid)" in source
        args = [torch.zeros(p.shape, dtype=p.dtype.torch) for p in persistent.params]
        assert mbarrier_problems(source, args) == []


def test_a_staircase_gets_a_table_and_its_kernel_compiles(monkeypatch):
    """6 x 3 staircase tiles of 1 to 5 K blocks on 4 programs, with a producer warp: the sm_90
    kernel reads the table in both partitions and compiles to PTX with wgmma."""
    from tritile.codegen.gluon import compile_kernel

    monkeypatch.setenv("TRITILE_PERSISTENT", "0")
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "1")
    persistent = persist(run_passes(staircase_matmul(6, 3, 5, 2, 1, 1, 5), H100)[-1][1], 4)
    assert "warp_specialization" in persistent.attrs and schedule_table(persistent)
    kernel = compile_kernel(persistent, H100)
    assert kernel.source.count("range(0, gl.load(tile_schedule + pid))") == 2  # consumer and producer
    assert kernel.tables[0][0] == "tile_schedule" and "wgmma.mma_async" in kernel.asm["ptx"]


def test_trip_counts_read_from_memory_keep_the_rounds(monkeypatch):
    """A K loop whose trip count the kernel reads from a tensor has no compile-time cost: the
    tiles are dealt in rounds, and the values still match torch."""
    grid_n, k_blocks = 6, 4
    N, K = grid_n * BN, k_blocks * BK

    @T.prim_func
    def ragged(A: T.Tensor((BM, K), "float16"), B: T.Tensor((K, N), "float16"), Lens: T.Tensor((grid_n,), "int32"),
               C: T.Tensor((BM, N), "float32")):
        with T.Kernel(grid_n, threads=128) as bx:
            A_shared = T.alloc_shared((BM, BK), "float16")
            B_shared = T.alloc_shared((BK, BN), "float16")
            C_local = T.alloc_fragment((BM, BN), "float32")
            T.clear(C_local)
            for k in T.Pipelined(Lens[bx], num_stages=2):
                T.copy(A[0, k * BK], A_shared)
                T.copy(B[k * BK, bx * BN], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[0, bx * BN])

    monkeypatch.setenv("TRITILE_PERSISTENT", "0")
    persistent = persist(run_passes(ragged, H100)[-1][1], 4)
    assert persistent.attrs["persistent_programs"] == 4 and schedule_table(persistent) == ()
    torch.manual_seed(0)
    A, B = torch.randn(BM, K, dtype=torch.float16), torch.randn(K, N, dtype=torch.float16)
    lens = torch.tensor([1, 4, 2, 3, 4, 1], dtype=torch.int32)
    C = torch.full((BM, N), float("nan"))
    execute(persistent, [A, B, lens, C], {})
    for bx, n in enumerate(lens.tolist()):
        ref = A[:, :n * BK].float() @ B[:n * BK, bx * BN:(bx + 1) * BN].float()
        torch.testing.assert_close(C[:, bx * BN:(bx + 1) * BN], ref, rtol=1e-3, atol=1e-3)
