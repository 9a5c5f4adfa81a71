"""lowering/consumer_loop_folding.py: a warp-specialized pipeline's epilogue run as D more steps
of its steady-state loop (its copies guarded to the n iterations), so the consumers emit each
wgmma of the loop once.

* random pipelined GEMM programs (sibling loops, runtime and short trip counts, manual stage /
  order schedules whose copies run at different stages, FP8-style promotion, persistent tile
  loops over several tiles) given a producer warp: the folded IR computes the reference
  result on the interpreter, and the generated module's mbarrier protocol replays clean;
* the example kernels on sm_90: the FP8 GEMM (5 stages, k_pairs on 3) and the fp16 GEMM have one
  copy of each wgmma site in the consumer, the replay is clean, the interpreter's results of the
  folded kernel equal the unfolded one's bit for bit, and ptxas compiles the FP8 kernels that
  spilled unfolded without spills or serialized wgmmas;
* ``TRITILE_FOLD_CONSUMER=0`` keeps the epilogue.
"""
from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_programs import LoopSpec, gemm_program, mbarrier_problems  # noqa: E402
from test_consumer_partitions import ptxas_advisories  # noqa: E402
from test_pipeline_properties import GRIDS, TILES, loop_specs  # noqa: E402
from test_warp_specialization import function, gemm_ir  # noqa: E402

from tritile.codegen.gluon import emit_module  # noqa: E402
from tritile.interpreter import execute  # noqa: E402
from tritile.ir import nodes as ir  # noqa: E402
from tritile.ir.printer import format_func  # noqa: E402
from tritile.ir.transform import walk  # noqa: E402
from tritile.lowering import run_passes  # noqa: E402
from tritile.lowering.persistent_tiles import persist  # noqa: E402
from tritile.runtime.target import Target  # noqa: E402
import tritile  # noqa: E402
from tritile import switches  # noqa: E402

H100 = Target("cuda", 90)


@pytest.fixture
def producer_warp(monkeypatch):
    """A producer warp wherever it applies, the default persistence."""
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "1")
    monkeypatch.delenv("TRITILE_PERSISTENT", raising=False)
    monkeypatch.delenv("TRITILE_CONSUMER_PARTITIONS", raising=False)


def folded_loops(func) -> list:
    return [n for n in walk(func.kernel.body) if isinstance(n, ir.For) and n.trips is not None]


def _lowered(frontend, fold: str, programs_: int = None):
    """The sm_90 IR after every pass, folded or not; when given and the kernel qualifies for a
    persistent tile loop, on `programs_` programs (several tiles each: the rings' phases
    continue across tiles)."""
    with switches.overridden({"TRITILE_FOLD_CONSUMER": fold}):
        final = run_passes(frontend, H100)[-1][1]
        if not programs_ or "persistent_tile_loop" not in final.attrs:
            return final
        with switches.overridden({"TRITILE_PERSISTENT": "0"}):
            return persist(run_passes(frontend, H100)[-1][1], programs_)


# ------------------------------------------------------------------ random programs


def _replay(final, program, seed) -> list:
    """The mbarrier problems of `final`'s generated module (a module that fails to run: one)."""
    try:
        return mbarrier_problems(emit_module(final, H100).source, program.make_args(seed), program.dim_values())
    except Exception as err:  # noqa: BLE001 - reported, and compared with the unfolded module's
        return [repr(err)]


def _check_program(program, seed, programs_=None, strict=True):
    """`program` folded: the reference result on the interpreter, and a clean replay - or, not
    `strict`, no worse a replay than unfolded."""
    final = _lowered(program.func, "1", programs_)
    args = program.make_args(seed)
    expected_c, _ = program.reference(program.make_args(seed))
    execute(final, args, dict(program.dims))
    torch.testing.assert_close(args[3], expected_c, rtol=1e-4, atol=1e-3, msg=lambda m: f"{format_func(final)}\n{m}")
    problems = _replay(final, program, seed)
    if problems and not strict:
        assert _replay(_lowered(program.func, "0", programs_), program, seed), (program, problems)
    else:
        assert problems == [], (program, problems)
    return final


