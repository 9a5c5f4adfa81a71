"""Persistent tiles for warp-specialized kernels (lowering/persistent_tiles.py with
codegen/gluon/warp_specialize.py): one program per SM walks the tiles, each consumer partition
and the producer in the same order; the ring's phase continues across tiles through a running
count of the groups committed so far, so tiles may have different trip counts (causal
attention's row blocks).

CPU: the rewrite (the tile loop inside the consumer partitions), interpreter(persistent) ==
torch for programs that each run several tiles of different lengths, and the generated sm_90
partitions.  GPU: the persistent kernels against torch, with few programs (several tiles each).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from tritile.interpreter import execute
from tritile.ir import nodes as ir
from tritile.ir.transform import walk
from tritile.lowering import run_passes
from tritile.lowering.persistent_tiles import applicable, persist
from tritile.runtime.target import Target

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_warp_specialization import attention_ir, function, gemm_ir, manual_schedule_ir  # noqa: E402

H100 = Target("cuda", 90)


def split_attention(causal, seq, batch=1, heads=2, programs=None, monkeypatch=None):
    """The example's attention lowered for sm_90 with the split, then made persistent on
    `programs` programs (None: the pass list's own choice: 132 on a CPU machine)."""
    from examples.flash_attention import flashattn, tile_config

    monkeypatch.setenv("TRITILE_PERSISTENT", "0" if programs else "auto")
    func = flashattn(batch, heads, seq, seq, 128, causal, **tile_config("cuda")).stages[0][1]
    lowered = run_passes(func, H100)[-1][1]
    return persist(lowered, programs) if programs else lowered


def reference(q, k, v, causal):
    from examples.flash_attention import ref_program

    return ref_program(q, k, v, causal)


def test_a_persistent_kernel_is_not_persisted_twice(monkeypatch):
    func = split_attention(True, 1024, monkeypatch=monkeypatch)
    with pytest.raises(ValueError, match="already walks its tiles on 132 programs"):
        persist(func, 5)


def test_split_kernel_walks_the_tiles_inside_its_partitions(monkeypatch):
    func = split_attention(True, 1024, monkeypatch=monkeypatch)
    assert func.attrs["persistent_programs"] == 132 and len(func.kernel.grid) == 1
    split = [s for s in func.kernel.body.stmts if isinstance(s, ir.ConsumerPartitions)]
    assert len(split) == 1 and [type(s) for s in func.kernel.body.stmts[:-1]] == [ir.Alloc] * 4
    tile_loop = split[0].body.stmts[0]
    assert isinstance(tile_loop, ir.For) and tile_loop.var is func.attrs["persistent_tile_loop"]
    # launch order: the row block varies fastest, then the head, then the batch
    lets = [s for s in tile_loop.body.stmts[:4] if isinstance(s, ir.Let)]
    assert [s.var.name for s in lets] == ["tile", "bx", "by", "bz"]


def test_kept_plain_when_its_buffers_fit_only_by_reusing_bytes(monkeypatch):
    """GQA backward at head dim 192 fits the H100 because its epilogue tiles reuse its loop's
    bytes (ir/shared_lifetimes.py); hoisted above a tile loop they would all be live at once."""
    from test_kernels_gqa_bwd import example_tiles

    monkeypatch.setenv("TRITILE_PERSISTENT", "1")
    for epilogue in ("split", "atomic"):
        func = run_passes(example_tiles(epilogue).stages[0][1], H100)[-1][1]
        assert "persistent_tile_loop" not in func.attrs, epilogue
    func = run_passes(gemm_ir(), H100)[-1][1]  # its buffers fit all at once: made persistent
    assert "persistent_tile_loop" in func.attrs


def test_refused_when_a_ring_buffer_is_used_before_its_loop(monkeypatch):
    """The consumers release a slot only from the loop on: a kernel touching the ring's
    buffers before its first copy would let the producer overwrite them, so it stays as is."""
    import tritile
    import tritile.language as T

    @T.prim_func
    def warm_start(X: T.Tensor((256, 64), "float16"), W: T.Tensor((512, 64), "float16"),
                   Y: T.Tensor((256, 64), "float32")):
        with T.Kernel(2, threads=256) as bx:
            X_shared = T.alloc_shared((128, 64), "float16")
            W_shared = T.alloc_shared((64, 64), "float16")
            S = T.alloc_fragment((128, 64), "float32")
            T.copy(X[bx * 128:(bx + 1) * 128, :], X_shared)
            T.copy(W[0:64, :], W_shared)  # the ring's buffer, before the ring
            T.gemm(X_shared, W_shared, S, transpose_B=True, clear_accum=True)
            for j in T.Pipelined(8, num_stages=2):
                T.copy(W[j * 64:(j + 1) * 64, :], W_shared)
                T.gemm(X_shared, W_shared, S, transpose_B=True)
            T.copy(S, Y[bx * 128:(bx + 1) * 128, :])

    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "1")
    func = run_passes(tritile.compile(warm_start, out_idx=[2], target="cuda:90").stages[0][1], H100)[-1][1]
    assert "warp_specialization" in func.attrs and not applicable(func)
    assert "persistent_tile_loop" not in func.attrs


