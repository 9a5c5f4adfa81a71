"""Property test of the pipeline passes: random kernels with sibling pipelined loops give the
same result before and after every pass, equal to torch, with no async hazard, and every
versioned buffer is allocated with the maximum version count of the loops using it.

`test_replayed_programs_through_gluon` replays a fixed, derandomized set of the same generated
programs through the whole compile path (passes planned for the target, Gluon, Triton): on CPU
it compiles each to PTX for sm_90 and sm_80; on CUDA (`gpu`) it launches the kernel for the
current device and compares with the torch reference."""
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_programs import LoopSpec, gemm_program  # noqa: E402

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


def _depth(spec: LoopSpec) -> int:
    return max(spec.stage) + 1 if spec.stage is not None else spec.num_stages


@st.composite
def loop_specs(draw):
    stages = draw(st.integers(0, 4))
    manual = draw(st.sampled_from(MANUAL))
    stage, order = manual if manual is not None else (None, None)
    depth = max(stage) + 1 if stage is not None else stages
    trips = draw(st.sampled_from([0, 1, max(depth - 1, 0), depth, 5, 6]))
    return LoopSpec(0 if manual else stages, trips, guarded=draw(st.booleans()), dynamic=draw(st.booleans()),
                    order=order, stage=stage, bind_offset=draw(st.booleans()))


@st.composite
def programs(draw):
    loops = draw(st.lists(loop_specs(), min_size=1, max_size=3))
    tiles = draw(st.sampled_from([(16, 16, 16), (32, 16, 16), (16, 32, 16)]))
    grid = draw(st.sampled_from([(1, 1), (2, 1), (1, 2)]))
    return gemm_program(loops, tiles=tiles, grid=grid, outer=draw(st.sampled_from([1, 1, 2])),
                        read_after=draw(st.booleans()), staged_store=draw(st.booleans()))


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


@settings(max_examples=GLUON_REPLAY_EXAMPLES, deadline=None, derandomize=True, database=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(program=programs(), seed=st.integers(0, 2**16))
def test_replayed_programs_through_gluon(program, seed, device):
    from tritile.codegen.gluon import compile_kernel

    if device == "cpu":
        for target in (Target("cuda", 90), Target("cuda", 80)):
            ptx = compile_kernel(run_passes(program.func, target)[-1][1], target).asm["ptx"]
            assert f".target sm_{target.arch}" in ptx
        return
    target = _device_target()
    kernel = compile_kernel(run_passes(program.func, target)[-1][1], target)
    args = [t.to(device) for t in program.make_args(seed)]
    kernel.launch(args, program.dims)
    expected_c, expected_d = program.reference(program.make_args(seed))
    torch.testing.assert_close(args[3].cpu(), expected_c, rtol=1e-4, atol=1e-3)
    if program.read_after:
        torch.testing.assert_close(args[4].cpu(), expected_d, rtol=0, atol=0)
