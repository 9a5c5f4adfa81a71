"""lowering/release_ahead.py (``TRITILE_RELEASE_AHEAD=1``): a folded warp-specialized loop whose
step retires its gemms before its copies releases the slot it read in that step.

* the FP8 GEMM's promoting kernels (examples/gemm_fp8.py: the default, DeepGEMM's form, the
  128x256 tile) qualify: their consumers release ``(k_t + 1) % S`` - the consumed iteration's
  slot - with the same predicate bounds, the persistent tile's last releases unchanged, the
  mbarrier protocol replays clean and ptxas compiles them as before (no spills, no advisory);
* a loop that keeps a gemm in flight across steps (the fp16 GEMM's ``wait(1)``, the FP8 kernel
  promoting every 2 k-steps) does not: its module is the same with the switch on or off;
* off by default, and the flag is printed with the loop (its own compile-cache key);
* random pipelined programs given a producer warp, the switch on: the interpreter's reference
  result and a clean replay.
"""
from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_programs import gemm_program, mbarrier_problems  # noqa: E402
from test_consumer_loop_folding import _check_program, producer_programs  # noqa: E402
from test_consumer_partitions import ptxas_advisories  # noqa: E402
from test_warp_specialization import function, gemm_ir  # noqa: E402

import torch  # noqa: E402
from examples.gemm_fp8 import TILE_128X128_HALVES, gemm_fp8  # noqa: E402
import tritile  # noqa: E402
from tritile import switches  # noqa: E402
from tritile.codegen.gluon import emit_module  # noqa: E402
from tritile.lowering import run_passes  # noqa: E402
from tritile.ir import nodes as ir  # noqa: E402
from tritile.ir.printer import format_func  # noqa: E402
from tritile.ir.transform import walk  # noqa: E402
from tritile.runtime.kernel import JITKernel  # noqa: E402
from tritile.runtime.target import Target  # noqa: E402

H100 = Target("cuda", 90)
AHEAD = {"TRITILE_RELEASE_AHEAD": "1"}
FP8 = {  # (tile config changes, stages)
    "default": ({}, 5),
    "w1-6st": (dict(num_stages=6, overlap_promotion="n_pieces", pieces=1, partials=1), 6),
    "128x256-h1-3st": (dict(block_N=256, num_stages=3, overlap_promotion="n_pieces", pieces=2, partials=1), 3),
}


@pytest.fixture
def default_schedule(monkeypatch):
    for switch in ("TRITILE_WARP_SPECIALIZE", "TRITILE_PERSISTENT", "TRITILE_CONSUMER_PARTITIONS",
                   "TRITILE_FOLD_CONSUMER", "TRITILE_RELEASE_AHEAD"):
        monkeypatch.delenv(switch, raising=False)


def fp8_kernel(changes: dict, switch: dict) -> JITKernel:
    with switches.overridden(switch):
        return JITKernel(gemm_fp8.fn(1024, 1024, 4096, **{**TILE_128X128_HALVES, **changes}), target=H100)


def marked(kernel) -> list:
    return [n for n in walk(kernel.func.kernel.body) if isinstance(n, ir.For) and n.release_ahead]


def consumer_releases(source: str) -> list:
    return re.findall(r"mbarrier\.arrive\((\w+_empty)\.index\(([^)]*\)?[^)]*)\)(?:, pred=(.*))?\)",
                      function(source, "main_consumer"))


@pytest.mark.usefixtures("gluon_backend", "default_schedule")
@pytest.mark.parametrize("name", list(FP8))
def test_promoting_fp8_kernels_release_the_slot_their_step_read(name):
    changes, stages = FP8[name]
    before, ahead = fp8_kernel(changes, {}), fp8_kernel(changes, AHEAD)
    assert not marked(before) and len(marked(ahead)) == 1
    assert "slots released at the step that read them" in format_func(ahead.func)
    assert "slots released at the step that read them" not in format_func(before.func)
    old, new = before.get_source("gluon"), ahead.get_source("gluon")
    loop_old = [r for r in consumer_releases(old) if "k_t" in r[1]]
    loop_new = [r for r in consumer_releases(new) if "k_t" in r[1]]
    assert loop_old == [("k_t_bars_empty", f"k_t % {stages}", f"(k_t >= {stages}) & (k_t < 32)")], loop_old
    assert loop_new == [("k_t_bars_empty", f"(k_t + 1) % {stages}",
                         f"((k_t + 1) >= {stages}) & ((k_t + 1) < 32)")], loop_new
    tile_end = f"for _g0 in range({32 - stages}, 32):"  # the tile's last S slots, after its loop
    assert tile_end in function(old, "main_consumer") and tile_end in function(new, "main_consumer")
    advisories = ptxas_advisories(ahead.get_source("ptx"))
    assert not [line for line in advisories if "C75" in line or "serialized" in line], advisories
    assert "0 bytes spill stores" in "\n".join(advisories), advisories
    args = [torch.zeros(p.shape, dtype=p.dtype.torch) for p in ahead.func.params]
    assert mbarrier_problems(new, args) == []


