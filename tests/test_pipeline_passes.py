"""Unit tests of the pipeline passes on hand-built IR (tests/pipeline_programs.py): planning,
versioning (seed 000 / TileLang #2309, #3039, #2668, seed 001), injection for every trip count,
the shared-memory budget, and planted broken schedules that the interpreter must catch."""
import dataclasses
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_programs import LoopSpec, gemm_program  # noqa: E402

from tritile.errors import CompileError, HazardError  # noqa: E402
from tritile.interpreter import execute  # noqa: E402
from tritile.ir import nodes as ir  # noqa: E402
from tritile.ir.printer import format_func  # noqa: E402
from tritile.ir.transform import Transformer, walk  # noqa: E402
from tritile.lowering import run_passes  # noqa: E402
from tritile.runtime.target import Target  # noqa: E402

H100 = Target("cuda", 90)


def lower(program, until):
    return dict(run_passes(program.func, H100, stop_after=until))


def loops_of(func):
    return [n for n in walk(func.kernel.body) if isinstance(n, ir.For) and n.kind == "pipelined"]


def check_all_stages(program, seed=0):
    """interpreter(every stage) == torch reference; returns the stages."""
    stages = run_passes(program.func, H100, stop_after="shared_memory_budget")
    for name, func in stages:
        args = program.make_args(seed)
        execute(func, args, dict(program.dims))
        c, d = program.reference(args)
        torch.testing.assert_close(args[3], c, rtol=1e-4, atol=1e-3, msg=lambda m: f"after {name}: {m}")
        if program.read_after:
            torch.testing.assert_close(args[4], d, rtol=0, atol=0, msg=lambda m: f"after {name}: {m}")
    return dict(stages)


# ------------------------------------------------------------------------------ planning


def test_planning_copy_copy_gemm_three_stages():
    planned = lower(gemm_program([LoopSpec(3, 4)]), "pipeline_planning")["pipeline_planning"]
    (loop,) = loops_of(planned)
    assert loop.schedule.stages == [0, 0, 2]
    assert loop.schedule.orders == [0, 1, 2]


@pytest.mark.parametrize("trips, dynamic, stages", [(1, False, [0, 0, 0]), (2, False, [0, 0, 1]),
                                                    (3, False, [0, 0, 2]), (7, False, [0, 0, 2]),
                                                    (1, True, [0, 0, 2])])
def test_planning_caps_stages_by_the_static_trip_count(trips, dynamic, stages):
    """3 stages over a loop of at most `trips` iterations: more stages than iterations only add
    guarded-off prologue steps (and Triton asserted on them); a runtime trip count keeps 3."""
    program = gemm_program([LoopSpec(3, trips, dynamic=dynamic)])
    (loop,) = loops_of(lower(program, "pipeline_planning")["pipeline_planning"])
    assert loop.schedule.stages == stages
    check_all_stages(program, seed=trips)


def test_upper_bounds_see_through_lets_min_and_ceildiv():
    from tritile.ir.bounds import upper_bound

    x, n = ir.Var("x", ir.int32), ir.Var("n", ir.int32)
    c = lambda v: ir.Const(v, ir.int32)  # noqa: E731
    ceildiv = ir.BinOp("//", ir.BinOp("-", ir.BinOp("+", x, c(64)), c(1)), c(64))
    assert upper_bound(ir.BinOp("min", c(1), ceildiv)) == 1  # causal attention's loop_range
    assert upper_bound(ir.Call("min", (ceildiv, c(5)), ir.int32)) == 5
    assert upper_bound(n, {id(n): ir.BinOp("min", x, c(4))}) == 4
    assert upper_bound(ceildiv) is None and upper_bound(ir.BinOp("max", x, c(3))) is None
    assert upper_bound(ir.BinOp("//", ir.BinOp("*", c(10), c(3)), c(4))) == 7


