"""FP8 e4m3 GEMM (examples/gemm_fp8.py) against torch._scaled_mm (cuBLASLt), one run (issue #19).

Per-tensor scales, fp16 out, 4096^3 and 8192^3: TFLOP/s of cuBLASLt, of TileLang 0.1.15 (when
`TILELANG_SITE` is set, bench/tilelang_peer.py) and of each variant of ours (tile configs, stages,
promotion interval, schedule switches), and the accuracy of each against an fp64 product of the
same fp8 values (the largest error relative to max |C|).  All variants of a size are compiled
first, then timed as bench_h100.py times: `triton.testing.do_bench` (median), each candidate three
times with the candidates' order rotated between rounds, the median kept.

    PYTHONPATH=$PWD python bench/gemm_fp8_h100.py --variants

runs SWEEP (session 21's candidates) into bench/results/gemm_fp8_variants_h100.json (or
$OUT/gemm_fp8_variants_h100.json when OUT is set, as bench_h100.py);
`--variants default,p1-4st` a few variants by label, `--variants all` every one; `--sizes 4096`
one size; `--out` another file.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

import tritile
from tritile import switches
from tritile.ir import nodes as ir
from tritile.ir.transform import walk
from tritile.ops.matmul import matmul
import tilelang_peer
from bench_h100 import bench, max_err_of_max, median_of_rotations
from timing import load_example, save

# the one-k-step-per-stage promoting kernel the variants below change (the example's default up to
# session 18; session 19's was the "p1-n_halves-5st" schedule, session 21's is "p1-128x256-h1-4st",
# timed as "default" - each entry of the results records its config)
ONE_STEP_PER_STAGE = dict(block_M=128, block_N=128, block_K=128, num_stages=4, threads=256, promote_every=1)
# (label, ONE_STEP_PER_STAGE with these changes - "default*": the example's tile config -, schedule
# switches it is compiled under);
# "p" = promote_every (k-steps of block_K per promotion; "pK" promotes once, at the end: the
# speed of the mainloop without promotion), "st" = num_stages, "together" = the two consumer
# warpgroups in one partition (TRITILE_CONSUMER_PARTITIONS=0: the schedule before issue #19's
# split), "not-persistent" = one CTA per tile (TRITILE_PERSISTENT=0); "k_pairs" / "n_halves" = the
# example's `overlap_promotion` (each warpgroup adds one partial while its other wgmma group runs:
# the k-steps in pairs, a pair per ring slot, or each k-step as two half-width gemms)
VARIANTS = [
    ("default", {}, {}),
    ("default-together", {}, {"TRITILE_CONSUMER_PARTITIONS": "0"}),
    ("p4-4st", dict(promote_every=4), {}),
    ("p2-4st", dict(promote_every=2), {}),
    ("p1-3st", dict(num_stages=3), {}),
    ("p1-4st", {}, {}),
    ("p1-4st-together", {}, {"TRITILE_CONSUMER_PARTITIONS": "0"}),
    ("p1-4st-not-persistent", {}, {"TRITILE_PERSISTENT": "0"}),
    ("k64-p2-4st", dict(block_K=64, promote_every=2), {}),
    ("k64-p2-5st", dict(block_K=64, num_stages=5, promote_every=2), {}),
    ("pK-4st", dict(promote_every=None), {}),  # None: K // block_K
    ("p1-k_pairs-2st", dict(num_stages=2, overlap_promotion="k_pairs"), {}),
    ("p1-n_halves-3st", dict(num_stages=3, overlap_promotion="n_halves"), {}),
    ("p1-n_halves-4st", dict(overlap_promotion="n_halves"), {}),
    # deeper pipelines the consumer's folded epilogue (lowering/consumer_loop_folding.py) compiles
    # without spills; "-unfolded" = TRITILE_FOLD_CONSUMER=0, the loop with its epilogue
    ("default-unfolded", {}, {"TRITILE_FOLD_CONSUMER": "0"}),
    ("p1-4st-unfolded", {}, {"TRITILE_FOLD_CONSUMER": "0"}),
    ("p1-5st", dict(num_stages=5), {}),
    ("p1-5st-unfolded", dict(num_stages=5), {"TRITILE_FOLD_CONSUMER": "0"}),
    ("p2-5st", dict(num_stages=5, promote_every=2), {}),
    ("p1-k_pairs-3st", dict(num_stages=3, overlap_promotion="k_pairs"), {}),
    ("p1-k_pairs-3st-unfolded", dict(num_stages=3, overlap_promotion="k_pairs"), {"TRITILE_FOLD_CONSUMER": "0"}),
    ("p1-n_halves-5st", dict(num_stages=5, overlap_promotion="n_halves"), {}),
    ("p1-n_halves-6st", dict(num_stages=6, overlap_promotion="n_halves"), {}),
    # the example's `overlap_promotion="n_pieces"` (session 21): each k-step as `pieces` gemms over
    # the tile's columns, their partials in `partials` fragments in turn; "w1" = one piece, the
    # wgmma clearing the partial (DeepGEMM's form); "h1" = two pieces through one partial
    # (128x256: three accumulators of 64 registers a thread); "4wg" = four consumer warpgroups of
    # 64 rows (512 threads, 120 registers each)
    ("p1-w1-5st", dict(num_stages=5, overlap_promotion="n_pieces", pieces=1, partials=1), {}),
    ("p1-w1-6st", dict(num_stages=6, overlap_promotion="n_pieces", pieces=1, partials=1), {}),
    ("p1-128x256-h1-3st", dict(block_N=256, num_stages=3, overlap_promotion="n_pieces", pieces=2, partials=1), {}),
    ("p1-128x256-h1-4st", dict(block_N=256, num_stages=4, overlap_promotion="n_pieces", pieces=2, partials=1), {}),
    ("p1-256x128-4wg-h1-4st", dict(block_M=256, threads=512, num_stages=4, overlap_promotion="n_pieces", pieces=2,
                                   partials=1), {}),
    ("p2-n_halves-5st", dict(num_stages=5, overlap_promotion="n_pieces", pieces=2, partials=2, promote_every=2), {}),
    # "-ahead": TRITILE_RELEASE_AHEAD=1 (lowering/release_ahead.py), the slot a step read released
    # in that step: S stages keep S loads ahead instead of S - 1
    ("default-ahead", {}, {"TRITILE_RELEASE_AHEAD": "1"}),
    ("p1-w1-6st-ahead", dict(num_stages=6, overlap_promotion="n_pieces", pieces=1, partials=1),
     {"TRITILE_RELEASE_AHEAD": "1"}),
    ("p1-128x256-h1-3st-ahead", dict(block_N=256, num_stages=3, overlap_promotion="n_pieces", pieces=2, partials=1),
     {"TRITILE_RELEASE_AHEAD": "1"}),
    ("p1-128x256-h1-4st-ahead", dict(block_N=256, num_stages=4, overlap_promotion="n_pieces", pieces=2, partials=1),
     {"TRITILE_RELEASE_AHEAD": "1"}),
    # the default's panel of output-tile rows the persistent programs walk (T.use_swizzle; 10 by
    # default): at 8192³ A and B (64 MB each) outgrow the 50 MB L2
    *[(f"default-panel{p}", dict(panel_size=p), {}) for p in (4, 20, 32, 64)],
]


# the same GEMM without promotion or scales, fp8 out (tritile.ops.matmul): the speed of the
# mainloop alone at the 128x256 tile a promoting kernel cannot hold in registers (TileLang's
# 1316 TFLOP/s config) and at ours - bytes each tile reads through L2 per flop differ by 4/3
PLAIN = [("plain-128x256-3st", dict(block_M=128, block_N=256, block_K=128, num_stages=3, threads=256)),
         ("plain-128x128-4st", dict(block_M=128, block_N=128, block_K=128, num_stages=4, threads=256))]


# session 21's one-call sweep (bench/NOTES.md): the default, the candidates ptxas compiles for sm_90
# without spills in the k-loop or serialized wgmmas, the accuracy cost of promoting every 2 k-steps,
# the slots released a step earlier (TRITILE_RELEASE_AHEAD=1) on the default, DeepGEMM's form and
# the 128x256 tiles, and the unpromoted 128x256 tile (the mainloop's ceiling at that tile).  The
# four-warpgroup tile ("p1-256x128-4wg-h1-4st": one register's spill per k-step in three
# consumers; four consumer warpgroups behind a producer never ran on a GPU) goes in a process of
# its own
SWEEP = ["default", "p1-n_halves-5st", "p1-w1-5st", "p1-w1-6st", "p1-128x256-h1-3st", "p1-128x256-h1-4st", "p2-n_halves-5st",
         "default-ahead", "p1-w1-6st-ahead", "p1-128x256-h1-3st-ahead", "p1-128x256-h1-4st-ahead", "plain-128x256-3st"]


def _schedule(kernel) -> dict:
    """What the passes made of the kernel: consumer partitions, producer warp, persistence, the
    consumer's pipeline epilogue folded into its loop, its slots released a step earlier."""
    attrs = kernel.func.attrs
    split = next((n.count for n in walk(kernel.func.kernel.body) if isinstance(n, ir.ConsumerPartitions)), 1)
    loops = [n for n in walk(kernel.func.kernel.body) if isinstance(n, ir.For)]
    return {"partitions": split, "producer": "warp_specialization" in attrs,
            "persistent": "persistent_programs" in attrs, "folded": any(n.trips is not None for n in loops),
            "released_ahead": any(n.release_ahead for n in loops)}


