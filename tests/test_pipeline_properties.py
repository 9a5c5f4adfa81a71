"""Property test of the pipeline passes: random kernels with sibling pipelined loops give the
same result before and after every pass, equal to torch, with no async hazard, and every
versioned buffer is allocated with the maximum version count of the loops using it.

`test_replayed_programs_through_gluon` replays a fixed list of the same kind of programs
(`REPLAY`, drawn with a seeded `random.Random`, so the list is the same in every process and
pytest selection - a derandomized hypothesis run is not: hypothesis mixes in integer constants
of the local modules loaded so far, so the full suite drew other programs than this file
alone) through the whole compile path (passes planned for the target, Gluon, Triton).  Each
generated module's mbarrier protocol is first replayed on the host (`mbarrier_problems`): a
wait no TMA copy can complete fails the test there instead of hanging the GPU.  On CPU it
compiles each program to PTX for sm_90 and sm_80; on CUDA (`gpu`) it launches the kernel for
the current device and compares with the torch reference."""
import ast
import importlib
import random
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_programs import LoopSpec, gemm_program, mbarrier_problems  # noqa: E402

from tritile.interpreter import execute  # noqa: E402
from tritile.ir import nodes as ir  # noqa: E402
from tritile.ir.printer import format_func  # noqa: E402
from tritile.ir.transform import walk  # noqa: E402
from tritile.lowering import run_passes  # noqa: E402
from tritile.runtime.target import Target  # noqa: E402

TARGET = Target("cuda", 90)
GLUON_REPLAY_EXAMPLES = 40


# manual (stage, order) plans for copy A, copy B, gemm; None = num_stages planning
MANUAL = [None, None, None, ([0, 0, 1], [0, 1, 2]), ([0, 0, 2], [1, 2, 0]), ([0, 1, 2], [0, 1, 2]),
          ([1, 0, 2], [2, 0, 1]), ([0, 0, 0], [0, 1, 2])]
TILES = [(16, 16, 16), (32, 16, 16), (16, 32, 16)]
GRIDS = [(1, 1), (2, 1), (1, 2)]
OUTERS = [1, 1, 2]
REPLAY_SEED = 20261122
PROMOTE_FORMS = ["branch", "one", "masked"]
PROMOTION_REPLAY_EXAMPLES, PROMOTION_REPLAY_SEED = 8, 20261126

def _depth(spec: LoopSpec) -> int:
    """Versions the loop needs: a manual schedule's stages, else num_stages, capped by a static
    trip count (pipeline planning gives a loop of at most n iterations at most n stages)."""
    if spec.stage is not None:
        return max(spec.stage) + 1
    return spec.num_stages if spec.dynamic else min(spec.num_stages, max(spec.trips, 1))


@st.composite
def loop_specs(draw):
    stages = draw(st.integers(0, 4))
    manual = draw(st.sampled_from(MANUAL))
    stage, order = manual if manual is not None else (None, None)
    depth = max(stage) + 1 if stage is not None else stages
    trips = draw(st.sampled_from([0, 1, max(depth - 1, 0), depth, 5, 6]))
    return LoopSpec(0 if manual else stages, trips, guarded=draw(st.booleans()), guard_let=draw(st.booleans()),
                    dynamic=draw(st.booleans()), order=order, stage=stage, bind_offset=draw(st.booleans()),
                    promote_every=0 if manual else draw(st.sampled_from([0, 0, 1, 2, 3, 5])),
                    promote_form=draw(st.sampled_from(PROMOTE_FORMS)))


@st.composite
def programs(draw):
    loops = draw(st.lists(loop_specs(), min_size=1, max_size=3))
    tiles = draw(st.sampled_from(TILES))
    grid = draw(st.sampled_from(GRIDS))
    return gemm_program(loops, tiles=tiles, grid=grid, outer=draw(st.sampled_from(OUTERS)),
                        read_after=draw(st.booleans()), staged_store=draw(st.booleans()))