def test_planning_honours_manual_schedule():
    program = gemm_program([LoopSpec(0, 4, order=[1, 2, 0], stage=[0, 0, 2])])
    (loop,) = loops_of(lower(program, "pipeline_planning")["pipeline_planning"])
    assert (loop.schedule.stages, loop.schedule.orders) == ([0, 0, 2], [1, 2, 0])
    check_all_stages(program)


def test_planning_rejects_dependency_breaking_schedule():
    program = gemm_program([LoopSpec(0, 4, order=[0, 1, 2], stage=[0, 1, 1])])
    bad = gemm_program([LoopSpec(0, 4, order=[0, 2, 1], stage=[0, 1, 1])])  # gemm before copy B
    check_all_stages(program)
    with pytest.raises(CompileError, match=r"pipeline_programs.py:1: .*breaks a dependency"):
        lower(bad, "pipeline_planning")


def test_planning_rejects_manual_schedule_of_wrong_length():
    with pytest.raises(CompileError, match="order= has 2 entries but the loop body has 3"):
        lower(gemm_program([LoopSpec(0, 4, order=[0, 1], stage=[0, 1])]), "pipeline_planning")


def test_planning_distributes_block_sparse_guard_and_replays_lets():
    program = gemm_program([LoopSpec(3, 5, guarded=True, bind_offset=True)])
    (loop,) = loops_of(lower(program, "pipeline_planning")["pipeline_planning"])
    assert loop.schedule.stages == [0, 0, 2]
    text = format_func(lower(program, "pipeline_planning")["pipeline_planning"])
    assert text.count("if mask[") == 3
    check_all_stages(program, seed=3)


def test_num_stages_zero_is_left_serial():
    program = gemm_program([LoopSpec(0, 3)])
    stages = check_all_stages(program)
    (loop,) = loops_of(stages["shared_memory_budget"])
    assert loop.schedule is None and loop.num_stages == 0


# ------------------------------------------------------------------------------ versioning


def _allocs(func):
    return {n.buffer.name: n.buffer for n in walk(func.kernel.body) if isinstance(n, ir.Alloc)}


@pytest.mark.parametrize("stages", [(2, 4), (4, 2), (2, 3, 4)], ids=str)
def test_sibling_loops_share_one_allocation(stages):
    """Seed 000 / TileLang #2309: one allocation of max(S) versions, each loop its own modulo."""
    program = gemm_program([LoopSpec(s, 5) for s in stages], tiles=(64, 16, 32))  # trips >= stages
    versioned = check_all_stages(program)["buffer_versioning"]
    text = format_func(versioned)
    assert text.count("A_shared = T.alloc_shared") == 1
    assert "A_shared = T.alloc_shared([4, 64, 32], float16)" in text
    allocs = _allocs(versioned)
    assert allocs["A_shared"].num_versions == 4 and allocs["A_shared"].origin.shape == (64, 32)
    for s, loop in zip(stages, loops_of(versioned)):
        assert re.search(rf"A_shared\[k\d % {s}, :, :\]", format_func(versioned).split(f"for {loop.var.name} ")[1])


def test_read_after_loop_sees_last_iteration():
    """TileLang #3039: a versioned tile read after the loop is the last executed iteration's."""
    program = gemm_program([LoopSpec(3, 5), LoopSpec(2, 2, guarded=True)], read_after=True)
    stages = check_all_stages(program, seed=7)
    assert "A_shared_slot = T.alloc_var(int32, init=0)" in format_func(stages["buffer_versioning"])


def test_buffer_used_only_outside_pipelines_is_untouched():
    """Seed 001: a shared buffer never used by a pipeline keeps its shape and gets no slot."""
    program = gemm_program([LoopSpec(3, 4)], staged_store=True)
    stages = check_all_stages(program)
    allocs = _allocs(stages["buffer_versioning"])
    assert allocs["C_shared"].shape == (16, 16) and allocs["C_shared"].num_versions == 1
    assert "C_shared_slot" not in format_func(stages["buffer_versioning"])
    assert "A_shared_slot" not in format_func(stages["buffer_versioning"])


