"""Replay mutated T programs on the GPU against the interpreter.

    python bench/mutant_replay.py [--count 800] [--seed 2030] [--start 0] [--stop N] [--workers 16]
                                  [--bases first|scheduled|library|dynamic|fp8] [--out bench/results/mutant_replay_h100.json]
                                  [--fp-fusion]

The list is `tests/mutated_programs.mutants(seed, count)`: five base kernels (a pipelined GEMM, a
row softmax, a transposing copy, a FlashAttention loop, a column sum by atomics) with one line
changed each; `--bases scheduled` draws from the two scheduled ones instead (a warp-specialized
persistent GEMM with a fused epilogue, a split-K GEMM by TMA reduces), `--bases library` from the
library's attention kernels (the FlashAttention backward, GQA decoding's split and combine),
`--bases dynamic` from two kernels of runtime dims (a GEMM, an RMS norm; run at
`mutated_programs.DYNAMIC_SIZES`), `--bases fp8` from the FP8 GEMM with promoted partial sums.  Worker processes (spawned) compile every mutant for the GPU first (tritile's and
Triton's caches); the main process then takes each one that compiles, runs it on the reference
interpreter in launch order and reversed (`mutated_programs.interpreted`: a mutant whose blocks
race or that reads memory nothing wrote has no defined result and is skipped) and on the GPU on
the same fresh random inputs, and compares every argument after the run
(`mutated_programs.agree`).  `TRITILE_BACKEND` picks the backend as for any kernel.  The JSON holds
the device, versions, date, the counts (refused by a CompileError, undefined, compared, agreed)
and every mismatch or failure with the mutant's source.  A mutant that fails on the GPU ends the
replay there (a faulting kernel leaves the CUDA context unusable): the report names it, and
`--start` resumes after it.  While a mutant runs on the GPU, `<out>.running` holds its index and
source: a kernel that never returns (a broken barrier protocol) is named there when the replay
is killed.  The GPU kernels are compiled with `TRITILE_FP_FUSION=off` (every float operation
rounded, as the interpreter does) unless `--fp-fusion` is given: a contracted `S * c - m * c`
missed exp2(0) = 1 by an ulp, which an int8 cast then truncated to 0 (seed 2031, mutant 341).
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import traceback
from concurrent.futures import ProcessPoolExecutor
import multiprocessing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from timing import save_report  # noqa: E402
DIRECTORY = os.path.join(tempfile.gettempdir(), "tritile_mutants")


def _path(seed: int, index: int, bases: str) -> str:
    return os.path.join(DIRECTORY, f"mutant_{bases}_{seed}_{index}.py")


def _bases(name: str) -> dict:
    import mutated_programs

    return {"first": mutated_programs.BASES, "scheduled": mutated_programs.SCHEDULED_BASES,
            "library": mutated_programs.LIBRARY_BASES, "dynamic": mutated_programs.DYNAMIC_BASES,
            "fp8": mutated_programs.FP8_BASES}[name]


def _warm(args) -> int:
    """Worker: compile mutant `index` for the GPU (fills the on-disk caches); errors are the main
    process's to report."""
    index, count, seed, bases = args
    import tritile
    from mutated_programs import load, mutants

    make = load(mutants(seed, count, _bases(bases))[index][1], _path(seed, index, bases))
    try:
        if make is not None:
            tritile.compile(make()).get_source("ptx")
    except Exception:  # noqa: BLE001 - reported by the main process
        pass
    return index


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=800)
    parser.add_argument("--seed", type=int, default=2030)
    parser.add_argument("--start", type=int, default=0, help="the first mutant to replay")
    parser.add_argument("--stop", type=int, default=None, help="the mutant to stop before (default: all)")
    parser.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "mutant_replay_h100.json"))
    parser.add_argument("--bases", choices=("first", "scheduled", "library", "dynamic", "fp8"), default="first",
                        help="the five first base kernels, the scheduled ones, the library's, those of runtime "
                             "dims or the FP8 GEMM (mutated_programs.SCHEDULED_BASES, LIBRARY_BASES, "
                             "DYNAMIC_BASES, FP8_BASES)")
    parser.add_argument("--fp-fusion", action="store_true", help="let Triton contract a * b + c (the default of kernels)")
    args = parser.parse_args()
    os.environ["TRITILE_FP_FUSION"] = "on" if args.fp_fusion else "off"  # the spawned workers inherit it

    import torch

    import tritile
    from mutated_programs import agree, interpreted, load, mutants, random_arguments

    if not torch.cuda.is_available():
        sys.exit("mutant_replay.py needs a CUDA GPU")
    os.makedirs(DIRECTORY, exist_ok=True)
    drawn = mutants(args.seed, args.count, _bases(args.bases))[:args.stop]
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_warm, [(i, args.count, args.seed, args.bases) for i in range(args.start, len(drawn))]))

    counts, mismatches, failures = collections.Counter(), [], []
    for index, (base, src) in enumerate(drawn):
        if index < args.start:
            continue
        make = load(src, _path(args.seed, index, args.bases))
        try:
            func = make() if make is not None else None
        except Exception:  # noqa: BLE001 - the mutant's own Python fails (an annotation run at its def)
            func = None
        if func is None:
            counts["not python"] += 1
            continue
        try:
            reference = tritile.compile(func, target="cpu", backend="auto")  # tritile's interpreter (`interpreted`)
            on_gpu = tritile.compile(func)
            on_gpu.get_source("ptx")
        except tritile.CompileError:
            counts["refused"] += 1
            continue
        inputs = random_arguments(reference.func, torch.Generator().manual_seed(index))
        try:
            undefined, expected = interpreted(reference, inputs)
        except (tritile.CompileError, ValueError, TypeError, RuntimeError):
            counts["refused by the interpreter"] += 1
            continue
        if undefined:
            counts["undefined"] += 1
            continue
        actual = [t.cuda() for t in inputs]
        with open(args.out + ".running", "w") as running:  # names the mutant a hung kernel stops at
            running.write(f"{index}\n{src}")
        try:
            on_gpu(*actual)
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 - recorded; the CUDA context may be lost: stop here
            failures.append({"index": index, "base": base, "source": src, "error": traceback.format_exc()[-3000:]})
            break
        counts["compared"] += 1
        wrong = [i for i, (x, y) in enumerate(zip(actual, expected)) if not agree(x, y)]
        if wrong:
            i = wrong[0]
            difference = (actual[i].cpu().double() - expected[i].double()).abs().nan_to_num(float("inf"))
            mismatches.append({"index": index, "base": base, "source": src, "parameter": i,
                               "max_difference": float(difference.max()),
                               "elements_differing": int((difference != 0).sum()), "elements": difference.numel()})
        else:
            counts["agreed"] += 1
        print(f"\r{index + 1}/{len(drawn)} {dict(counts)}, mismatched {len(mismatches)}, failed {len(failures)}",
              end="", flush=True)
    print()
    save_report(args.out, {"backend": os.environ.get("TRITILE_BACKEND", "auto"), "bases": args.bases, "seed": args.seed,
                           "count": len(drawn), "start": args.start, **counts, "mismatched": len(mismatches),
                           "failed": len(failures), "mismatches": mismatches, "failures": failures})


if __name__ == "__main__":
    main()