def _random_loop_spec(rng: random.Random) -> LoopSpec:  # loop_specs() with a seeded Random
    stages = rng.randint(0, 4)
    manual = rng.choice(MANUAL)
    stage, order = manual if manual is not None else (None, None)
    depth = max(stage) + 1 if stage is not None else stages
    trips = rng.choice([0, 1, max(depth - 1, 0), depth, 5, 6])
    guarded, dynamic, bind_offset = (rng.random() < 0.5 for _ in range(3))
    return LoopSpec(0 if manual else stages, trips, guarded=guarded, dynamic=dynamic, order=order, stage=stage,
                    bind_offset=bind_offset)


def _random_promoting_loop_spec(rng: random.Random) -> LoopSpec:  # a num_stages loop with a promotion
    spec = _random_loop_spec(rng)
    return LoopSpec(rng.randint(1, 4), max(spec.trips, rng.choice([5, 6, 9])), guarded=spec.guarded,
                    dynamic=spec.dynamic, bind_offset=spec.bind_offset, promote_every=rng.choice([1, 2, 3, 5]),
                    promote_form=rng.choice(PROMOTE_FORMS))


def replay_programs(count: int = GLUON_REPLAY_EXAMPLES, seed: int = REPLAY_SEED, promoting: bool = False) -> list:
    """[(program, argument seed)]: programs() drawn with `random.Random(seed)`, the same list in
    every process (bench/replay_hang.py launches them one per subprocess).  With `promoting`,
    every program's first loop promotes its gemm's partial sums (FP8 GEMM's shape)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        loops = [_random_loop_spec(rng) for _ in range(rng.randint(1, 3))]
        if promoting:
            loops[0] = _random_promoting_loop_spec(rng)
        program = gemm_program(loops, tiles=rng.choice(TILES), grid=rng.choice(GRIDS), outer=rng.choice(OUTERS),
                               read_after=rng.random() < 0.5, staged_store=rng.random() < 0.5)
        out.append((program, rng.randint(0, 2**16)))
    return out


REPLAY = replay_programs() + replay_programs(PROMOTION_REPLAY_EXAMPLES, PROMOTION_REPLAY_SEED, promoting=True)


def _run(program, func, seed):
    args = program.make_args(seed)
    execute(func, args, dict(program.dims))
    return args[3], args[4]


@settings(max_examples=200, deadline=None, derandomize=True, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(program=programs(), seed=st.integers(0, 2**16))
def test_passes_preserve_semantics(program, seed):
    stages = run_passes(program.func, TARGET, stop_after="shared_memory_budget")
    expected_c, expected_d = program.reference(program.make_args(seed))
    for name, func in stages:
        c, d = _run(program, func, seed)
        torch.testing.assert_close(c, expected_c, rtol=1e-4, atol=1e-3, msg=lambda m: f"after {name}: {m}")
        if program.read_after:
            torch.testing.assert_close(d, expected_d, rtol=0, atol=0, msg=lambda m: f"after {name}: {m}")
    # allocation extent == max version count over the loops that version the buffer
    depths = [_depth(spec) for spec in program.loops if _depth(spec) >= 2]
    want = max(depths, default=1)
    final = stages[-1][1]
    text = format_func(final)
    for node in walk(final.kernel.body):
        if isinstance(node, ir.Alloc) and node.buffer.name in ("A_shared", "B_shared"):
            assert node.buffer.num_versions == want, text
            assert node.buffer.shape[0] == want or want == 1, text
    assert not any(isinstance(n, ir.For) and n.kind == "pipelined" and (n.num_stages >= 1 or n.stage)
                   for n in walk(final.kernel.body)), text


def _device_target() -> Target:
    major, minor = torch.cuda.get_device_capability()
    return Target("cuda", major * 10 + minor)


def check_mbarrier_protocol(kernel, program, seed):
    """Fail when the generated module has a wait that no TMA copy completes: launching it
    would hang the GPU."""
    problems = mbarrier_problems(kernel.source, program.make_args(seed), program.dim_values())
    assert not problems, f"{program!r}: launching this kernel would hang the GPU: {problems[0]}"


@pytest.mark.parametrize("index", range(len(REPLAY)))
def test_replayed_programs_through_gluon(index, device):
    from tritile.codegen.gluon import compile_kernel

    program, seed = REPLAY[index]
    if device == "cpu":
        for target in (Target("cuda", 90), Target("cuda", 80)):
            kernel = compile_kernel(run_passes(program.func, target)[-1][1], target)
            assert f".target sm_{target.arch}" in kernel.asm["ptx"]
            check_mbarrier_protocol(kernel, program, seed)
        return
    target = _device_target()
    kernel = compile_kernel(run_passes(program.func, target)[-1][1], target)
    check_mbarrier_protocol(kernel, program, seed)  # before the launch: never hang the suite
    args = [t.to(device) for t in program.make_args(seed)]
    kernel.launch(args, program.dims)
    expected_c, expected_d = program.reference(program.make_args(seed))
    torch.testing.assert_close(args[3].cpu(), expected_c, rtol=1e-4, atol=1e-3)
    if program.read_after:
        torch.testing.assert_close(args[4].cpu(), expected_d, rtol=0, atol=0)


def test_replay_list_is_fixed():
    """The replayed programs do not depend on the process (loaded modules, hypothesis state)."""
    again = replay_programs() + replay_programs(PROMOTION_REPLAY_EXAMPLES, PROMOTION_REPLAY_SEED, promoting=True)
    assert [(repr(p), s) for p, s in again] == [(repr(p), s) for p, s in REPLAY]
    assert sum(len(p.loops) for p, _ in REPLAY) > len(REPLAY)  # sibling loops are drawn


# ---------------------------------------------------------------- mbarrier protocol (CPU)

H100 = Target("cuda", 90)


def _gluon(program, target=H100, lowered=False) -> str:
    from tritile.codegen.gluon import emit_module

    func = program if lowered else run_passes(program.func, target)[-1][1]
    return emit_module(func, target).source


def _skewed(trips: int, **kw) -> LoopSpec:  # A of i+1 and B of i in one commit group
    return LoopSpec(0, trips, dynamic=True, order=[0, 1, 2], stage=[0, 1, 2], **kw)


# A commit group mixing iterations (stage [0, 1, 2]: A of i+1 with B of i) under a runtime trip
# count below 2, each copy guarded by its own iteration: before each copy signalled the group's
# barrier by itself (rings.py, `Ring.copies_per_group`), n = 0 waited on a group no copy filled
# and n = 1 skipped group 1's expect with its first copy while B of 0 still landed - both hung.
@pytest.mark.parametrize("loops, outer", [
    pytest.param([_skewed(0)], 1, id="n0"),
    pytest.param([_skewed(1)], 1, id="n1"),
    pytest.param([_skewed(1)], 2, id="n1-outer2"),
    pytest.param([LoopSpec(4, 4, dynamic=True), _skewed(0)], 1, id="sibling-n0"),
])
def test_short_dynamic_loop_with_mixed_tma_groups_does_not_hang(loops, outer):
    program = gemm_program(loops, outer=outer)
    assert mbarrier_problems(_gluon(program), program.make_args(0), program.dim_values()) == []


@pytest.mark.parametrize("stages", [2, 3])
def test_guard_bound_to_a_let_keeps_its_loads_off_tma(stages):
    """A block-sparse guard whose condition is bound first (`take = mask[k] != 0; if take:`, as
    TileLang's block-sparse GEMM writes `T.any_of` / `T.all_of`): its loads took TMA, as the
    guard was not seen under the Let, and a skipped load left its barrier's wait hanging on the
    H100.  Guarded copies use cp.async, whose groups complete empty."""
    program = gemm_program([LoopSpec(stages, 5, guarded=True, guard_let=True)])
    source = _gluon(program)
    assert "tma.async_copy_global_to_shared" not in source
    for seed in range(4):
        assert mbarrier_problems(source, program.make_args(seed), program.dim_values()) == []


@pytest.mark.parametrize("loops", [
    pytest.param([LoopSpec(3, 2, dynamic=True)], id="dynamic-n2"),
    pytest.param([LoopSpec(0, 4, order=[0, 1, 2], stage=[0, 1, 2])], id="static-n4"),
    pytest.param([LoopSpec(0, 3, order=[0, 1, 2], stage=[0, 1, 2])], id="static-n3"),
    pytest.param([LoopSpec(0, 0, order=[0, 1, 2], stage=[0, 1, 2]), LoopSpec(4, 5, dynamic=True)], id="siblings"),
    pytest.param([LoopSpec(3, 0, dynamic=True), LoopSpec(2, 1, dynamic=True)], id="dynamic-n0-n1"),
])
def test_mbarrier_replay_accepts_complete_phases(loops):
    program = gemm_program(loops, outer=2)
    source = _gluon(program)
    assert "mbarrier.wait" in source
    assert mbarrier_problems(source, program.make_args(0), program.dim_values()) == []


SUITES = ["test_kernels_gemm", "test_kernels_reduce", "test_kernels_atomic", "test_kernels_elementwise",
          "test_kernels_attention", "test_kernels_pipeline", "test_kernels_examples", "test_pipeline_seeds"]
def _suite_kernels():
    for suite in SUITES:
        for name, build in importlib.import_module(suite).COMPILE_CASES.items():
            yield pytest.param(build, id=f"{suite}::{name}")


@pytest.mark.parametrize("build", list(_suite_kernels()))
def test_suite_kernels_keep_the_mbarrier_protocol(build, monkeypatch):
    """Every TileLang-style suite kernel's sm_90 module, replayed on the host: no dead wait.
    The replay runs one thread of control, so kernels are generated without warp
    specialization (its partitions run concurrently)."""
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "0")
    final = run_passes(build().stages[0][1], H100)[-1][1]
    source = _gluon(final, lowered=True)
    if "mbarrier.wait" not in source:
        return
    shapes = [p.shape for p in final.params]
    if final.dynamic_vars or not all(isinstance(d, int) for shape in shapes for d in shape):
        pytest.skip("runtime shapes")
    args = [torch.zeros(shape, dtype=p.dtype.torch) for shape, p in zip(shapes, final.params)]
    assert mbarrier_problems(source, args) == []


@pytest.mark.parametrize("planted", ["drop the first expect", "drop the last copy", "flip a wait's parity"])
def test_mbarrier_replay_finds_planted_deadlocks(planted):
    """The checker itself: each planted protocol bug of a correct pipelined GEMM is reported."""
    program = gemm_program([LoopSpec(3, 5, dynamic=True)])
    lines = _gluon(program).splitlines()
    if planted == "drop the first expect":
        del lines[next(i for i, ln in enumerate(lines) if "mbarrier.expect(" in ln)]
    elif planted == "drop the last copy":
        del lines[max(i for i, ln in enumerate(lines) if "tma.async_copy_global_to_shared(" in ln)]
    else:  # every wait waits for the other parity than the phase its copies complete
        for i in [i for i, ln in enumerate(lines) if "mbarrier.wait(" in ln]:
            call = ast.parse(lines[i].strip()).body[0].value
            call.args[1] = ast.BinOp(call.args[1], ast.BitXor(), ast.Constant(1))
            lines[i] = lines[i][:len(lines[i]) - len(lines[i].lstrip())] + ast.unparse(call)
    assert mbarrier_problems("\n".join(lines), program.make_args(0), program.dim_values())


def test_mbarrier_replay_finds_a_copy_no_wait_stands_for():
    """The checker itself: with its last wait dropped, a correct pipelined GEMM's last group of
    TMA loads lands on the replay's host at once but is waited for by nothing before its
    barrier is invalidated - on the GPU still in flight there (mutant 139,
    tests/test_mutated_programs.py)."""
    program = gemm_program([LoopSpec(3, 5)])
    lines = _gluon(program).splitlines()
    del lines[max(i for i, ln in enumerate(lines) if "mbarrier.wait(" in ln)]
    problems = mbarrier_problems("\n".join(lines), program.make_args(0), program.dim_values())
    assert problems and all("waited for by no mbarrier.wait before its invalidate" in p for p in problems), problems
