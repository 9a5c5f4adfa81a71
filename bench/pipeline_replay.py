"""GPU replay of thousands of generated pipelined programs: compile, replay the mbarrier protocol
on the host, launch, compare with torch.

    PYTHONPATH=$PWD python bench/pipeline_replay.py                  # 2000 programs (H100)
    PYTHONPATH=$PWD python bench/pipeline_replay.py --smoke          # 24 programs, a quick check
    PYTHONPATH=$PWD python bench/pipeline_replay.py --count 6 --dry-run   # CPU: compile for cuda:90, no launch

The list is fixed by `--seed`: a third are tests/pipeline_programs.py's hand-built GEMMs
(`test_pipeline_properties.replay_programs`: sibling loops, manual schedules, guards, runtime
trip counts), two thirds tests/pipeline_kernels.py's generated kernels (`replay_kernels`: GEMM
chains with epilogues and reductions between loops, FlashAttention causal or not, 64-256 tiles,
128/256 threads, runtime sizes, drawn schedule switches; every fourth of each kind "wide", up to
36 tiles or 16 blocks, so that persistent programs walk several tiles on the GPU).

Phases:
1. compile - `--workers` spawned processes, each given its own interleaved chunk of the list,
   lower and compile each program for the device's target (warming tritile's and Triton's disk
   caches, both set to one fresh directory under /tmp unless `--cache-dir`), then replay its
   mbarrier protocol on the host (`pipeline_programs.mbarrier_problems`).  A program whose
   replay finds a problem is recorded and never launched.  A worker killed by the compiler (an
   LLVM assertion aborts the process) breaks the pool: per-worker progress files name the
   programs in flight, each is compiled again alone, and the one that dies again is a
   `compile_crash`; a compile running past `--compile-timeout` is a `compile_hang`.  Every
   `--interpret-every`-th program is also run through the CPU interpreter (frontend IR and
   final IR) against a CPU torch reference: interpreting all of them at 256 tiles would take
   longer than the GPU run.
2. launch - `--launchers` child processes, each given an interleaved chunk of the replay-clean
   programs, compile each again (cache hits), launch it on fresh random inputs and compare with
   the torch reference computed on the GPU.  A thread of the parent watches each: a program that does not finish within `--timeout` seconds is recorded as
   a hang, that child killed and a new one started after it; a launch error (a fault leaves the
   CUDA context unusable) also restarts the child.

Writes bench/results/pipeline_replay_h100.json (`--out`; `$OUT/pipeline_replay_h100.json` when
OUT is set): device, versions, date, N, per-phase wall times, compile throughput, passes,
mismatches / hangs / compile failures / replay problems / launch errors / interpreter
mismatches with each program's repr (`eval`-able with tests/pipeline_kernels.py's and
pipeline_programs.py's names).  Prints one summary line.
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import queue
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, wait
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

SEED = 20261207
OLD_SHARE = 3  # one program in OLD_SHARE is a hand-built GEMM of pipeline_programs.py


def programs(count: int, seed: int) -> list:
    """[(program, argument seed)], the same list in every process for (count, seed)."""
    from pipeline_kernels import SM90_SHARED, replay_kernels
    from test_pipeline_properties import replay_programs

    old = iter(replay_programs(count // OLD_SHARE, seed))
    new = iter(replay_kernels(count - count // OLD_SHARE, seed + 1, max_shared=SM90_SHARED, wide_every=4))
    # range(count) has exactly count // OLD_SHARE positions i % OLD_SHARE == OLD_SHARE - 1
    return [next(old) if i % OLD_SHARE == OLD_SHARE - 1 else next(new) for i in range(count)]


def _target(dry_run: bool):
    from tritile.runtime.target import Target

    if dry_run:
        return Target("cuda", 90)
    import torch

    major, minor = torch.cuda.get_device_capability()
    return Target("cuda", major * 10 + minor)


def _compile(program, target):
    from pipeline_kernels import lower

    from tritile.codegen.gluon import compile_kernel

    return compile_kernel(lower(program, target)[-1][1], target)


def _close(actual, want, rtol, atol) -> str:
    """'' when close, else torch's message."""
    import torch

    try:
        torch.testing.assert_close(actual.cpu(), want.cpu(), rtol=rtol, atol=atol)
        return ""
    except AssertionError as err:
        return str(err)


