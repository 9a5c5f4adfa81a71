"""Launch the programs of tests/test_pipeline_properties.py::test_replayed_programs_through_gluon
one per subprocess, in the test's order, with a timeout, and name the ones that hang, fault or
compute a wrong result.  Each line also shows the host replay of the kernel's mbarrier protocol
(`tests/pipeline_programs.mbarrier_problems`): "predicted hang" = a wait no TMA copy completes.

    PYTHONPATH=$PWD python3 bench/replay_hang.py                # GPU: the test's REPLAY list, 20 s each
    PYTHONPATH=$PWD python3 bench/replay_hang.py --suspects     # GPU: the known deadlock class
    PYTHONPATH=$PWD python3 bench/replay_hang.py --only 3 7 --timeout 60
    PYTHONPATH=$PWD python3 bench/replay_hang.py --sim [--suspects]   # CPU: host replay only
    PYTHONPATH=$PWD python3 bench/replay_hang.py --dump /tmp/replay   # CPU: IR + Gluon per program

`--suspects`: stage [0, 1, 2] (A of i+1 and B of i share a TMA commit group) with a runtime
trip count 0 or 1, alone, under `outer=2` and after a sibling loop; the four programs the old
hypothesis-driven replay drew in the full `-m gpu` suite at 6f88dfa (examples 11-14: with every
test module imported, hypothesis's local-constant pool changes the draws); controls with trip
counts 2 and 5; and the causal FlashAttention case `flashattn-causal-128x128-s2`.
Expected before the codegen fix: the trip-count 0/1 programs HANG, the controls pass.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

_OLD_SUITE_DRAWS = [  # test_replayed_programs_through_gluon[cuda] examples 11-14, full-suite state, 6f88dfa
    "gemm_program([LoopSpec(0, 6, dynamic=True, order=[0, 1, 2], stage=[0, 1, 2]), LoopSpec(0, 0, dynamic=True, "
    "order=[0, 1, 2], stage=[0, 1, 2])], grid=(2, 1), read_after=True, staged_store=True)",
    "gemm_program([LoopSpec(0, 0, dynamic=True, order=[0, 1, 2], stage=[0, 1, 2]), LoopSpec(0, 0, dynamic=True, "
    "order=[0, 1, 2], stage=[0, 1, 2])], grid=(2, 1), read_after=True, staged_store=True)",
    "gemm_program([LoopSpec(0, 0, guarded=True, dynamic=True, order=[0, 1, 2], stage=[0, 1, 2]), LoopSpec(0, 0, "
    "dynamic=True, order=[0, 1, 2], stage=[0, 1, 2])], grid=(2, 1), read_after=True, staged_store=True)",
    "gemm_program([LoopSpec(0, 0, guarded=True, dynamic=True, order=[0, 1, 2], stage=[0, 1, 2]), LoopSpec(0, 0, "
    "dynamic=True, order=[0, 1, 2], stage=[0, 1, 2])], grid=(2, 1), read_after=True)",
]


def suspects() -> list:
    """[(label, program or attention case id, seed)]."""
    from pipeline_programs import LoopSpec, gemm_program

    def skewed(n):
        return LoopSpec(0, n, dynamic=True, order=[0, 1, 2], stage=[0, 1, 2])

    out = [(f"skewed n={n}", gemm_program([skewed(n)]), 0) for n in (0, 1, 2, 5)]
    out += [("skewed n=1 outer=2", gemm_program([skewed(1)], outer=2), 0),
            ("4-stage n=4, skewed n=0", gemm_program([LoopSpec(4, 4, dynamic=True), skewed(0)]), 0)]
    out += [(f"old suite draw {11 + i}", eval(text, {"gemm_program": gemm_program, "LoopSpec": LoopSpec}), 43)
            for i, text in enumerate(_OLD_SUITE_DRAWS)]
    out.append(("flashattn causal 128x128 s2", "flashattn-causal-128x128-s2", 0))
    return out


def programs(use_suspects: bool) -> list:
    if use_suspects:
        return suspects()
    from test_pipeline_properties import REPLAY

    return [(f"REPLAY[{i}]", program, seed) for i, (program, seed) in enumerate(REPLAY)]


def _target(arch=None):
    from tritile.runtime.target import Target

    if arch is None:
        import torch

        major, minor = torch.cuda.get_device_capability()
        arch = major * 10 + minor
    return Target("cuda", arch)


def _attention(case: str, device: str):
    import torch
    import test_kernels_attention as ta

    kernel = ta.COMPILE_CASES[case]()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 128, 64, generator=gen).to(torch.float16).to(device) for _ in range(3))
    return kernel, (q, k, v), ta.flash_attention.ref_program(q.float(), k.float(), v.float(), "causal" in case)


def predicted(item, arch=90) -> str:
    """Host replay of the kernel's mbarrier protocol: "" when every wait completes."""
    from pipeline_programs import mbarrier_problems
    from tritile.codegen.gluon import emit_module
    from tritile.lowering import run_passes

    _, program, seed = item
    target = _target(arch)
    if isinstance(program, str):
        import test_kernels_attention as ta
        import torch

        final = run_passes(ta.COMPILE_CASES[program]().stages[0][1], target)[-1][1]
        args = [torch.zeros(p.shape, dtype=p.dtype.torch) for p in final.params]
        dims = []
    else:
        final = run_passes(program.func, target)[-1][1]
        args, dims = program.make_args(seed), program.dim_values()
    try:
        problems = mbarrier_problems(emit_module(final, target).source, args, dims)
    except NotImplementedError as err:
        return f"not replayed ({err})"
    return problems[0] if problems else ""