def _build(G, n: int, label: str, changes: dict, switch: dict):
    """The example's kernel for n^3 with `changes` (to its tile config for "default*", else to
    ONE_STEP_PER_STAGE), compiled (and first launched) under `switch`."""
    config = {**(G.tile_config("cuda") if label.startswith("default") else ONE_STEP_PER_STAGE), **changes}
    if config["promote_every"] is None:
        config["promote_every"] = n // config["block_K"]
    with switches.overridden(switch):
        kernel = tritile.compile(G.gemm_fp8.fn(n, n, n, **config), out_idx=[3])
    return kernel, config


def _tritile_candidate(G, n: int, label: str, changes: dict, switch: dict, args: tuple, exact) -> tuple:
    """(row entry, call or None): the variant compiled and checked (a failure or a wrong result is
    recorded and not timed)."""
    entry = {"variant": label, "switches": switch}
    try:
        t0 = time.time()
        kernel, config = _build(G, n, label, changes, switch)
        with switches.overridden(switch):
            c = kernel(*args)  # the first launch generates the code
        entry.update(config=config, compile_s=round(time.time() - t0, 1), **_schedule(kernel),
                     max_rel_to_max=max_err_of_max(c, exact))
        if entry["max_rel_to_max"] > 1e-2:
            raise AssertionError(f"wrong result: max error {entry['max_rel_to_max']:.3g} of max |C|")
        return entry, lambda: kernel(*args)
    except Exception as exc:  # one variant's failure (shared memory, a compile error) is a result too
        entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        return entry, None