def _interpret(program, seed, target) -> str:
    """Interpreter(frontend IR) and interpreter(final IR) against torch on CPU: '' or the mismatch."""
    from pipeline_kernels import lower, program_args, program_dims, program_expected, program_outputs

    from tritile.interpreter import execute

    stages = lower(program, target)
    args = program_args(program, seed)
    expected = program_expected(program, args)
    for name, func in (stages[0], stages[-1]):
        run = [t.clone() for t in args]
        execute(func, run, program_dims(program, run))
        for actual, (want, rtol, atol) in zip(program_outputs(program, run), expected):
            message = _close(actual, want, rtol, atol)
            if message:
                return f"interpreter after {name}: {message}"
    return ""


def compile_chunk(indices, count, seed, dry_run, interpret_every, progress) -> None:
    """Phase 1 in a worker: for each index, a line {"start": i} and then [i, status, message,
    compile seconds] appended to the file `progress`, so that a compiler abort (an LLVM
    assertion kills the process) names the program it died on."""
    from pipeline_kernels import program_args, program_dim_values
    from pipeline_programs import mbarrier_problems

    listing = programs(count, seed)
    target = _target(dry_run)
    with open(progress, "a") as log:
        def record(*row):
            log.write(json.dumps(list(row)) + "\n")
            log.flush()

        for i in indices:
            program, arg_seed = listing[i]
            log.write(json.dumps({"start": i}) + "\n")
            log.flush()
            start = time.perf_counter()
            try:
                kernel = _compile(program, target)
            except Exception as err:  # a CompileError, or a crash of the compiler: both are findings
                record(i, "compile_failure", f"{type(err).__name__}: {err}"[:4000], time.perf_counter() - start)
                continue
            seconds = time.perf_counter() - start
            try:
                args = program_args(program, arg_seed)
                problems = mbarrier_problems(kernel.source, args, program_dim_values(program, args))
            except Exception as err:
                problems = [f"the replay itself failed: {type(err).__name__}: {err}"]
            if problems:
                record(i, "replay_problem", problems[0][:4000], seconds)
                continue
            if interpret_every and i % interpret_every == 0:
                try:
                    message = _interpret(program, arg_seed, target)
                except Exception as err:
                    message = f"interpreter crashed: {type(err).__name__}: {err}"
                if message:
                    record(i, "interpreter_mismatch", message[:4000], seconds)
                    continue
            record(i, "ok", "", seconds)


def _read_progress(path) -> tuple:
    """(finished rows, the index started last without a result or None, seconds since the
    file last grew) of a progress file."""
    rows, started, path = [], None, Path(path)
    if not path.exists():
        return rows, started, 0.0
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if isinstance(entry, dict):
            started = entry["start"]
        else:
            rows.append(tuple(entry))
            started = None
    return rows, started, time.time() - path.stat().st_mtime


def _compile_round(chunks, count, seed, dry_run, interpret_every, paths, compile_timeout) -> tuple:
    """One spawn pool over `chunks`: (rows, indices started without a result, indices whose
    compile ran past `compile_timeout` s).  A compile that hangs has the pool's processes killed
    (they are this script's own children); a worker that dies breaks the pool, which ends the
    other workers too, so their started programs are only suspects."""
    hung = []
    with ProcessPoolExecutor(len(chunks), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(compile_chunk, chunk, count, seed, dry_run, interpret_every, str(path))
                   for chunk, path in zip(chunks, paths)]
        while not all(f.done() for f in futures):
            wait(futures, timeout=5)
            for path in paths:
                _, started, idle = _read_progress(path)
                if started is not None and idle > compile_timeout and started not in hung:
                    hung.append(started)
            if hung:
                for process in list(pool._processes.values()):
                    process.kill()
                break
        for future in futures:
            try:
                future.result()
            except Exception:  # BrokenProcessPool: the progress files say who got how far
                pass
    rows, suspects = [], []
    for path in paths:
        done, started, _ = _read_progress(path)
        rows += done
        if started is not None and started not in hung:
            suspects.append(started)
    return rows, suspects, hung


