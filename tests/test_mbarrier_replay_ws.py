"""The host replay of warp-specialized modules (`pipeline_programs.mbarrier_problems`).

A warp-specialized module forks each program into consumer partitions and a TMA producer that
hand the slots of shared rings over through mbarriers ("full": the producer's expect + copies
complete a phase, the consumers wait on it; "empty": each consumer arrives once it is done with
a slot, the producer waits before refilling it).  The replay runs the partitions concurrently
(coroutines resumed at their waits under several schedules) with a vector-clock race check of
the shared slots, so it finds on CPU what would hang or corrupt on the GPU:

* the generated modules - split attention (causal or not) and the GEMM with a producer warp,
  each as a plain launch, with the default persistent tile loop (one tile per program at these
  sizes) and persistent on 3 or 5 programs (several tiles per program: the ring phases continue
  across tiles; causal tiles there dealt from a schedule table) - replay without a problem;
* planted protocol bugs in those modules are reported: a dropped release or an empty barrier
  counting one consumer too many hang (deadlock); a slot refilled before its release, a copy
  into another slot than the one handed over, or a release before the wgmma reading the slot
  retired are races;
* the model itself on a small hand-written producer / consumer module: parity, lazy copies, a
  copy nobody waits for, an arrival overflowing its phase.

Kernels are generated from the frontend IR with `run_passes` + `emit_module` (no Triton
compile), the switches set first (they are read when the passes run).
"""
from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_programs import LoopSpec, gemm_program, mbarrier_problems  # noqa: E402
from test_warp_specialization import attention_ir, gemm_ir  # noqa: E402

from tritile.codegen.gluon import emit_module  # noqa: E402
from tritile.lowering import run_passes  # noqa: E402
from tritile.lowering.persistent_tiles import persist  # noqa: E402
from tritile.runtime.target import Target  # noqa: E402

H100 = Target("cuda", 90)
# launch: one tile per program / the default tile loop / persistent on 3 or 5 programs (causal
# attention's tiles then come from a schedule table)
LAYOUTS = ["plain", "persistent", "3-programs", "5-programs"]


@functools.lru_cache(maxsize=None)
def _frontend(kind: str):
    return attention_ir(kind == "causal", seq=1024) if kind in ("causal", "attention") else gemm_ir()


def _module(kind: str, layout: str, monkeypatch):
    """(generated sm_90 module, CPU args) of kernel `kind` ("attention", "causal", "gemm")."""
    if kind == "gemm":
        monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "1")  # the GEMM gets a producer warp on request
    if layout == "persistent":
        monkeypatch.delenv("TRITILE_PERSISTENT", raising=False)  # the default: on under warp specialization
    else:
        monkeypatch.setenv("TRITILE_PERSISTENT", "0")
    final = run_passes(_frontend(kind), H100)[-1][1]
    if layout.endswith("-programs"):
        final = persist(final, int(layout.split("-")[0]))
    source = emit_module(final, H100).source
    assert "gl.warp_specialize(" in source
    assert ("tile_iter" in source) == (layout != "plain")
    args = [torch.zeros(p.shape, dtype=p.dtype.torch) for p in final.params]
    return source, args


# ------------------------------------------------------------------ generated modules replay clean


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["attention", "causal"])
def test_split_attention_replays_clean(kind, layout, monkeypatch):
    """Two consumer warpgroups splitting the rows and a producer warp: no deadlock, no race,
    under every schedule and in every program (causal: each tile runs its own trip count)."""
    source, args = _module(kind, layout, monkeypatch)
    assert source.count("_consumer, (") == 2
    assert ("gl.load(tile_schedule + pid)" in source) == (kind == "causal" and layout.endswith("-programs"))
    assert mbarrier_problems(source, args) == []


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gemm_with_producer_warp_replays_clean(layout, monkeypatch):
    source, args = _module("gemm", layout, monkeypatch)
    assert "_producer" in source
    assert mbarrier_problems(source, args) == []