def run_one(index: int, use_suspects: bool) -> int:
    """Child: compile + launch one program as the test does; exit 0 ok, 1 wrong result."""
    import torch

    from tritile.codegen.gluon import compile_kernel
    from tritile.lowering import run_passes

    _, program, seed = programs(use_suspects)[index]
    if isinstance(program, str):
        kernel, (q, k, v), ref = _attention(program, "cuda")
        out = kernel(q, k, v)
        torch.cuda.synchronize()
        ok = torch.allclose(out.float().cpu(), ref.cpu(), rtol=1e-2, atol=1e-2)
    else:
        target = _target()
        kernel = compile_kernel(run_passes(program.func, target)[-1][1], target)
        args = [t.to("cuda") for t in program.make_args(seed)]
        kernel.launch(args, program.dims)
        torch.cuda.synchronize()
        expected_c, expected_d = program.reference(program.make_args(seed))
        ok = torch.allclose(args[3].cpu(), expected_c, rtol=1e-4, atol=1e-3)
        if program.read_after:
            ok = ok and torch.equal(args[4].cpu(), expected_d)
    print("ok" if ok else "WRONG RESULT", flush=True)
    return 0 if ok else 1


def dump(directory: Path, use_suspects: bool, arch: int):
    from tritile.codegen.gluon import emit_module
    from tritile.ir.printer import format_func
    from tritile.lowering import run_passes

    directory.mkdir(parents=True, exist_ok=True)
    target = _target(arch)
    for index, (label, program, seed) in enumerate(programs(use_suspects)):
        if isinstance(program, str):
            continue
        final = run_passes(program.func, target)[-1][1]
        (directory / f"{index:02d}.ir").write_text(f"# {label} seed={seed} dims={program.dim_values()}\n"
                                                  f"# {program!r}\n" + format_func(final))
        (directory / f"{index:02d}.py").write_text(emit_module(final, target).source)
    print(f"wrote {directory}/NN.ir, NN.py (target {target})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suspects", action="store_true", help="the known deadlock class instead of REPLAY")
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--only", type=int, nargs="*", default=None)
    ap.add_argument("--sim", action="store_true", help="host replay only (no GPU)")
    ap.add_argument("--dump", type=Path)
    ap.add_argument("--arch", type=int, default=90, help="target arch for --sim / --dump")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    os.chdir(ROOT)
    if a.one is not None:
        return run_one(a.one, a.suspects)
    if a.dump:
        dump(a.dump, a.suspects, a.arch)
        return 0
    items = programs(a.suspects)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    bad = []
    for index, item in enumerate(items):
        label, program, seed = item
        if a.only and index not in a.only:
            continue
        verdict = predicted(item, a.arch if a.sim else None)
        shown = f"predicted hang: {verdict[:110]}" if verdict else "protocol ok"
        if a.sim:
            bad += [index] if verdict else []
            print(f"[{index:2d}] {label:<28} {shown}  {program!r}", flush=True)
            continue
        t0 = time.time()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", str(index)] + ["--suspects"] * a.suspects
        try:  # own session: a hung child is killed alone
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout, start_new_session=True)
            status = (p.stdout.strip().splitlines() or ["?"])[-1] if p.returncode in (0, 1) else \
                f"ERROR rc={p.returncode}: {(p.stderr.strip().splitlines() or [''])[-1][:80]}"
        except subprocess.TimeoutExpired:
            status = f"HANG (> {a.timeout:.0f} s)"
        if status != "ok":
            bad.append(index)
        print(f"[{index:2d}] {label:<28} {status:<16} {time.time() - t0:5.1f}s  {shown}  seed={seed} {program!r}",
              flush=True)
    print(f"{len(bad)} {'predicted to hang' if a.sim else 'not ok'} of {len(items)}: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
