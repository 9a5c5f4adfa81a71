"""Debugging aid (not collected by pytest): launch generated pipeline programs one by one on the
current CUDA device, printing each program before its launch, so that a kernel that faults or
hangs is named by the last line printed.

    PYTHONPATH=$PWD CUDA_LAUNCH_BLOCKING=1 python tests/replay_programs_on_gpu.py [count]
"""
import sys
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).parent))
from test_pipeline_properties import _device_target, programs  # noqa: E402

from tritile.codegen.gluon import compile_kernel  # noqa: E402
from tritile.lowering import run_passes  # noqa: E402


def collect(count: int) -> list:
    found = []

    @settings(max_examples=count, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(program=programs())
    def gather(program):
        found.append(program)

    gather()
    return found


def main(count: int) -> int:
    target = _device_target()
    failures = 0
    for index, program in enumerate(collect(count)):
        print(f"[{index}] {program!r}", flush=True)
        kernel = compile_kernel(run_passes(program.func, target)[-1][1], target)
        args = [t.cuda() for t in program.make_args(index)]
        kernel.launch(args, program.dims)
        torch.cuda.synchronize()
        expected_c, expected_d = program.reference(program.make_args(index))
        ok = torch.allclose(args[3].cpu(), expected_c, rtol=1e-4, atol=1e-3)
        if program.read_after:
            ok = ok and torch.equal(args[4].cpu(), expected_d)
        print(f"[{index}] {'ok' if ok else 'WRONG RESULT'}", flush=True)
        failures += not ok
    print(f"{failures} wrong of {count}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 60))