@st.composite
def producer_programs(draw):
    """programs() a producer warp takes: top-level loops whose copies are unguarded and
    addressed by the loop variable (about 4 in 5 then fold; most others have no steady loop)."""
    specs = draw(st.lists(loop_specs(), min_size=1, max_size=3))
    loops = [dataclasses.replace(spec, guarded=False, guard_let=False, bind_offset=False) for spec in specs]
    return gemm_program(loops, tiles=draw(st.sampled_from(TILES)), grid=draw(st.sampled_from(GRIDS)),
                        read_after=draw(st.booleans()), staged_store=draw(st.booleans()))


@settings(max_examples=100, deadline=None, derandomize=True, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(program=producer_programs(), seed=st.integers(0, 2**16), programs_=st.sampled_from([None, 1, 2]))
def test_folded_programs_compute_the_reference_and_replay_clean(program, seed, programs_, producer_warp):
    """Whatever the loop (its trip count below the stages or only known at run time, copies at
    different stages, sibling loops, promotion) and however many tiles a program walks."""
    final = _check_program(program, seed, programs_, strict=False)
    event(f"folded loops: {len(folded_loops(final))}")
    for loop in folded_loops(final):  # the Seq of a folded loop ends with the loop and its drains
        seq = next(s for s in walk(final.kernel.body) if isinstance(s, ir.Seq) and any(x is loop for x in s.stmts))
        after = seq.stmts[[id(x) for x in seq.stmts].index(id(loop)) + 1:]
        assert all(isinstance(s, (ir.WaitMMA, ir.WaitGroup)) for s in after), format_func(final)


@pytest.mark.parametrize("loops, outer", [
    pytest.param([LoopSpec(4, 2, dynamic=True)], 1, id="runtime-n-below-stages"),
    pytest.param([LoopSpec(4, 0, dynamic=True)], 1, id="runtime-n0"),
    pytest.param([LoopSpec(3, 7, dynamic=True, promote_every=2)], 1, id="runtime-n-promoting"),
    pytest.param([LoopSpec(0, 5, order=[1, 2, 0], stage=[0, 0, 2], dynamic=True)], 1, id="manual-schedule"),
    pytest.param([LoopSpec(0, 5, order=[0, 1, 2], stage=[0, 1, 2], dynamic=True)], 1, id="copies-at-two-stages"),
    pytest.param([LoopSpec(4, 6), LoopSpec(3, 5, dynamic=True)], 2, id="siblings-outer"),
])
@pytest.mark.parametrize("programs_", [None, 1])
def test_folded_edge_programs(loops, outer, programs_, producer_warp):
    """Folded where it applies: not a nested loop (no producer warp), nor a commit group of two
    iterations (`_foldable`)."""
    program = gemm_program(loops, tiles=(16, 16, 16), grid=(2, 1), outer=outer)
    final = _check_program(program, 3, programs_)
    assert bool(folded_loops(final)) == (outer == 1 and loops[0].stage != [0, 1, 2]), format_func(final)
    if programs_ and len(loops) == 1 and outer == 1:  # both tiles on one program
        assert final.attrs.get("persistent_programs") == 1, format_func(final)


# ------------------------------------------------------------------ the example kernels


def _fp8_frontend(overlap, stages, M=1024, N=1024, K=4096):
    from examples.gemm_fp8 import TILE_128X128_HALVES, gemm_fp8

    config = {**TILE_128X128_HALVES, "num_stages": stages, "overlap_promotion": overlap}
    return gemm_fp8(M, N, K, **config).stages[0][1]


def _wgmma_sites(source: str, consumer: str) -> int:
    return len(re.findall(r"= warpgroup_mma\(", function(source, consumer)))


@pytest.mark.parametrize("overlap, stages, sites", [(None, 5, 1), ("k_pairs", 3, 2), ("n_halves", 4, 2)])
def test_fp8_consumer_has_one_copy_of_each_wgmma_site(overlap, stages, sites, monkeypatch):
    """Unfolded, the consumer repeats the loop's gemms once per epilogue step (D = stages - 1);
    folded, each appears once, and the protocol replays clean over several tiles a program."""
    monkeypatch.delenv("TRITILE_WARP_SPECIALIZE", raising=False)
    monkeypatch.delenv("TRITILE_PERSISTENT", raising=False)
    monkeypatch.delenv("TRITILE_CONSUMER_PARTITIONS", raising=False)
    frontend = _fp8_frontend(overlap, stages, 512, 256, 128 * 7)
    counts = {}
    for fold in ("0", "1"):
        final = _lowered(frontend, fold, programs_=3 if fold == "1" else None)
        source = emit_module(final, H100).source
        counts[fold] = _wgmma_sites(source, "main_consumer")
        if fold == "1":
            assert len(folded_loops(final)) == 1
            args = [torch.zeros(p.shape, dtype=p.dtype.torch) for p in final.params]
            assert mbarrier_problems(source, args) == []
    assert counts == {"0": sites * stages, "1": sites}


@pytest.mark.parametrize("overlap, stages", [(None, 5), ("k_pairs", 3)])
def test_fp8_folded_results_equal_the_unfolded_bit_for_bit(overlap, stages, monkeypatch):
    """The sm_90 kernels' IR on the interpreter (CUDA tiles, a ragged M, a short K whose few
    k-steps cap the stages): the folded kernel adds the same partials in the same order."""
    from examples.gemm_fp8 import quantize

    monkeypatch.delenv("TRITILE_WARP_SPECIALIZE", raising=False)
    monkeypatch.delenv("TRITILE_PERSISTENT", raising=False)
    for M, N, K in [(200, 256, 128 * 7), (128, 128, 128 * 3)]:
        gen = torch.Generator().manual_seed(M + K)
        a8, sa = quantize(torch.randn(M, K, generator=gen))
        b8, sb = quantize(torch.randn(N, K, generator=gen))
        scales = torch.stack([sa.float().reshape(()), sb.float().reshape(())])
        frontend = _fp8_frontend(overlap, stages, M, N, K)
        outs = {}
        for fold in ("0", "1"):
            final = _lowered(frontend, fold)
            assert bool(folded_loops(final)) == (fold == "1")
            c = torch.full((M, N), float("nan"), dtype=torch.float16)
            execute(final, [a8, b8, scales, c], {})
            outs[fold] = c
        assert torch.equal(outs["1"], outs["0"])
        exact = (a8.double() @ b8.double().t()) * (sa.double() * sb.double())
        torch.testing.assert_close(outs["1"].double(), exact, rtol=1e-2, atol=1e-2 * exact.abs().max().item())


@pytest.mark.usefixtures("gluon_backend")
@pytest.mark.parametrize("overlap, stages", [(None, 5), ("k_pairs", 3), ("n_halves", 4), ("n_halves", 5)])
def test_fp8_deeper_pipelines_compile_without_spills(overlap, stages, monkeypatch):
    """ptxas on the folded FP8 kernels that spilled with their epilogue (bench/NOTES.md: 5
    stages 2376 bytes and serialized wgmmas, k_pairs on 3 956 bytes and serialized, n_halves
    on 4 232 bytes; n_halves on 5, the example's CUDA default of session 19, 1084 bytes): no spills, the
    wgmmas pipelined."""
    from examples.gemm_fp8 import TILE_128X128_HALVES, gemm_fp8
    from tritile.runtime.kernel import JITKernel

    for switch in ("TRITILE_WARP_SPECIALIZE", "TRITILE_PERSISTENT", "TRITILE_CONSUMER_PARTITIONS",
                   "TRITILE_FOLD_CONSUMER"):
        monkeypatch.delenv(switch, raising=False)
    config = {**TILE_128X128_HALVES, "num_stages": stages, "overlap_promotion": overlap}
    kernel = JITKernel(gemm_fp8(1024, 1024, 4096, **config).stages[0][1], target=H100)
    advisories = ptxas_advisories(kernel.get_source("ptx"))
    assert not [line for line in advisories if "C75" in line or "serialized" in line], advisories
    assert "0 bytes spill stores" in "\n".join(advisories), advisories


def test_fp16_gemm_consumer_folds(monkeypatch):
    """The fp16 GEMM (128x256 tiles, 3 stages) with a producer warp: one wgmma site."""
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "1")
    monkeypatch.delenv("TRITILE_PERSISTENT", raising=False)
    counts = {}
    for fold in ("0", "1"):
        final = _lowered(gemm_ir(), fold)
        source = emit_module(final, H100).source
        consumer = next(m.group(1) for m in re.finditer(r"^def (\w+_consumer)\(", source, re.M))
        counts[fold] = _wgmma_sites(source, consumer)
        args = [torch.zeros(p.shape, dtype=p.dtype.torch) for p in final.params]
        assert mbarrier_problems(source, args) == []
    assert counts["1"] == 1 and counts["0"] > 1