def run_compiles(count, seed, workers, dry_run, interpret_every, scratch, compile_timeout) -> list:
    """Phase 1: interleaved chunks over a spawn pool, then again over what a broken pool left.
    A program started when the pool broke is compiled again alone: dying again makes it a
    `compile_crash` (an LLVM assertion aborts the process); a compile running past
    `compile_timeout` is a `compile_hang`."""
    todo, results, rounds = list(range(count)), [], 0

    def new_paths(n):
        nonlocal rounds
        rounds += 1
        return [scratch / f"progress-{rounds}-{w}.jsonl" for w in range(n)]

    while todo:
        n = max(1, min(workers, len(todo)))
        rows, suspects, hung = _compile_round([todo[w::n] for w in range(n)], count, seed, dry_run,
                                              interpret_every, new_paths(n), compile_timeout)
        results += rows + [(i, "compile_hang", f"compile ran past {compile_timeout} s", compile_timeout) for i in hung]
        for i in suspects:
            alone, crashed, hung_alone = _compile_round([[i]], count, seed, dry_run, interpret_every, new_paths(1),
                                                        compile_timeout)
            results += alone
            results += [(j, "compile_crash", "the compiling process died (e.g. an LLVM assertion; its stderr "
                         "is above)", 0.0) for j in crashed]
            results += [(j, "compile_hang", f"compile ran past {compile_timeout} s", compile_timeout)
                        for j in hung_alone]
            for j in crashed + hung_alone:
                print(f"  compile crash or hang: program {j}", flush=True)
        done = {row[0] for row in results}
        remaining = [i for i in todo if i not in done]
        if len(remaining) == len(todo):  # no progress at all: do not loop forever
            results += [(i, "compile_crash", "the compile workers died before compiling", 0.0) for i in todo]
            break
        todo = remaining
    return results


def launch_child(indices, count, seed, results):
    """Phase 2 in a child: for each index, ("start", i), then ("done", i, status, message, s).
    Exits after a launch error: the CUDA context may be unusable."""
    import torch

    from pipeline_kernels import program_args, program_dims, program_expected, program_outputs

    listing = programs(count, seed)
    target = _target(False)
    for i in indices:
        program, arg_seed = listing[i]
        results.put(("start", i))
        start = time.perf_counter()
        try:
            kernel = _compile(program, target)
            args = program_args(program, arg_seed, "cuda")
            kernel.launch(args, program_dims(program, args))
            torch.cuda.synchronize()
            messages = [_close(actual, want, rtol, atol) for actual, (want, rtol, atol)
                        in zip(program_outputs(program, args), program_expected(program, args))]
            message = next((m for m in messages if m), "")
            results.put(("done", i, "mismatch" if message else "pass", message[:4000], time.perf_counter() - start))
        except Exception as err:
            results.put(("done", i, "launch_error", f"{type(err).__name__}: {err}"[:4000], time.perf_counter() - start))
            return


