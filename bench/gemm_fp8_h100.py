"""FP8 e4m3 GEMM (examples/gemm_fp8.py) against torch._scaled_mm (cuBLASLt), one run (issue #19).

Per-tensor scales, fp16 out, 4096^3 and 8192^3: TFLOP/s of cuBLASLt and of each variant of ours
(tile configs, stages, promotion interval, schedule switches), and the accuracy of each against
an fp64 product of the same fp8 values (the largest error relative to max |C|).  Times are the
median per call of batches of back-to-back calls (`median_batched_ms`); cuBLASLt is timed before
and after the variants of a size (`ms_after`: the GPU's heat moves both alike).

    PYTHONPATH=$PWD python bench/gemm_fp8_h100.py --out bench/results/gemm_fp8_h100.json

`--sizes 4096` runs one size; `--variants default,p1-4st` a few variants by label.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import tritile
from tritile import switches
from tritile.ir import nodes as ir
from tritile.ir.transform import walk
from tritile.ops.matmul import matmul
from timing import load_example, median_batched_ms, save

# the one-k-step-per-stage promoting kernel the variants below change (the example's default up to
# session 18; its default now is the "p1-n_halves-5st" schedule, timed as "default")
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
]


# the same GEMM without promotion or scales, fp8 out (tritile.ops.matmul): the speed of the
# mainloop alone at the 128x256 tile a promoting kernel cannot hold in registers (TileLang's
# 1316 TFLOP/s config) and at ours - bytes each tile reads through L2 per flop differ by 4/3
PLAIN = [("plain-128x256-3st", dict(block_M=128, block_N=256, block_K=128, num_stages=3, threads=256)),
         ("plain-128x128-4st", dict(block_M=128, block_N=128, block_K=128, num_stages=4, threads=256))]


def _accuracy(c, exact) -> dict:
    top = exact.abs().max().item()
    return {"max_rel_to_max": round((c.double() - exact).abs().max().item() / top, 7)}


def _schedule(kernel) -> dict:
    """What the passes made of the kernel: consumer partitions, producer warp, persistence, the
    consumer's pipeline epilogue folded into its loop."""
    attrs = kernel.func.attrs
    split = next((n.count for n in walk(kernel.func.kernel.body) if isinstance(n, ir.ConsumerPartitions)), 1)
    return {"partitions": split, "producer": "warp_specialization" in attrs,
            "persistent": "persistent_programs" in attrs,
            "folded": any(isinstance(n, ir.For) and n.trips is not None for n in walk(kernel.func.kernel.body))}


def _build(G, n: int, label: str, changes: dict, switch: dict):
    """The example's kernel for n^3 with `changes` (to its tile config for "default*", else to
    ONE_STEP_PER_STAGE), compiled (and first launched) under `switch`."""
    config = {**(G.tile_config("cuda") if label.startswith("default") else ONE_STEP_PER_STAGE), **changes}
    if config["promote_every"] is None:
        config["promote_every"] = n // config["block_K"]
    with switches.overridden(switch):
        kernel = tritile.compile(G.gemm_fp8.fn(n, n, n, **config), out_idx=[3])
    return kernel, config


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", default="4096,8192")
    parser.add_argument("--variants", default=",".join([label for label, _, _ in VARIANTS] + [label for label, _ in PLAIN]))
    args = parser.parse_args(argv)
    chosen = args.variants.split(",")
    G = load_example("gemm_fp8")
    rows, began = [], time.time()
    for n in (int(s) for s in args.sizes.split(",")):
        torch.manual_seed(n)
        a8, sa = G.quantize(torch.randn(n, n, device="cuda"))
        b8, sb = G.quantize(torch.randn(n, n, device="cuda"))
        exact = (a8.double() @ b8.double().t()) * (sa.double() * sb.double())
        scales = torch.stack([sa.float().reshape(()), sb.float().reshape(())])
        flops = 2 * n ** 3
        cublas = lambda: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float16)  # noqa: E731
        ms = median_batched_ms(cublas)
        row = {"size": n, "cublaslt": {"ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1), **_accuracy(cublas(), exact)},
               "tritile": []}
        for label, changes, switch in VARIANTS:
            if label not in chosen:
                continue
            entry = {"variant": label, "switches": switch}
            try:
                t0 = time.time()
                kernel, config = _build(G, n, label, changes, switch)
                with switches.overridden(switch):
                    c = kernel(a8, b8, scales)  # the first launch generates the code
                entry.update(config=config, compile_s=round(time.time() - t0, 1), **_schedule(kernel), **_accuracy(c, exact))
                t = median_batched_ms(lambda: kernel(a8, b8, scales))  # noqa: B023
                entry.update(ms=round(t, 4), tflops=round(flops / t / 1e9, 1), ratio=round(ms / t, 3))
            except Exception as exc:  # one variant's failure (shared memory, a compile error) is a result too
                entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            print(json.dumps({"size": n, **entry}), flush=True)
            row["tritile"].append(entry)
        for label, config in PLAIN:
            if label not in chosen:
                continue
            entry = {"variant": label, "config": config}
            try:
                kernel = matmul.compile(M=n, N=n, K=n, dtype="float8_e4m3", trans_B=True, **config)
                kernel(a8, b8)
                t = median_batched_ms(lambda: kernel(a8, b8))  # noqa: B023
                entry.update(ms=round(t, 4), tflops=round(flops / t / 1e9, 1), ratio=round(ms / t, 3))
            except Exception as exc:
                entry["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            print(json.dumps({"size": n, **entry}), flush=True)
            row["tritile"].append(entry)
        after = median_batched_ms(cublas)
        row["cublaslt"]["ms_after"] = round(after, 4)
        print(json.dumps({"size": n, "cublaslt": row["cublaslt"]}), flush=True)
        rows.append(row)
        del exact
        torch.cuda.empty_cache()
    print(f"total {time.time() - began:.0f} s", flush=True)
    save(args.out, rows)


if __name__ == "__main__":
    main()
