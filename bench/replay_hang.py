"""Replay the exact programs of tests/test_pipeline_properties.py::test_replayed_programs_through_gluon,
in the test's order, each launched in its OWN subprocess with a timeout, and name the ones that
hang (or fault, or compute a wrong result).

    PYTHONPATH=$PWD python3 bench/replay_hang.py                 # GPU: every example, 20 s each
    PYTHONPATH=$PWD python3 bench/replay_hang.py --timeout 30 --only 21 22
    PYTHONPATH=$PWD python3 bench/replay_hang.py --list          # CPU ok: the programs, in order
    PYTHONPATH=$PWD python3 bench/replay_hang.py --dump /tmp/rp  # CPU ok: IR + Gluon per example
    PYTHONPATH=$PWD python3 bench/replay_hang.py --in-process    # GPU: all in ONE process, like pytest

The examples are the ones pytest generates: hypothesis derandomizes from the test function's
digest, which pytest's hypothesis plugin extends with the item's node id (`..._gluon[cuda]` and
`..._gluon[cpu]` get DIFFERENT examples), so the test's own `@given` object is driven here with
its inner function replaced by a recorder that has the same source and signature (hence the same
digest).  Requires running from the repository root (pytest.ini there makes it the rootdir).
Examples depend on the installed hypothesis version: compare `--list` output between machines.
"""
from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

NODEID = "tests/test_pipeline_properties.py::test_replayed_programs_through_gluon[{param}]"


def collect(param: str = "cuda") -> list:
    """[(program, seed)] in the order pytest's `[param]` case runs them."""
    from hypothesis import HealthCheck, settings

    import test_pipeline_properties as tp

    wrapped = tp.test_replayed_programs_through_gluon
    original = wrapped.hypothesis.inner_test
    found = []

    @functools.wraps(original)  # same source + signature -> same hypothesis digest
    def recorder(program, seed, device):
        found.append((program, seed))

    # what _hypothesis_pytestplugin does for a parametrized item
    recorder._hypothesis_internal_add_digest = NODEID.format(param=param).encode()
    old_settings = wrapped._hypothesis_internal_use_settings
    wrapped._hypothesis_internal_use_settings = settings(
        parent=old_settings,
        suppress_health_check={HealthCheck.differing_executors} | set(old_settings.suppress_health_check))
    wrapped.hypothesis.inner_test = recorder
    try:
        wrapped(device=param)
    finally:
        wrapped.hypothesis.inner_test = original
        wrapped._hypothesis_internal_use_settings = old_settings
    return found


def _target(cpu_arch=None):
    from tritile.runtime.target import Target

    if cpu_arch is not None:
        return Target("cuda", cpu_arch)
    import torch

    major, minor = torch.cuda.get_device_capability()
    return Target("cuda", major * 10 + minor)


def run_one(index: int, param: str) -> int:
    """Child: compile + launch example `index` exactly as the test does; exit 0 ok, 1 wrong."""
    import torch

    from tritile.codegen.gluon import compile_kernel
    from tritile.lowering import run_passes

    program, seed = collect(param)[index]
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


def in_process(param: str, only) -> int:
    """All examples in one process (the pytest situation), printing before each launch."""
    import torch

    from tritile.codegen.gluon import compile_kernel
    from tritile.lowering import run_passes

    target = _target()
    for index, (program, seed) in enumerate(collect(param)):
        if only and index not in only:
            continue
        print(f"[{index:2d}] seed={seed} {program!r} ...", end=" ", flush=True)
        kernel = compile_kernel(run_passes(program.func, target)[-1][1], target)
        args = [t.to("cuda") for t in program.make_args(seed)]
        kernel.launch(args, program.dims)
        torch.cuda.synchronize()
        expected_c, _ = program.reference(program.make_args(seed))
        print("ok" if torch.allclose(args[3].cpu(), expected_c, rtol=1e-4, atol=1e-3) else "WRONG", flush=True)
    return 0


def dump(directory: Path, param: str, arch: int):
    from tritile.codegen.gluon import emit_module
    from tritile.ir.printer import format_func
    from tritile.lowering import run_passes

    directory.mkdir(parents=True, exist_ok=True)
    target = _target(arch)
    for index, (program, seed) in enumerate(collect(param)):
        final = run_passes(program.func, target)[-1][1]
        src = emit_module(final, target).source
        (directory / f"{index:02d}.ir").write_text(f"# seed={seed} dims={program.dims}\n# {program!r}\n"
                                                  + format_func(final))
        (directory / f"{index:02d}.py").write_text(src)
    print(f"wrote {directory}/NN.ir, NN.py")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--param", default="cuda", choices=["cuda", "cpu"], help="which pytest case's examples")
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--only", type=int, nargs="*", default=None)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--dump", type=Path)
    ap.add_argument("--arch", type=int, default=90, help="target arch for --dump")
    ap.add_argument("--in-process", action="store_true")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    os.chdir(ROOT)
    if a.one is not None:
        return run_one(a.one, a.param)
    if a.list:
        for index, (program, seed) in enumerate(collect(a.param)):
            print(f"[{index:2d}] seed={seed} {program!r}")
        return 0
    if a.dump:
        dump(a.dump, a.param, a.arch)
        return 0
    if a.in_process:
        return in_process(a.param, a.only)
    examples = collect(a.param)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    bad = []
    for index, (program, seed) in enumerate(examples):
        if a.only and index not in a.only:
            continue
        t0 = time.time()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", str(index), "--param", a.param]
        try:
            # own process group so a hung kernel's process is killed alone
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout,
                               start_new_session=True)
            status = (p.stdout.strip().splitlines() or ["?"])[-1] if p.returncode in (0, 1) else \
                f"ERROR rc={p.returncode}: {(p.stderr.strip().splitlines() or [''])[-1]}"
        except subprocess.TimeoutExpired:
            status = f"HANG (> {a.timeout:.0f} s)"
        if status != "ok":
            bad.append(index)
        print(f"[{index:2d}] {status:<28} {time.time() - t0:5.1f}s seed={seed} {program!r}", flush=True)
    print(f"{len(bad)} not ok of {len(examples)}: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