def _plain_candidate(n: int, label: str, config: dict, a8, b8) -> tuple:
    entry = {"variant": label, "config": config}
    try:
        kernel = matmul.compile(M=n, N=n, K=n, dtype="float8_e4m3", trans_B=True, **config)
        kernel(a8, b8)
        return entry, lambda: kernel(a8, b8)
    except Exception as exc:
        entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        return entry, None


def main(argv=None):
    parser = argparse.ArgumentParser()
    results = os.environ.get("OUT") or Path(__file__).resolve().parent / "results"  # as bench_h100.py
    parser.add_argument("--out", default=str(Path(results) / "gemm_fp8_variants_h100.json"))
    parser.add_argument("--sizes", default="4096,8192")
    parser.add_argument("--variants", nargs="?", const=",".join(SWEEP), default=",".join(SWEEP),
                        help="labels, comma-separated; 'all': every variant; alone or absent: SWEEP")
    args = parser.parse_args(argv)
    variants = {label: (changes, switch) for label, changes, switch in VARIANTS}
    plain = dict(PLAIN)
    chosen = [*variants, *plain] if args.variants == "all" else args.variants.split(",")
    unknown = sorted(set(chosen) - set(variants) - set(plain))
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}")
    G = load_example("gemm_fp8")
    peer = tilelang_peer.status()
    rows, began = [], time.time()
    for n in (int(s) for s in args.sizes.split(",")):
        torch.manual_seed(n)
        a8, sa = G.quantize(torch.randn(n, n, device="cuda"))
        b8, sb = G.quantize(torch.randn(n, n, device="cuda"))
        exact = (a8.double() @ b8.double().t()) * (sa.double() * sb.double())
        scales = torch.stack([sa.float().reshape(()), sb.float().reshape(())])
        flops = 2 * n ** 3
        calls = {"cublaslt": lambda: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float16)}
        row = {"size": n, "cublaslt": {"max_rel_to_max": max_err_of_max(calls["cublaslt"](), exact)}, "tritile": []}
        row["tilelang"] = {"config": tilelang_peer.gemm_fp8_config()} if peer["available"] else {"not_run": peer["reason"]}
        if peer["available"]:
            try:  # TileLang builds with nvcc: a missing toolkit is a recorded error, not the end of the sweep
                tilelang_kernel = tilelang_peer.gemm_fp8(n, n, n)
                row["tilelang"]["max_rel_to_max"] = max_err_of_max(tilelang_kernel(a8, b8, scales), exact)
                calls["tilelang"] = lambda: tilelang_kernel(a8, b8, scales)  # noqa: B023
            except Exception as exc:
                row["tilelang"]["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        for label in chosen:  # built (and first launched) in the order given
            if label in plain:
                entry, call = _plain_candidate(n, label, plain[label], a8, b8)
            else:
                entry, call = _tritile_candidate(G, n, label, *variants[label], (a8, b8, scales), exact)
            row["tritile"].append(entry)
            if call is not None:
                calls[label] = call
        ms = median_of_rotations({name: (lambda call=call: bench(call)) for name, call in calls.items()})
        libraries = {name: ms[name] for name in ("cublaslt", "tilelang") if name in ms}
        for name in libraries:
            row[name].update(ms=round(ms[name], 4), tflops=round(flops / ms[name] / 1e9, 1))
        best = min(libraries.values())
        for entry in row["tritile"]:
            if entry["variant"] in ms:
                t = ms[entry["variant"]]
                entry.update(ms=round(t, 4), tflops=round(flops / t / 1e9, 1), over_cublaslt=round(ms["cublaslt"] / t, 3),
                             over_best_library=round(best / t, 3))
            print(json.dumps({"size": n, **entry}), flush=True)
        print(json.dumps({"size": n, "cublaslt": row["cublaslt"], "tilelang": row["tilelang"]}), flush=True)
        rows.append(row)
        save(args.out, rows)  # after each size: a later size's failure keeps the earlier ones
        del exact
        torch.cuda.empty_cache()
    print(f"total {time.time() - began:.0f} s", flush=True)


if __name__ == "__main__":
    main()