def test_num_stages_one_adds_no_versions():
    stages = check_all_stages(gemm_program([LoopSpec(1, 3)]))
    assert _allocs(stages["shared_memory_budget"])["A_shared"].shape == (16, 16)
    assert "T.wait_group(0)" in format_func(stages["pipeline_injection"])


def _war_program():
    """for k: copy A->As; gemm(As, Bs); copy A->As again (overwrites what the gemm read)."""
    program = gemm_program([LoopSpec(2, 4)])
    loop = loops_of(program.func)[0]
    body = loop.body.stmts
    new_loop = dataclasses.replace(loop, body=ir.Seq(body + [body[0]]))

    class Swap(Transformer):
        def visit_For(self, f):
            return new_loop if f is loop or f == loop else f

    program.func = Swap().transform(program.func)
    return program


def test_loop_carried_war_is_rejected():
    """TileLang #2668: reading a shared tile and then overwriting it in the same iteration."""
    with pytest.raises(CompileError, match="breaks a dependency"):
        lower(_war_program(), "buffer_versioning")


# ------------------------------------------------------------------------------ injection


@pytest.mark.parametrize("trips", [0, 1, 2, 3, 7])
@pytest.mark.parametrize("dynamic", [False, True])
def test_every_trip_count(trips, dynamic):
    program = gemm_program([LoopSpec(3, trips, dynamic=dynamic)], grid=(2, 1))
    stages = check_all_stages(program, seed=trips)
    text = format_func(stages["pipeline_injection"])
    pipelined = dynamic or trips >= 2  # a static single iteration is planned with one stage
    assert "T.async_copy" in text or trips == 0
    assert ("is_async=True" in text and "T.wait_mma(0)" in text) == pipelined or trips == 0


def test_injected_schedule_shape():
    text = format_func(lower(gemm_program([LoopSpec(3, 6)]), "pipeline_injection")["pipeline_injection"])
    steady = text.split("software-pipelined, 3 stages")[1]
    # auto-planned schedules are emitted consumers first: one async gemm stays in flight
    wait = steady.index("T.wait_group(1)  # completes iteration k0_t - 2")
    gemm = steady.index("T.gemm(A_shared[(k0_t - 2) % 3")
    retire = steady.index("T.wait_mma(1)")
    refill = steady.index("T.async_copy(A[")
    assert wait < gemm < retire < refill
    assert "A_shared[k0_t % 3, :, :]" in steady and "A_shared[(k0_t - 2) % 3, :, :]" in steady
    assert text.count("T.commit_group()") == 2 + 1 + 2  # prologue, steady, epilogue


@pytest.mark.parametrize("stages, every, form", [(3, 4, "branch"), (3, 5, "one"), (4, 5, "branch"),
                                                  (3, 4, "masked"), (2, 3, "branch")])
@pytest.mark.parametrize("dynamic", [False, True])
def test_promotion_retires_the_gemms_only_in_the_steps_that_promote(stages, every, form, dynamic):
    """FP8 GEMM's `if (k + 1) % n == 0: total += partial; partial = 0`: the wait for the
    partial sum's gemms goes inside the `if` (or its guard, when the promotion is one
    statement), so the other steps keep a gemm in flight; the refill still waits for the gemm
    that read its slot (n > S: the promotion alone never retires it in time).  A condition
    that reads a buffer ("masked") keeps the wait in front of the `if`."""
    program = gemm_program([LoopSpec(stages, 11, dynamic=dynamic, promote_every=every, promote_form=form)])
    lines = format_func(check_all_stages(program)["pipeline_injection"]).splitlines()
    header = next(i for i, ln in enumerate(lines) if f"software-pipelined, {stages} stages" in ln)
    indent = len(lines[header]) - len(lines[header].lstrip())
    body = lines[header + 1:]
    steady = [ln.strip() for ln in body[:next((i for i, ln in enumerate(body)
                                               if len(ln) - len(ln.lstrip()) <= indent), None)]]
    due = next(i for i, ln in enumerate(steady) if ln.startswith("if "))
    assert (steady[due + 1] == "T.wait_mma(0)") == (form != "masked"), steady
    assert (steady[due - 1] == "T.wait_mma(0)") == (form == "masked"), steady
    if stages >= 3 and form != "masked":  # consumers first: the refill comes after the promotion
        assert steady.index("T.wait_mma(1)") < next(i for i, ln in enumerate(steady) if "T.async_copy(A[" in ln)