def run_launches(indices, count, seed, timeout) -> list:
    """Phase 2 under the watchdog: [(index, status, message, seconds)], hangs included."""
    ctx = multiprocessing.get_context("spawn")
    results, out, todo = ctx.Queue(), [], list(indices)
    while todo:
        child = ctx.Process(target=launch_child, args=(todo, count, seed, results), daemon=True)
        child.start()
        current, started = None, time.perf_counter()
        finished = set()
        while len(finished) < len(todo):
            try:
                message = results.get(timeout=1.0)
            except queue.Empty:
                waited = time.perf_counter() - started
                if not child.is_alive():  # exited after a launch error, or died (a fault in a launch)
                    if current is not None:
                        out.append((current, "launch_error", "the launch process died", waited))
                        finished.add(current)
                        print(f"  launch process died: program {current}", flush=True)
                    break
                # before its first program the child imports and initialises CUDA
                if waited > (timeout if current is not None else timeout + 120):
                    child.kill()
                    child.join()
                    if current is not None:
                        out.append((current, "hang", f"no result after {timeout} s", waited))
                        finished.add(current)
                        print(f"  hang: program {current}", flush=True)
                    break
                continue
            if message[0] == "start":
                current, started = message[1], time.perf_counter()
            else:
                out.append(message[1:])
                finished.add(message[1])
                current, started = None, time.perf_counter()
                if message[2] != "pass":
                    print(f"  {message[2]}: program {message[1]}", flush=True)
                if len(out) % 100 == 0:
                    print(f"  a launcher has run {len(out)} programs", flush=True)
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
        if not finished:  # the child died before its first program: do not loop forever
            out += [(i, "launch_error", "the launch process died before launching", 0.0) for i in todo]
            break
        todo = [i for i in todo if i not in finished]
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--smoke", action="store_true", help="24 programs")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds one launch may take")
    parser.add_argument("--launchers", type=int, default=6,
                        help="launch processes sharing the GPU (the host side of a launch dominates)")
    parser.add_argument("--compile-timeout", type=float, default=300.0,
                        help="seconds one program's compile may take before it counts as a hang")
    parser.add_argument("--interpret-every", type=int, default=10,
                        help="interpret every n-th program on the CPU too (0: none)")
    parser.add_argument("--dry-run", action="store_true", help="compile for cuda:90 and replay; no launch")
    parser.add_argument("--cache-dir", default=None, help="default: a fresh directory under /tmp")
    parser.add_argument("--out", default=None)
    opts = parser.parse_args(argv)
    count = 24 if opts.smoke else opts.count
    cache = Path(opts.cache_dir or tempfile.mkdtemp(prefix="pipeline_replay_"))
    os.environ["TRITILE_CACHE_DIR"] = str(cache / "tritile")
    os.environ["TRITON_CACHE_DIR"] = str(cache / "triton")  # inherited by the spawned processes
    out_path = Path(opts.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "bench" / "results")
                    / ("pipeline_replay_dry_run.json" if opts.dry_run else "pipeline_replay_h100.json"))

    import torch
    import triton

    listing = programs(count, opts.seed)
    kinds = {}
    for program, _ in listing:
        kinds[type(program).__name__] = kinds.get(type(program).__name__, 0) + 1
    print(f"{count} programs {kinds}, {opts.workers} compile workers, caches in {cache}", flush=True)

    start = time.perf_counter()
    workers = max(1, min(opts.workers, count))
    compiled = run_compiles(count, opts.seed, workers, opts.dry_run, opts.interpret_every, cache,
                            opts.compile_timeout)
    compile_wall = time.perf_counter() - start
    compile_seconds = sum(s for _, _, _, s in compiled)
    rate = count / compile_wall
    print(f"compile + host replay: {compile_wall:.1f} s wall for {count} programs = {rate:.2f} programs/s "
          f"({compile_seconds / max(count, 1):.2f} s of compile per program); 2000 programs would take "
          f"~{2000 / rate / 60:.1f} min with {workers} workers (~{2000 / rate * workers / 14 / 60:.1f} min with 14, "
          f"if cores scale)", flush=True)

    ok = sorted(i for i, status, _, _ in compiled if status == "ok")
    launched, launch_wall = [], 0.0
    if not opts.dry_run:
        start = time.perf_counter()
        launchers = max(1, min(opts.launchers, len(ok)))
        with ThreadPoolExecutor(launchers) as threads:  # each thread watches its own launch process
            for rows in threads.map(lambda chunk: run_launches(chunk, count, opts.seed, opts.timeout),
                                    [ok[w::launchers] for w in range(launchers)]):
                launched += rows
        launch_wall = time.perf_counter() - start

    def entries(rows, status):
        return [{"index": i, "program": repr(listing[i][0]), "arg_seed": listing[i][1], "message": m,
                 "seconds": round(s, 3)} for i, st, m, s in sorted(rows) if st == status]

    report = {
        "device": "none (dry run)" if opts.dry_run else torch.cuda.get_device_name(),
        "target": str(_target(opts.dry_run)), "torch": torch.__version__, "triton": triton.__version__,
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "seed": opts.seed, "N": count,
        "kinds": kinds, "workers": workers,
        "interpreted": len([i for i in range(count) if opts.interpret_every and i % opts.interpret_every == 0]),
        "passed": sum(st == "pass" for _, st, _, _ in launched),
        "compiled_and_replayed_clean": len(ok),
        "wall_seconds": {"compile_and_host_replay": round(compile_wall, 1), "launch": round(launch_wall, 1)},
        "compile_programs_per_second": round(rate, 3),
        "mismatches": entries(launched, "mismatch"), "hangs": entries(launched, "hang"),
        "launch_errors": entries(launched, "launch_error"),
        "compile_failures": entries(compiled, "compile_failure"),
        "compile_crashes": entries(compiled, "compile_crash"), "compile_hangs": entries(compiled, "compile_hang"),
        "replay_problems": entries(compiled, "replay_problem"),
        "interpreter_mismatches": entries(compiled, "interpreter_mismatch"),
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=1) + "\n")
    counts = {key: len(report[key]) for key in ("mismatches", "hangs", "launch_errors", "compile_failures",
                                                  "compile_crashes", "compile_hangs", "replay_problems", "interpreter_mismatches")}
    launched_text = "not launched (dry run)" if opts.dry_run else f"{report['passed']}/{len(ok)} launched passed"
    print(f"pipeline_replay: N={count} {launched_text}, {len(ok)} compiled+replayed clean, "
          + ", ".join(f"{k} {v}" for k, v in counts.items())
          + f"; compile {compile_wall:.0f} s, launch {launch_wall:.0f} s -> {out_path}")
    return 0 if not any(counts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