@pytest.mark.parametrize("causal, programs", [(False, 3), (True, 3), (True, 5)])
def test_interpreter_runs_every_tile_once(causal, programs, monkeypatch):
    """2 heads x 4 row blocks on fewer programs: each program runs 2-3 tiles, causal ones of
    1 to 4 key blocks; every output row is written (the output starts as NaN)."""
    func = split_attention(causal, 512, programs=programs, monkeypatch=monkeypatch)
    # causal tiles on 5 programs are dealt from a schedule table (on 3 the rounds do as well)
    assert bool(_schedule_table(func)) == (causal and programs == 5)
    torch.manual_seed(programs)
    q, k, v = (torch.randn(1, 2, 512, 128, dtype=torch.float16) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    execute(func, [q, k, v, out], {})
    torch.testing.assert_close(out.float(), reference(q, k, v, causal).float(), rtol=1e-2, atol=1e-2)


def _schedule_table(func) -> tuple:
    """The values of the tile schedule `func` deals its tiles from, or ()."""
    return next((n.table.values for n in walk(func.kernel.body) if isinstance(n, ir.TableRead)), ())


def _dealt(table: tuple, programs: int) -> list:
    """Each program's tiles, in the order it runs them, from a schedule table's values."""
    stride = (len(table) - programs) // programs
    return [list(table[programs + p * stride:programs + p * stride + table[p]]) for p in range(programs)]


def test_causal_tiles_are_dealt_evenly_from_a_schedule_table(monkeypatch):
    """The benchmark's causal shape on 132 programs: every tile is dealt once; the busiest
    program gets the mean work (key blocks, bx + 1 per tile, plus one per tile for its
    boundaries), where the alternating rounds give it 1.031x; each program takes its tiles
    window by window (4 heads of 32 row blocks), so the programs work on neighbouring heads
    at any time."""
    func = split_attention(True, 4096, batch=4, heads=32, monkeypatch=monkeypatch)
    assert func.attrs["persistent_programs"] == 132
    dealt = _dealt(_schedule_table(func), 132)
    assert sorted(t for tiles in dealt for t in tiles) == list(range(4 * 32 * 32))
    loads = [sum(t % 32 + 2 for t in tiles) for tiles in dealt]
    assert max(loads) <= 1.005 * sum(loads) / 132
    rounds = [0] * 132
    for t in range(4 * 32 * 32):
        round_, place = divmod(t, 132)
        rounds[131 - place if round_ % 2 else place] += t % 32 + 2
    assert max(rounds) >= 1.03 * sum(rounds) / 132
    assert all(tiles == sorted(tiles, key=lambda t: t // 128) for tiles in dealt)


def test_equal_tiles_keep_the_rounds(monkeypatch):
    """Non-causal tiles all cost the same: no table, the rounds' formula stays."""
    func = split_attention(False, 4096, batch=4, heads=32, monkeypatch=monkeypatch)
    assert func.attrs["persistent_programs"] == 132 and _schedule_table(func) == ()


def test_generated_partitions_continue_the_ring_across_tiles(monkeypatch):
    from tritile.codegen.gluon import compile_kernel

    kernel = compile_kernel(split_attention(True, 1024, programs=5, monkeypatch=monkeypatch), H100)
    source = kernel.source
    consumer, producer = function(source, "main_consumer"), function(source, "main_producer")
    # deferred PV: a tile of loop_range key blocks commits loop_range + 1 groups (V of g - 1 in group g)
    flips = ("k_t_bars_phase_bits = k_t_bars_phase_bits ^ ((((gl.maximum((loop_range + 1), 0) + 1) // 2) & 1) << 0"
             " | (((gl.maximum((loop_range + 1), 0) + 0) // 2) & 1) << 1)")
    for part in (consumer, producer):  # both walk the same tiles and keep the same phase bits
        assert "k_t_bars_phase_bits = gl.to_tensor(0)" in part and "for tile_iter in range(0, " in part
        assert flips in part
    # each tile's groups use slots g % 2 (the versions its copies fill); the consumers wait on
    # the slot's phase continued from earlier tiles, and release the last two groups of a
    # tile at its end, so that the producer refills them with the next tile's first groups
    assert ("mbarrier.wait(k_t_bars.index((k_t - 1) % 2), (((k_t - 1) // 2) ^ (k_t_bars_phase_bits >> "
            "((k_t - 1) % 2))) & 1") in consumer
    assert "in range(gl.maximum((loop_range + 1) - 2, 0), (loop_range + 1)):" in consumer
    assert re.search(r"mbarrier\.arrive\(k_t_bars_empty\.index\(_g\d+ % 2\)\)", consumer)
    # the epilogue's last step has no group of its own: it must not release (its arrival would
    # complete a phase of the next tile's slot; the host replay found that deadlock)
    assert ("mbarrier.arrive(k_t_bars_empty.index((gl.maximum(loop_range, 2) + 1) % 2), pred=((gl.maximum(loop_range, "
            "2) + 1) >= 2) & ((gl.maximum(loop_range, 2) + 1) < (loop_range + 1)))") in consumer
    # the producer refills a slot once it was released, also when an earlier tile used it
    assert ("mbarrier.wait(k_t_bars_empty.index(g % 2), (((g // 2) ^ (k_t_bars_phase_bits >> (g % 2))) & 1) ^ 1, "
            "pred=(g >= 2) | (k_t_bars_groups_seen > g % 2))") in producer
    assert "K_shared.index((g % 2))" in producer and "V_shared.index(((g - 1) % 2))" in producer
    assert "k_t_bars_groups_seen = gl.maximum(k_t_bars_groups_seen, (loop_range + 1))" in producer
    assert "min(((8 * 2) * 1), 5)" in source  # 16 tiles on 5 programs
    # ... dealt from a schedule table, which both partitions read; the runtime passes it
    for part in (consumer, producer):
        assert "for tile_iter in range(0, gl.load(tile_schedule + pid)):" in part
        assert "tile = gl.load(tile_schedule + ((5 + (pid * " in part
    assert "CONSTANT_TABLES = (('tile_schedule', (" in source and kernel.tables[0][0] == "tile_schedule"
    assert "wgmma.mma_async" in kernel.asm["ptx"]


# ------------------------------------------------------------------ GPU


@pytest.mark.parametrize("causal, programs, heads, seq, table", [
    (False, 5, 2, 1024, False), (True, 5, 2, 1024, False), (True, 3, 2, 1024, True), (True, 132, 2, 1024, False),
    (True, 132, 16, 4096, True)])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_persistent_split_attention_on_gpu(causal, programs, heads, seq, table, monkeypatch):
    """`table`: the tiles are dealt from a schedule table (else by alternating rounds)."""
    from tritile.codegen.gluon import compile_kernel

    func = split_attention(causal, seq, batch=2, heads=heads, programs=programs, monkeypatch=monkeypatch)
    assert bool(_schedule_table(func)) == table
    kernel = compile_kernel(func, H100)
    q, k, v = (torch.randn(2, heads, seq, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    kernel.launch([q, k, v, out], {})
    ref = reference(q, k, v, causal).float()
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())


PRODUCER_GEMMS = {"example_512": gemm_ir, "manual_012_012": lambda: manual_schedule_ir([0, 1, 2], [0, 1, 2]),
                  "manual_120_002": lambda: manual_schedule_ir([1, 2, 0], [0, 0, 2])}


@pytest.mark.parametrize("name", sorted(PRODUCER_GEMMS))
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_persistent_gemm_with_producer_warp_on_gpu(name, monkeypatch):
    """GEMMs with a producer warp (opt-in) made persistent on 3 programs: each runs several
    tiles, the producer loading the next tile's first stages under the current epilogue."""
    from tritile.codegen.gluon import compile_kernel

    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "1")
    monkeypatch.setenv("TRITILE_PERSISTENT", "0")
    func = PRODUCER_GEMMS[name]()
    lowered = run_passes(func, H100)[-1][1]
    assert "warp_specialization" in lowered.attrs
    kernel = compile_kernel(persist(lowered, 3), H100)
    assert "_producer" in kernel.source
    (M, K), (_, N) = [tuple(p.shape) for p in func.params[:2]]
    a, b = torch.randn(M, K, device="cuda", dtype=torch.float16), torch.randn(K, N, device="cuda", dtype=torch.float16)
    c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
    kernel.launch([a, b, c], {})
    ref = a.float() @ b.float()
    torch.testing.assert_close(c.float(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())