def test_switch_off_keeps_the_epilogue(monkeypatch):
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "1")
    assert not folded_loops(_lowered(gemm_ir(), "0"))
    assert folded_loops(_lowered(gemm_ir(), "auto"))


@pytest.mark.gpu
@pytest.mark.parametrize("overlap, stages", [(None, 5), ("k_pairs", 3), ("n_halves", 5)])
def test_folded_fp8_on_the_gpu_is_as_accurate_as_unfolded(overlap, stages, gluon_backend):
    """CUDA: the folded deeper pipelines (several tiles a program) give the unfolded kernel's
    result bit for bit, and that is the fp64 product within the example's promotion error (the
    fold is the Gluon backend's: the triton backend starts from the stage before it)."""
    from examples.gemm_fp8 import TILE_128X128_HALVES, gemm_fp8, quantize

    M, N, K = 2048, 2048, 4096
    gen = torch.Generator().manual_seed(11)
    a8, sa = quantize(torch.randn(M, K, generator=gen))
    b8, sb = quantize(torch.randn(N, K, generator=gen))
    scales = torch.stack([sa.float().reshape(()), sb.float().reshape(())]).cuda()
    exact = (a8.double() @ b8.double().t()) * (sa.double() * sb.double())
    config = {**TILE_128X128_HALVES, "num_stages": stages, "overlap_promotion": overlap}
    outs = {}
    for fold in ("0", "1"):
        with switches.overridden({"TRITILE_FOLD_CONSUMER": fold}):  # read when the passes run
            kernel = tritile.compile(gemm_fp8.fn(M, N, K, **config), out_idx=[3])
            outs[fold] = kernel(a8.cuda(), b8.cuda(), scales).cpu()
        assert bool(folded_loops(kernel.func)) == (fold == "1")
    assert torch.equal(outs["1"], outs["0"])
    torch.testing.assert_close(outs["1"].double(), exact, rtol=1e-2, atol=1e-2 * exact.abs().max().item())


@pytest.mark.gpu
def test_folded_fp16_gemm_on_the_gpu():
    """The operator's 128x256 tiles, 3 stages, producer warp, persistent: folded by default."""
    import tritile.ops.matmul  # noqa: F401  (registers torch.ops.tritile.mm)

    a, b = (torch.randn(4096, 4096, dtype=torch.float16, device="cuda") for _ in range(2))
    c = torch.ops.tritile.mm(a, b)
    torch.testing.assert_close(c.float(), (a.float() @ b.float()), rtol=1e-2, atol=1e-1)