def test_a_promotion_that_drops_the_refill_wait_is_a_hazard():
    """The planted bug the test above guards against: treating the gemms as retired after a
    wait inside the promotion's `if` (the steps that skip it still have one in flight)."""
    program = gemm_program([LoopSpec(3, 11, promote_every=5)])
    _run_injected(program, lambda body: body)
    with pytest.raises(HazardError):
        _run_injected(program, lambda body: [s for s in body if not isinstance(s, ir.WaitMMA)])


# ------------------------------------------------------------------------------ planted bugs


class _Plant(Transformer):
    def __init__(self, fn):
        self.fn = fn

    def visit_For(self, f):
        if f.pipelined_from:
            return dataclasses.replace(f, body=ir.Seq(self.fn(list(f.body.stmts))))
        return f


def _run_injected(program, plant):
    func = lower(program, "pipeline_injection")["pipeline_injection"]
    func = _Plant(plant).transform(func)
    execute(func, program.make_args(0), dict(program.dims))


def test_planted_missing_wait_group_is_a_hazard():
    program = gemm_program([LoopSpec(3, 6)])
    _run_injected(program, lambda body: body)  # the real schedule is clean
    with pytest.raises(HazardError):
        _run_injected(program, lambda body: [s for s in body if not isinstance(s, ir.WaitGroup)])


def test_planted_weaker_wait_group_is_a_hazard():
    program = gemm_program([LoopSpec(3, 6)])
    with pytest.raises(HazardError):
        _run_injected(program, lambda body: [dataclasses.replace(s, pending=s.pending + 1)
                                             if isinstance(s, ir.WaitGroup) else s for s in body])


def test_planted_copy_before_wait_mma_is_a_hazard():
    def move_copies_first(body):
        copies = [s for s in body if isinstance(s, ir.AsyncCopy)]
        return copies + [s for s in body if not isinstance(s, ir.AsyncCopy)]

    with pytest.raises(HazardError):
        _run_injected(gemm_program([LoopSpec(2, 5)]), move_copies_first)


# ------------------------------------------------------------------------------ budget


def test_shared_memory_budget_attrs():
    func = lower(gemm_program([LoopSpec(3, 4)], tiles=(64, 16, 32)), "shared_memory_budget")["shared_memory_budget"]
    assert func.attrs["shared_buffers"] == {"A_shared": 3 * 64 * 32 * 2, "B_shared": 3 * 32 * 16 * 2}
    assert func.attrs["shared_bytes"] == 3 * 64 * 32 * 2 + 3 * 32 * 16 * 2 + 8 * 3


def test_shared_memory_budget_error_names_buffers():
    program = gemm_program([LoopSpec(2, 4)], tiles=(256, 256, 128))
    with pytest.raises(CompileError, match=r"A_shared 131072 B.*B_shared 131072 B"):
        run_passes(program.func, Target("cuda", 80), stop_after="shared_memory_budget")


def test_stages_no_shared_memory_holds_are_refused_when_planned():
    """Three copies ahead of 64 KB stages exceed sm_80's shared memory before any version is made."""
    program = gemm_program([LoopSpec(4, 4)], tiles=(256, 256, 64))
    with pytest.raises(CompileError, match=r"4 stages: 3 copies of the shared tiles it loads \(A_shared 32768 B, "
                                           r"B_shared 32768 B\) need 196608 bytes"):
        run_passes(program.func, Target("cuda", 80), stop_after="pipeline_planning")


# ------------------------------------------------------------------------------ deferred accumulation


