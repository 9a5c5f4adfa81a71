"""Replay the generated expression / reduction kernels on the GPU against the interpreter.

    python bench/semantics_replay.py [--count 200] [--seed 2024] [--lanes 16] [--workers 16]
                                     [--out bench/results/semantics_replay_h100.json]

The list is `tests/expression_programs.replay_programs(count, seed, lanes)` (with the default seed
the one `tests/test_semantics_properties.py::test_replayed_programs_on_gpu` runs; another seed
draws other programs; more lanes give each thread several, as library kernels have).  Worker processes
(spawned) compile every program for the GPU first, filling tritile's and Triton's on-disk
caches; the main process then compiles each (cache hits), runs it on tritile's interpreter (CPU
tensors, whatever `TRITILE_BACKEND` picks for the GPU) and on the GPU, and compares them exactly (`expression_programs.agrees`: equal, or both
among the outputs the semantics allow where a float max / min of +0 and -0 may pick either zero).  A program that
fails to compile or to run is recorded with its error and the replay goes on.  The GPU kernels are
compiled with `TRITILE_FP_FUSION=off` (every float operation rounded, as the interpreter does;
docs/semantics.md) unless `--fp-fusion` is given: with Triton's fused multiply-adds, seed 2027's
800 programs had 2 one-ulp differences (bench/NOTES.md, session 25).  The JSON holds the
device, torch / triton versions, the date, counts, and every mismatch or failure with the
program's source and both outputs.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor
import multiprocessing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from timing import save_report  # noqa: E402


def _warm(args) -> tuple:
    """Worker: compile program `index` for the GPU (fills the on-disk caches)."""
    index, count, seed, lanes = args
    import expression_programs as E
    try:
        kernel = E.build(E.replay_programs(count, seed, lanes)[index])
        kernel.get_source("ptx")  # compiles for the kernel's target without launching
        return index, None
    except Exception as err:  # recorded, not fatal: the main process reports it with the run
        return index, f"{type(err).__name__}: {err}"[-2000:]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--lanes", type=int, default=16, help="the programs' length (wider: several lanes a thread)")
    parser.add_argument("--fp-fusion", action="store_true", help="let Triton contract multiply-adds (not exact)")
    parser.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "semantics_replay_h100.json"))
    args = parser.parse_args()
    os.environ["TRITILE_FP_FUSION"] = "on" if args.fp_fusion else "off"  # the spawned workers inherit it

    import torch
    import expression_programs as E

    if not torch.cuda.is_available():
        sys.exit("semantics_replay.py needs a CUDA GPU")
    programs = E.replay_programs(args.count, args.seed, args.lanes)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=context) as pool:
        warm_errors = dict(pool.map(_warm, [(i, args.count, args.seed, args.lanes) for i in range(args.count)]))

    results = {"matched": 0, "mismatched": [], "failed": []}
    for index, program in enumerate(programs):
        try:
            kernel = E.build(program)
            a, b = E.inputs(program, torch.Generator().manual_seed(index))
            interpreted = E.interpreted(kernel, a, b)
            on_gpu = kernel(a.cuda(), b.cuda()).cpu()
            torch.cuda.synchronize()
        except Exception:
            results["failed"].append({"index": index, "source": program.source,
                                      "warm_error": warm_errors.get(index),
                                      "error": traceback.format_exc()[-3000:]})
            continue
        if E.agrees(on_gpu, interpreted, program, a, b):
            results["matched"] += 1
        else:
            results["mismatched"].append({
                "index": index, "source": program.source,
                "a": a.float().tolist(), "b": b.float().tolist(),
                "gpu": on_gpu.float().tolist(), "interpreter": interpreted.float().tolist(),
                "reference": E.reference(program, a, b).float().tolist()})
        print(f"\r{index + 1}/{len(programs)} matched {results['matched']}, mismatched "
              f"{len(results['mismatched'])}, failed {len(results['failed'])}", end="", flush=True)
    print()
    save_report(args.out, {"capability": list(torch.cuda.get_device_capability()), "seed": args.seed,
                           "lanes": args.lanes, "fp_fusion": args.fp_fusion, "count": len(programs),
                           "matched": results["matched"], "mismatched": len(results["mismatched"]),
                           "failed": len(results["failed"]), "mismatches": results["mismatched"],
                           "failures": results["failed"]})


if __name__ == "__main__":
    main()