def test_a_kernel_planned_for_a_producer_but_issuing_its_own_copies_replays_clean(monkeypatch):
    """Sibling loops under a forced producer warp, the second with copies at two stages and a
    runtime trip count of 0: the codegen cannot serve its ring from a producer partition and
    falls back to the kernel's own copies, whose rings must then count arrivals per copy (they
    counted them as a producer would: `mbarrier.wait(k1_t_bars[0], parity 0)` never returned)."""
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "1")
    program = gemm_program([LoopSpec(0, 1, order=[1, 2, 0], stage=[0, 0, 2]),
                            LoopSpec(0, 0, dynamic=True, order=[0, 1, 2], stage=[0, 1, 2])], grid=(2, 1))
    final = run_passes(program.func, H100)[-1][1]
    assert "warp_specialization" in final.attrs
    source = emit_module(final, H100).source
    assert "_producer" not in source
    assert mbarrier_problems(source, program.make_args(3), program.dim_values()) == []


def test_a_one_stage_sibling_loop_keeps_its_copies_in_the_kernel(monkeypatch):
    """A one-stage loop beside a four-stage one copies into `A_shared[A_shared_slot[0]]`, a slot
    variable the consumers keep: no producer warp is planned for it (the producer's copies named
    an undefined `A_shared_slot`), and the module replays clean."""
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "1")
    program = gemm_program([LoopSpec(1, 1), LoopSpec(4, 4)], grid=(2, 1))
    final = run_passes(program.func, H100)[-1][1]
    assert "warp_specialization" not in final.attrs
    source = emit_module(final, H100).source
    assert mbarrier_problems(source, program.make_args(3), program.dim_values()) == []


# ------------------------------------------------------------------ planted protocol bugs


def _edit_line(source: str, pattern: str, edit) -> str:
    """`source` with its first line matching `pattern` replaced by `edit(line)`."""
    lines = source.splitlines()
    i = next(i for i, line in enumerate(lines) if re.search(pattern, line))
    lines[i] = edit(lines[i])
    return "\n".join(lines)


def _drop_release(source):  # the first consumer arrive on an empty barrier becomes `pass`
    return _edit_line(source, r"mbarrier\.arrive\(\w+_empty", lambda ln: ln[:len(ln) - len(ln.lstrip())] + "pass")


def _empty_count(delta):
    def plant(source):
        return re.sub(r"(mbarrier\.init\(\w+_empty\.index\(_stage\), count=)(\d+)",
                      lambda m: f"{m.group(1)}{int(m.group(2)) + delta}", source)
    return plant


def _other_slot(source):  # the producer's first copy fills the slot after the one it signals
    return _edit_line(source, r"tma\.async_copy_global_to_shared\(.*\(g % ",
                      lambda ln: re.sub(r"(\w+_shared)\.index\(\(g % (\d+)\)\)", r"\1.index(((g + 1) % \2))", ln))


def _early_release(source):  # every wgmma wait keeps one more group in flight
    return re.sub(r"(warpgroup_mma_wait\(num_outstanding=)(\d)", lambda m: f"{m.group(1)}{int(m.group(2)) + 1}", source)


DEADLOCKS = {"drop a release": _drop_release, "empty barrier counts one more consumer": _empty_count(1)}
RACES = {"copy into another slot": (_other_slot, "unordered after"),
         "release before the wgmma retires": (_early_release, "overwrites")}


@pytest.mark.parametrize("plant", list(DEADLOCKS))
@pytest.mark.parametrize("kind, layout", [("causal", "3-programs"), ("attention", "plain"), ("gemm", "3-programs")])
def test_planted_hangs_are_reported_as_deadlocks(kind, layout, plant, monkeypatch):
    """The consumers' releases never complete the phase the producer waits for: the producer
    waits on an empty barrier, the consumers on a full one nobody fills - a hang on the GPU."""
    source, args = _module(kind, layout, monkeypatch)
    broken = DEADLOCKS[plant](source)
    assert broken != source
    problems = mbarrier_problems(broken, args)
    deadlocks = [p for p in problems if "deadlock" in p]
    assert deadlocks, problems
    assert any(re.search(r"_producer/\d waits \(line \d+\) on \w+_empty\[", p) for p in deadlocks), deadlocks