def _attention(seq, causal, num_stages=2, threads=128):
    """The example's FlashAttention at head dim 64: 64-row tiles on one warpgroup, or 128-row
    tiles on two (threads=256)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from examples.flash_attention import flashattn

    return flashattn.fn(1, 2, seq, seq, 64, causal, block_M=threads // 2, block_N=64, num_stages=num_stages,
                        threads=threads)


def _steady_body(func):
    loops = [n for n in walk(func.kernel.body) if isinstance(n, ir.For) and n.pipelined_from]
    return loops[0].body.stmts


@pytest.mark.parametrize("threads", [128, 256])  # causal defers only on two warpgroups
@pytest.mark.parametrize("causal", [False, True])  # causal: a per-block (dynamic) trip count
@pytest.mark.parametrize("seq", [64, 128, 256])  # trip counts 1 (< D), 2 (== D) and 4
def test_attention_defers_pv_gemm_and_matches_torch_through_every_stage(seq, causal, threads):
    from examples.flash_attention import ref_program

    if seq < threads // 2:
        pytest.skip("a row block larger than the sequence")
    func = _attention(seq, causal=causal, threads=threads)
    q, k, v = (torch.randn(1, 2, seq, 64, dtype=torch.float16) for _ in range(3))
    ref = ref_program(q, k, v, causal)
    for name, stage in run_passes(func, H100, stop_after="shared_memory_budget"):
        out = torch.empty_like(q)
        execute(stage, [q, k, v, out], {})  # raises HazardError on any unsafe emission
        torch.testing.assert_close(out, ref, rtol=1e-2, atol=1e-2, msg=lambda m: f"after {name}: {m}")


def test_attention_steady_state_issues_qk_then_pv_before_the_softmax():
    stages = dict(run_passes(_attention(512, causal=False), H100, stop_after="pipeline_injection"))
    body = _steady_body(stages["pipeline_injection"])
    kinds = [type(s).__name__ for s in body]
    gemms = [j for j, s in enumerate(body) if isinstance(s, ir.Gemm)]
    reduce_max = next(j for j, s in enumerate(body) if isinstance(s, ir.Reduce) and s.kind == "max")
    cast = max(j for j, s in enumerate(body) if isinstance(s, ir.Copy))
    assert len(gemms) == 2 and gemms[1] < reduce_max, kinds
    qk, pv = (body[j] for j in gemms)
    assert qk.c.buffer.name == "acc_s" and pv.c.buffer.name == "acc_o"
    # QK^T of i is retired with PV of i - 1 still in flight; PV retires before P is rewritten
    assert isinstance(body[reduce_max - 1], ir.WaitMMA) and body[reduce_max - 1].pending == 1
    assert isinstance(body[cast - 1], ir.WaitMMA) and body[cast - 1].pending == 0
    # one commit group per step, holding K of i + 1 and V of i
    copies = [s for s in body if isinstance(s, ir.AsyncCopy)]
    assert [c.dst.buffer.name for c in copies] == ["K_shared", "V_shared"]
    assert sum(isinstance(s, ir.CommitGroup) for s in body) == 1


@pytest.mark.parametrize("threads", [128, 256])
def test_dynamic_trip_count_defers_pv_only_on_several_warpgroups(threads):
    """Causal attention's per-block trip count is dynamic: the deferred schedule's guarded
    prologue and epilogue cost a one-warpgroup CTA its four-CTAs-per-SM register budget
    (measured slower), so there the steady state keeps the program's order; CTAs of two
    warpgroups defer PV (measured 1.07x on the split 128x128 kernel)."""
    stages = dict(run_passes(_attention(512, causal=True, threads=threads), H100, stop_after="pipeline_injection"))
    body = _steady_body(stages["pipeline_injection"])
    gemms = [j for j, s in enumerate(body) if isinstance(s, ir.Gemm)]
    reduce_max = next(j for j, s in enumerate(body) if isinstance(s, ir.Reduce) and s.kind == "max")
    if threads == 128:
        assert gemms[0] < reduce_max < gemms[1]
    else:
        assert gemms[1] < reduce_max
