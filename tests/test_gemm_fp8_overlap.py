"""examples/gemm_fp8.py's overlapped promotion (issue #19): `overlap_promotion="k_pairs"` (the
k-steps in pairs), `"n_halves"` (each k-step as two gemms over the halves of the tile's columns)
and `"n_pieces"` (any number of column pieces through fewer partial fragments) promote every
k-step as `promote_every=1` does - the same partials added in the same order, so the interpreter
gives bit-identical results - and on sm_90 each warpgroup issues its two wgmma groups back to
back and adds the first partial while the second group runs.  The n_pieces kernels of
bench/gemm_fp8_h100.py's sweep compile for sm_90 without serialized wgmmas."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from tritile.runtime.kernel import JITKernel
from tritile.runtime.target import Target

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_consumer_partitions import ptxas_advisories  # noqa: E402
from test_warp_specialization import function  # noqa: E402

from examples.gemm_fp8 import TILE_128X128_HALVES, gemm_fp8, quantize  # noqa: E402

H100 = Target("cuda", 90)
OVERLAPS = ["k_pairs", "n_halves"]
# the interpreter's tiles; 4 stages of single k-steps, or 2 of pairs: four k-steps in shared memory
CPU_TILES = dict(block_M=32, block_N=32, block_K=32, threads=128, promote_every=1)
STAGES = {None: 4, "k_pairs": 2, "n_halves": 4}


def operands(M, N, K, seed, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    a8, sa = quantize(torch.randn(M, K, generator=gen))
    b8, sb = quantize(torch.randn(N, K, generator=gen))
    scales = torch.stack([sa.float().reshape(()), sb.float().reshape(())])
    exact = (a8.double() @ b8.double().t()) * (sa.double() * sb.double())
    return a8.to(device), b8.to(device), scales.to(device), exact


@pytest.mark.parametrize("overlap", OVERLAPS)
@pytest.mark.parametrize("M, N, K", [(64, 64, 256), (64, 96, 160), (40, 64, 96)])  # odd k-steps, ragged M
def test_overlapped_promotion_adds_the_same_partials_in_the_same_order(overlap, M, N, K):
    """Interpreter: the overlapped kernel equals the kernel promoting every k-step bit for bit
    (an odd number of k-steps included: the pair's odd tile past K loads zeros), and the fp64
    product of the same fp8 values within fp16's rounding."""
    a8, b8, scales, exact = operands(M, N, K, seed=M + N + K)
    every_step = gemm_fp8(M, N, K, **CPU_TILES, num_stages=STAGES[None])(a8, b8, scales)
    overlapped = gemm_fp8(M, N, K, **CPU_TILES, num_stages=STAGES[overlap], overlap_promotion=overlap)(a8, b8, scales)
    assert torch.equal(overlapped, every_step)
    torch.testing.assert_close(overlapped.double(), exact, rtol=1e-2, atol=1e-2 * exact.abs().max().item())


# (pieces, partials): DeepGEMM's one piece; two pieces through one partial (128x256's three
# accumulators); four through two in turn; n_halves
PIECES = [(1, 1), (2, 1), (4, 2), (2, 2)]


@pytest.mark.parametrize("pieces, partials", PIECES)
@pytest.mark.parametrize("M, N, K", [(64, 128, 256), (40, 64, 160)])  # odd k-steps, ragged M
def test_column_pieces_add_the_same_partials_in_the_same_order(pieces, partials, M, N, K):
    """Interpreter: each k-step as `pieces` gemms over the tile's columns, through `partials`
    fragments, equals promoting every k-step bit for bit, and the fp64 product within fp16."""
    a8, b8, scales, exact = operands(M, N, K, seed=M + N + K + pieces)
    tiles = {**CPU_TILES, "block_N": 64}
    every_step = gemm_fp8(M, N, K, **tiles, num_stages=STAGES[None])(a8, b8, scales)
    pieced = gemm_fp8(M, N, K, **tiles, num_stages=3, overlap_promotion="n_pieces", pieces=pieces,
                      partials=partials)(a8, b8, scales)
    assert torch.equal(pieced, every_step)
    torch.testing.assert_close(pieced.double(), exact, rtol=1e-2, atol=1e-2 * exact.abs().max().item())


@pytest.mark.parametrize("promote_every", [2, 3])
def test_column_pieces_promoting_every_few_steps_match_the_default_program(promote_every):
    """Interpreter: two pieces, each partial kept over `promote_every` k-steps (5 k-steps: a
    remainder after the last promotion), equal the one-gemm program promoting as often."""
    M, N, K = 64, 64, 160
    a8, b8, scales, exact = operands(M, N, K, seed=promote_every)
    config = {**CPU_TILES, "num_stages": 3, "promote_every": promote_every}
    whole = gemm_fp8(M, N, K, **config)(a8, b8, scales)
    pieced = gemm_fp8(M, N, K, **config, overlap_promotion="n_pieces", pieces=2, partials=2)(a8, b8, scales)
    assert torch.equal(pieced, whole)
    torch.testing.assert_close(pieced.double(), exact, rtol=1e-2, atol=1e-2 * exact.abs().max().item())


@pytest.mark.parametrize("changes, message", [
    (dict(overlap_promotion="k_pairs", promote_every=2), "promote_every must be 1"),
    (dict(overlap_promotion="m_halves"), "overlap_promotion must be one of"),
    (dict(overlap_promotion="n_halves", block_N=48 + 1), "pieces must be a positive divisor of block_N=49"),
    (dict(overlap_promotion="n_pieces", pieces=3), "pieces must be a positive divisor of block_N=32"),
    (dict(overlap_promotion="n_pieces", pieces=0), "pieces must be a positive divisor"),
    (dict(overlap_promotion="n_pieces", pieces=2, partials=3), "partials must be an int from 1 to pieces=2"),
    (dict(overlap_promotion="n_pieces", pieces=2, partials=1, promote_every=2), "partials must be pieces=2, not 1"),
    (dict(overlap_promotion="n_halves", pieces=4), "pieces and partials are overlap_promotion='n_pieces' settings"),
])
def test_overlap_promotion_arguments(changes, message):
    config = {**CPU_TILES, "num_stages": 2, **changes}
    with pytest.raises(ValueError, match=message):
        gemm_fp8.fn(64, 64, 128, **config)


# ------------------------------------------------------------------ generated code (sm_90, CPU)


def cuda_kernel(overlap, stages):
    """The example's CUDA tiles (128x128x128, two consumer warpgroups) with `overlap`, for sm_90."""
    config = {**TILE_128X128_HALVES, "num_stages": stages, "overlap_promotion": overlap}
    return JITKernel(gemm_fp8(1024, 1024, 4096, **config).stages[0][1], target=H100)


def loop_body(source: str, header: str) -> str:
    """The lines of the loop `header` starts in generated `source`, up to its first dedent."""
    lines = source[source.index(header):].splitlines()
    indent = len(lines[1]) - len(lines[1].lstrip())
    body = lines[1:]
    end = next((n for n, line in enumerate(body) if line.strip() and len(line) - len(line.lstrip()) < indent), len(body))
    return "\n".join(body[:end])


def ptx_loop(ptx: str) -> str:
    """The PTX of the first consumer's k-loop: from its first wgmma to the loop's back branch."""
    start = ptx.index("wgmma.mma_async")
    return ptx[start:ptx.index("bra", ptx.index("wgmma.wait_group.sync.aligned 0", start))]


def order(ptx_text: str) -> list:
    """The loop's wgmma groups, waits and additions in order, each run counted:
    [("wgmma", 4), ("commit", 1), ..., ("wait 1", 1), ("add", 64), ...]."""
    runs = []
    for line in ptx_text.splitlines():
        line = line.strip()
        kind = ("wgmma" if line.startswith("wgmma.mma_async") else "commit" if line.startswith("wgmma.commit_group")
                else f"wait {line.split()[-1].rstrip(';')}" if line.startswith("wgmma.wait_group")
                else "add" if line.startswith("add.f32") else None)
        if kind is None:
            continue
        if runs and runs[-1][0] == kind:
            runs[-1] = (kind, runs[-1][1] + 1)
        else:
            runs.append((kind, 1))
    return runs


def assert_pipelined_and_replayable(kernel, source: str, ptx: str, spill_free: bool) -> None:
    """ptxas keeps the wgmmas pipelined (no C75xx advisory), spills nothing where `spill_free`,
    and the generated mbarrier protocol, replayed, has no dead wait."""
    from pipeline_programs import mbarrier_problems

    advisories = ptxas_advisories(ptx)
    assert not [line for line in advisories if "C75" in line or "serialized" in line], advisories
    if spill_free:
        assert "0 bytes spill stores" in "\n".join(advisories), advisories
    args = [torch.zeros(p.shape, dtype=p.dtype.torch) for p in kernel.func.params]
    assert mbarrier_problems(source, args) == []


@pytest.mark.usefixtures("gluon_backend")
@pytest.mark.parametrize("overlap, stages, spill_free", [("k_pairs", 2, True), ("n_halves", 3, True),
                                                       ("n_halves", 4, False)])
def test_generated_schedule_adds_one_partial_under_the_other_wgmma(overlap, stages, spill_free, monkeypatch):
    """Each consumer warpgroup issues both wgmma groups of an iteration back to back, retires
    only the first (`wait(1)`) before adding its partial - 64 FADDs per thread (k_pairs'
    128-column partial; n_halves' two 64-column partials make 32 each) - while the second runs,
    then waits for the second and adds it.  ptxas keeps the wgmmas pipelined (no advisory), and
    k_pairs on 2 stages and n_halves on 3 without spills (n_halves on 4 spills a few registers:
    bench/NOTES.md); the mbarrier protocol replayed with the partitions running concurrently has
    no dead wait."""
    monkeypatch.delenv("TRITILE_CONSUMER_PARTITIONS", raising=False)
    monkeypatch.delenv("TRITILE_WARP_SPECIALIZE", raising=False)
    kernel = cuda_kernel(overlap, stages)
    source, ptx = kernel.get_source("gluon"), kernel.get_source("ptx")
    steady = loop_body(function(source, "main_consumer"), "for k_t in range(")
    first, second = (m.start() for m in re.finditer(r"= warpgroup_mma\(", steady))
    added = "total"
    assert first < second < steady.index("warpgroup_mma_wait(num_outstanding=1") < steady.index(f"{added} = ({added} +")
    per_add = 64 if overlap == "k_pairs" else 32
    assert order(ptx_loop(ptx)) == [("wgmma", 4), ("commit", 1), ("wgmma", 4), ("commit", 1), ("wait 1", 1),
                                    ("add", per_add), ("wait 0", 1), ("add", per_add)]
    assert_pipelined_and_replayable(kernel, source, ptx, spill_free)


@pytest.mark.gpu
@pytest.mark.parametrize("overlap", OVERLAPS)
def test_overlapped_promotion_on_the_gpu_is_as_accurate_as_every_step(overlap):
    """CUDA (the example's tiles): the overlapped kernel's largest error against the fp64 product
    is that of promoting every k-step (the same partial sums; n_halves' n64 wgmmas may round a
    partial differently from n128's, hence the 10 % margin)."""
    M = N = 1024
    K = 4096
    a8, b8, scales, exact = operands(M, N, K, seed=7, device="cuda")
    one_step_per_stage = {**TILE_128X128_HALVES, "num_stages": STAGES[None], "overlap_promotion": None}
    every_step = gemm_fp8(M, N, K, **one_step_per_stage)(a8, b8, scales).cpu().double()
    config = {**TILE_128X128_HALVES, "num_stages": STAGES[overlap], "overlap_promotion": overlap}
    overlapped = gemm_fp8(M, N, K, **config)(a8, b8, scales).cpu().double()
    top = exact.abs().max().item()
    error, reference_error = ((c - exact).abs().max().item() / top for c in (overlapped, every_step))
    assert error <= 1.1 * reference_error, (error, reference_error)
    torch.testing.assert_close(overlapped, exact, rtol=1e-2, atol=1e-2 * top)


# bench/gemm_fp8_h100.py's SWEEP kernels (the example's CUDA tiles with these changes; at
# 1024x1024x4096, which ptxas allocates as the timed 4096^3 and 8192^3: the shape is in the
# coordinates only): spill-free where the probe found them so (the four-warpgroup tile keeps one register's
# spill per k-step in three consumers: only its wgmmas are checked)
SWEEP_KERNELS = {
    "w1-6st": (dict(num_stages=6, overlap_promotion="n_pieces", pieces=1, partials=1), True),
    "128x256-h1-4st": (dict(block_N=256, num_stages=4, overlap_promotion="n_pieces", pieces=2, partials=1), True),
    "256x128-4wg-h1-4st": (dict(block_M=256, threads=512, num_stages=4, overlap_promotion="n_pieces", pieces=2,
                                partials=1), False),
    "p2-n_halves-5st": (dict(num_stages=5, overlap_promotion="n_pieces", pieces=2, partials=2, promote_every=2), True),
}


@pytest.mark.usefixtures("gluon_backend")
@pytest.mark.parametrize("name", list(SWEEP_KERNELS))
def test_sweep_kernels_keep_their_wgmmas_pipelined(name, monkeypatch):
    """sm_90 (CPU): split in one consumer partition per warpgroup behind a producer warp, folded,
    ptxas keeps the wgmmas pipelined (no C75xx advisory) and - but for the four-warpgroup tile -
    spills nothing; the mbarrier protocol replayed with the partitions running concurrently has
    no dead wait."""
    for switch in ("TRITILE_WARP_SPECIALIZE", "TRITILE_CONSUMER_PARTITIONS", "TRITILE_FOLD_CONSUMER"):
        monkeypatch.delenv(switch, raising=False)
    changes, spill_free = SWEEP_KERNELS[name]
    config = {**TILE_128X128_HALVES, **changes}
    kernel = JITKernel(gemm_fp8(1024, 1024, 4096, **config).stages[0][1], target=H100)
    source, ptx = kernel.get_source("gluon"), kernel.get_source("ptx")
    warpgroups = config["threads"] // 128
    assert source.count("(main_consumer, ") == warpgroups and "(main_producer, " in source
    assert_pipelined_and_replayable(kernel, source, ptx, spill_free)