@pytest.mark.usefixtures("gluon_backend", "default_schedule")
def test_a_gemm_in_flight_across_steps_keeps_the_release_a_step_behind(monkeypatch):
    """The FP8 kernel promoting every 2 k-steps (its non-promoting steps keep both gemms in
    flight) and the fp16 GEMM with a producer warp (``wait(1)``): not marked, the same module
    with the switch on."""
    promote_2 = dict(num_stages=5, overlap_promotion="n_pieces", pieces=2, partials=2, promote_every=2)
    off, on = fp8_kernel(promote_2, {}), fp8_kernel(promote_2, AHEAD)
    assert not marked(on) and on.get_source("gluon") == off.get_source("gluon")
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "1")
    sources = []
    for switch in ({}, AHEAD):
        with switches.overridden(switch):
            final = run_passes(gemm_ir(), H100)[-1][1]
        assert "warp_specialization" in final.attrs and not any(
            isinstance(n, ir.For) and n.release_ahead for n in walk(final.kernel.body))
        sources.append(emit_module(final, H100).source)
    assert sources[0] == sources[1]


@st.composite
def promoting_every_step(draw):
    """producer_programs() whose loops promote after every gemm without an `if` - their steps
    end with ``wait(0)``: the loops release_ahead marks - on 3-4 stages (num_stages instead of
    a manual schedule) and more trips than stages (a steady loop to fold), the trip count often
    known only at run time."""
    program = draw(producer_programs())
    loops = [dataclasses.replace(spec, num_stages=max(spec.num_stages, 3), order=None, stage=None,
                                 trips=max(spec.trips, draw(st.sampled_from([5, 9]))), promote_every=1,
                                 promote_form="every_step") for spec in program.loops]
    return gemm_program(loops, tiles=program.tiles, grid=program.grid, read_after=program.read_after,
                        staged_store=program.staged_store)


@settings(max_examples=40, deadline=None, derandomize=True, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(program=promoting_every_step(), seed=st.integers(0, 2**16), programs_=st.sampled_from([None, 1, 2]))
def test_random_programs_releasing_ahead_compute_the_reference_and_replay_clean(program, seed, programs_, monkeypatch):
    """Loops with their slots released ahead, alone or beside others, one tile or several a
    program, the trip count static or known at run time: the reference result on the
    interpreter and a clean replay of the generated module."""
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "1")
    monkeypatch.setenv("TRITILE_RELEASE_AHEAD", "1")
    monkeypatch.delenv("TRITILE_PERSISTENT", raising=False)
    monkeypatch.delenv("TRITILE_CONSUMER_PARTITIONS", raising=False)
    final = _check_program(program, seed, programs_)
    event(f"loops released ahead: {sum(isinstance(n, ir.For) and n.release_ahead for n in walk(final.kernel.body))}")


@pytest.mark.gpu
@pytest.mark.usefixtures("gluon_backend")  # a pass of the Gluon backend's schedule
@pytest.mark.parametrize("name", list(FP8))
def test_released_ahead_on_the_gpu_gives_the_same_bits(name, default_schedule):
    """CUDA: the kernel releasing its slots a step earlier computes exactly what it computes
    releasing them a step later (the same arithmetic; a slot refilled while its wgmmas still
    read it would not), at a size with several tiles per persistent program."""
    from examples.gemm_fp8 import quantize

    M, N, K = 4096, 4096, 2048
    gen = torch.Generator(device="cuda").manual_seed(11)
    a8, sa = quantize(torch.randn(M, K, device="cuda", generator=gen))
    b8, sb = quantize(torch.randn(N, K, device="cuda", generator=gen))
    scales = torch.stack([sa.float().reshape(()), sb.float().reshape(())])
    changes, _ = FP8[name]
    results = []
    for switch in ({}, AHEAD):
        with switches.overridden(switch):
            kernel = tritile.compile(gemm_fp8.fn(M, N, K, **{**TILE_128X128_HALVES, **changes}), out_idx=[3])
            results.append(kernel(a8, b8, scales))
    assert bool(marked(kernel)) and torch.equal(results[0], results[1])