@pytest.mark.parametrize("plant", list(RACES))
@pytest.mark.parametrize("kind, layout", [("causal", "3-programs"), ("gemm", "3-programs")])
def test_planted_races_are_reported(kind, layout, plant, monkeypatch):
    """No hang, but a consumer reads a slot before the copy it waited for filled it, or the
    producer refills a slot a consumer still reads: found by the vector clocks."""
    source, args = _module(kind, layout, monkeypatch)
    edit, expected = RACES[plant]
    broken = edit(source)
    assert broken != source
    problems = mbarrier_problems(broken, args)
    assert any(expected in p for p in problems), problems


def test_a_tile_store_overwritten_under_its_tma_store_is_reported(monkeypatch):
    """The persistent GEMM's epilogue stages the next tile's C in the buffer the previous
    tile's TMA store may still read, after `tma.store_wait(0)`; without that wait, a race."""
    source, args = _module("gemm", "3-programs", monkeypatch)
    broken = _edit_line(source, r"^\s+tma\.store_wait\(0\)", lambda ln: ln.replace("tma.store_wait(0)", "pass"))
    problems = mbarrier_problems(broken, args)
    assert any(re.search(r"overwrites _store_tile\d+ \(store, line \d+\) while matmul_consumer/0's async TMA store", p)
               for p in problems), problems


def test_an_empty_barrier_counting_one_consumer_less_is_reported(monkeypatch):
    """Each consumer's arrival completes a phase by itself: the empty barrier runs ahead of
    the producer's parity, which refills slots still in use and later waits on a dead phase."""
    source, args = _module("causal", "3-programs", monkeypatch)
    assert mbarrier_problems(_empty_count(-1)(source), args)


# ------------------------------------------------------------------ the model on a small module

TOY = '''
@gluon.jit
def consumer(bufs, full, empty, n):
    for i in range(n):
        mbarrier.wait(full.index(i % 2), {consumer_parity})
        x = bufs.index(i % 2).load(None)
        mbarrier.arrive(empty.index(i % 2){arrive_count})


@gluon.jit
def producer(X_desc, bufs, full, empty, n):
    for i in range(n{extra_copies}):
        mbarrier.wait(empty.index(i % 2), ((i // 2) & 1) ^ 1, pred=i >= 2)
        mbarrier.expect(full.index(i % 2), 128)
        tma.async_copy_global_to_shared(X_desc, [8 * i, 0], full.index(i % 2), bufs.index(i % 2))


@gluon.jit
def kernel(X, X_desc, n):
    bufs = gl.allocate_shared_memory(gl.float16, [2, 8, 8], None)
    full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(2):
        mbarrier.init(full.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    gl.warp_specialize([(consumer, (bufs, full, empty, n)), (producer, (X_desc, bufs, full, empty, n))], [1], [24])


TMA_DESCRIPTORS = (((8, 8), None), )


def tritile_launch(launch, X, n):
    launch((1, 1, 1), (X, ), ((X, X.shape, X.stride()), ), (n, ))
'''


def _toy(n, consumer_parity="(i // 2) & 1", arrive_count="", extra_copies=""):
    source = TOY.format(consumer_parity=consumer_parity, arrive_count=arrive_count, extra_copies=extra_copies)
    return mbarrier_problems(source, [torch.zeros(64, 8, dtype=torch.float16)], [n])


@pytest.mark.parametrize("n", range(6))
def test_toy_ring_replays_clean(n):
    assert _toy(n) == []


def test_toy_wait_on_the_wrong_parity_reads_before_the_copy_lands():
    """A fresh barrier's phase -1 counts as completed with parity 1: waiting for parity 1
    returns at once, before the first copy; the replay sees the read unordered after it."""
    problems = _toy(4, consumer_parity="((i // 2) & 1) ^ 1")
    assert any("consumer/0 reads bufs[0] (load, line 6) unordered after producer/1's write" in p for p in problems)


def test_toy_copy_nobody_waits_for():
    problems = _toy(3, extra_copies=" + 1")  # one copy more than the consumer takes
    assert any("waited for by no partition" in p for p in problems), problems


def test_toy_arrival_overflowing_its_phase():
    problems = _toy(2, arrive_count=", count=2")
    assert any("overflows its phase: 0 + 2 arrivals for a count of 1" in p for p in problems), problems


