"""A/B of code-generation schedules on one GPU: attention and GEMM under each variant.

Variants (`VARIANTS`: name -> environment), each in its own process with fresh tritile and
Triton caches, so nothing compiled by one variant serves another:
  base       - TRITILE_WARP_SPECIALIZE=0: the kernel's warps issue their own TMA copies;
  split      - a producer warp, and each consumer warpgroup its own partition owning its rows
               (lowering/consumer_partitions.py), one CTA per tile (TRITILE_PERSISTENT=0);
  persistent - the defaults: split kernels also persistent, one CTA per SM walking the tiles
               (lowering/persistent_tiles.py), the producer running ahead into the next tile;
  producer   - TRITILE_WARP_SPECIALIZE=1: every kernel with a qualifying loop gets a producer
               warp (GEMMs too, whose consumers stay whole) and so is persistent as well.
`EXTRA_VARIANTS='{"name": {"SWITCH": "value"}}'` adds variants (JSON), `VARIANTS=a,b` picks
some of them, `GEMM_SHAPES=16384x1024x1024,...` replaces the GEMM shapes (M x N x K; default
4096^3 and 8192^3), `CASES=gemm` (or `attn`, or `d128` / `d64`: attention of that head dim) some of the cases; `ROUNDS` rounds (odd ones in reverse
order) while fewer than `ROUND_SECONDS` (60) have passed.
Every result is checked against torch before it is timed.  SDPA cuDNN and cuBLAS are timed in
the parent.  Run from the repo root:  PYTHONPATH=$PWD python bench/schedule_variants.py
(Earlier runs of this script, in bench/NOTES.md, compared the opt-in TMA barrier lanes,
TRITILE_TMA_LANES=1, and a producer warp without the split against the base schedule.)
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from child_runs import attention_inputs, attn_flops, run_in_child, serve_child  # noqa: E402

ATTN = [(4, 32, 4096, 128, False), (4, 32, 4096, 128, True), (16, 16, 1024, 64, False), (16, 16, 1024, 64, True)]
GEMM = [tuple(int(d) for d in shape.split("x"))
        for shape in os.environ.get("GEMM_SHAPES", "4096x4096x4096,8192x8192x8192").split(",")]
VARIANTS = {"base": {"TRITILE_WARP_SPECIALIZE": "0", "TRITILE_PERSISTENT": "0"},
            "split": {"TRITILE_PERSISTENT": "0"},
            "persistent": {},
            "producer": {"TRITILE_WARP_SPECIALIZE": "1"}}
VARIANTS.update(json.loads(os.environ.get("EXTRA_VARIANTS", "{}")))
if os.environ.get("VARIANTS"):
    VARIANTS = {name: VARIANTS[name] for name in os.environ["VARIANTS"].split(",")}
if os.environ.get("CASES") == "gemm":
    ATTN = []
elif os.environ.get("CASES") in ("attn", "d128", "d64"):
    GEMM = []
    if os.environ["CASES"] != "attn":
        ATTN = [case for case in ATTN if f"d{case[3]}" == os.environ["CASES"]]
CANDIDATE, REFERENCE = list(VARIANTS)[-1], list(VARIANTS)[0]


def bench(fn) -> float:
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


def run_variant(variant: str) -> dict:
    """Time tritile's attention and GEMM under `variant` (called in a child process)."""
    os.environ.update(VARIANTS[variant])
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from examples.flash_attention import tritile_attention
    from examples.gemm import tritile_matmul

    out = {}
    torch.manual_seed(0)
    for (B, H, S, D, causal) in ATTN:
        q, k, v = attention_inputs(B, H, S, D)
        err = rel_err(tritile_attention(q, k, v, causal), sdpa(q, k, v, is_causal=causal))
        ms = bench(lambda: tritile_attention(q, k, v, causal))
        out[f"attn {B}x{H}x{S}x{D}{' causal' if causal else ''}"] = (attn_flops(B, H, S, D, causal) / ms / 1e9, err)
    for (M, N, K) in GEMM:
        a = torch.randn(M, K, device="cuda", dtype=torch.float16)
        b = torch.randn(K, N, device="cuda", dtype=torch.float16)
        err = rel_err(tritile_matmul(a, b), a.float() @ b.float())
        ms = bench(lambda: tritile_matmul(a, b))
        out[f"gemm fp16 {M}x{N}x{K}"] = (2.0 * M * N * K / ms / 1e9, err)
    return out


def libraries() -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    out = {}
    for (B, H, S, D, causal) in ATTN:
        q, k, v = attention_inputs(B, H, S, D)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ms = bench(lambda: sdpa(q, k, v, is_causal=causal))
        out[f"attn {B}x{H}x{S}x{D}{' causal' if causal else ''}"] = attn_flops(B, H, S, D, causal) / ms / 1e9
    for (M, N, K) in GEMM:
        a = torch.randn(M, K, device="cuda", dtype=torch.float16)
        b = torch.randn(K, N, device="cuda", dtype=torch.float16)
        out[f"gemm fp16 {M}x{N}x{K}"] = 2.0 * M * N * K / bench(lambda: torch.matmul(a, b)) / 1e9
    return out


def main():
    if serve_child("--variant", run_variant):
        return
    start = time.time()
    rounds = int(os.environ.get("ROUNDS", "2"))
    results = {v: [] for v in VARIANTS}
    for r in range(rounds):
        if r and time.time() - start > float(os.environ.get("ROUND_SECONDS", "60")):
            break  # keep the whole run inside one short device call
        # odd rounds run the variants in reverse: the GPU slows as it heats, favouring whoever runs first
        for variant in (list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]):
            result = run_in_child(__file__, "--variant", variant)
            if result is None:
                continue
            results[variant].append(result)
            print(f"[{time.time() - start:5.1f}s] round {r} {variant}: {json.dumps(result)}", flush=True)
    lib = libraries()
    print(f"\ndevice: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {__import__('triton').__version__}; TFLOP/s (best of {rounds} rounds), max rel err")
    header = ("| case | library | " + " | ".join(VARIANTS)
              + f" | {CANDIDATE} / {REFERENCE} | {CANDIDATE} / library |")
    print(header + "\n|" + "---|" * (header.count("|") - 1))
    for case, ref in lib.items():
        best = {v: max((res[case][0] for res in results[v]), default=0.0) for v in VARIANTS}
        errs = max((res[case][1] for v in VARIANTS for res in results[v]), default=float("nan"))
        print(f"| {case} | {ref:.1f} | " + " | ".join(f"{best[v]:.1f}" for v in VARIANTS)
              + f" | {best[CANDIDATE] / max(best[REFERENCE], 1e-9):.3f} | {best[CANDIDATE] / ref:.3f} | (err {errs:.1e})")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "schedule_variants.json"), "w") as f:
            json.dump({"library": lib, "variants": results}, f, indent=1)


if __name__ == "__main__":
    main()