def test_toy_deadlock_names_every_waiting_partition():
    problems = _toy(4, arrive_count=", pred=i < 1")  # only the first slot use is released
    assert problems and all(p.split(": ", 1)[1].startswith("deadlock") for p in problems), problems
    assert "consumer/0 waits (line 5) on full[1] parity 1" in problems[0]
    assert "producer/1 waits (line 13) on empty[1] parity 0" in problems[0]


# ------------------------------------------------------------------ one partition, with the race check


def _pipelined_gemm(loops):
    program = gemm_program(loops)
    source = emit_module(run_passes(program.func, H100)[-1][1], H100).source
    assert "mbarrier.wait" in source and "gl.warp_specialize(" not in source
    return source, program.make_args(0), program.dim_values()


@pytest.mark.parametrize("loops", [
    pytest.param([LoopSpec(3, 5)], id="stages3"),
    pytest.param([LoopSpec(3, 2, dynamic=True)], id="dynamic-n2"),
    pytest.param([LoopSpec(0, 4, order=[0, 1, 2], stage=[0, 0, 1])], id="stage001"),
])
def test_single_partition_pipelines_replay_clean_with_the_race_check(loops):
    """`schedules` runs a module without partitions through the same replay (its kernel body
    as the one partition, copies landing lazily): the race check accepts these pipelines."""
    source, args, dims = _pipelined_gemm(loops)
    assert mbarrier_problems(source, args, dims, schedules=("producer-first", "consumers-first")) == []


def test_skewed_stage_pipeline_waits_for_the_first_group():
    """With stage [0, 1, 2] a commit group holds A of iteration g and B of g - 1: the gemm of
    iteration i reads A(i) (group i) and B(i) (group i + 1), so the wait completing iteration
    i waits on both groups (at the loop's first step, group 0 had no wait of its own)."""
    source, args, dims = _pipelined_gemm([LoopSpec(0, 3, order=[0, 1, 2], stage=[0, 1, 2])])
    assert mbarrier_problems(source, args, dims) == []  # the one-thread replay: no hang
    assert mbarrier_problems(source, args, dims, schedules=("producer-first",)) == []


def _drop_tile_load_release(source):  # the consumers never free their Q slot
    return _edit_line(source, r"mbarrier\.arrive\(Q_shared_free", lambda ln: ln[:len(ln) - len(ln.lstrip())] + "pass")


def _tile_load_released_at_once(source):  # the Q slot is freed as soon as its load landed
    lines = [ln for ln in source.splitlines() if "mbarrier.arrive(Q_shared_free" not in ln]
    i = next(i for i, ln in enumerate(lines) if "mbarrier.wait(Q_shared_loaded" in ln)
    indent = lines[i][:len(lines[i]) - len(lines[i].lstrip())]
    lines.insert(i + 1, indent + "mbarrier.arrive(Q_shared_free.index(part))")
    return "\n".join(lines)


def test_tile_load_protocol_bugs_are_reported(monkeypatch):
    """The producer loads each tile's Q into the consumers' slots once they freed them: a
    consumer that never frees its slot hangs the producer at the next tile; one that frees it
    before its last QK^T retired lets the next tile's Q overwrite the rows it still reads."""
    source, args = _module("causal", "3-programs", monkeypatch)
    assert mbarrier_problems(source, args) == []
    hang = mbarrier_problems(_drop_tile_load_release(source), args)
    assert any(re.search(r"_producer/\d waits \(line \d+\) on Q_shared_free\[", p) for p in hang), hang
    race = mbarrier_problems(_tile_load_released_at_once(source), args)
    assert any("overwrites" in p and "Q_shared" in p for p in race), race


def test_an_attention_tile_overwritten_under_its_tma_store_is_reported(monkeypatch):
    """Each consumer's TMA store of O reads its O_shared slot while the next tile runs; the
    next tile's epilogue waits for it (`tma.store_wait(0)`) before writing the slot again."""
    source, args = _module("attention", "3-programs", monkeypatch)
    broken = _edit_line(source, r"^\s+tma\.store_wait\(0\)", lambda ln: ln.replace("tma.store_wait(0)", "pass"))
    problems = mbarrier_problems(broken, args)
    assert any(re.search(r"overwrites O_shared.*async TMA store", p) for p in problems), problems
