"""Tile configurations of examples/flash_attention.py on one GPU, with and without warp
specialization.

For each attention case of the issue and each (block_M, block_N, num_stages, threads) in
`CONFIGS`, under each schedule of `SETTINGS` (each in its own process with fresh caches), check
the result against torch and time it (`do_bench` median).  With warp specialization a CTA of
several warpgroups is also split into consumer partitions, one warpgroup each, owning 64 rows
(lowering/consumer_partitions.py), and runs persistent (lowering/persistent_tiles.py).
`CASES=causal` or `CASES=d64` runs one case only, `SETTINGS=a,b` some of the schedules.  The question it answers: which tile, and how many
warpgroups per CTA, run each case fastest?
Run from the repo root:  PYTHONPATH=$PWD python bench/attention_configs.py
"""
from __future__ import annotations

import json
import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from child_runs import attention_inputs, attn_flops, run_in_child, serve_child  # noqa: E402

CASES = [(4, 32, 4096, 128, False), (4, 32, 4096, 128, True), (16, 16, 1024, 64, False)]
if os.environ.get("CASES") == "causal":
    CASES = [c for c in CASES if c[4]]
elif os.environ.get("CASES") == "d64":
    CASES = [c for c in CASES if c[3] == 64]
SETTINGS = {"no WS": {"TRITILE_WARP_SPECIALIZE": "0", "TRITILE_PERSISTENT": "0"},
            "no WS, persistent": {"TRITILE_WARP_SPECIALIZE": "0", "TRITILE_PERSISTENT": "1"},
            "WS": {"TRITILE_WARP_SPECIALIZE": "1"}}
if os.environ.get("SETTINGS"):
    SETTINGS = {name: SETTINGS[name] for name in os.environ["SETTINGS"].split(",")}
CONFIGS = [  # block_M, block_N, num_stages, threads
    (128, 128, 2, 256), (128, 64, 2, 256), (192, 128, 2, 384), (192, 64, 2, 384),
    (256, 64, 2, 512), (64, 64, 2, 128), (64, 64, 3, 128), (64, 128, 2, 128),
]


def run_setting(setting: str) -> dict:
    os.environ.update(SETTINGS[setting])
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from examples.flash_attention import flashattn

    out = {}
    torch.manual_seed(0)
    for (B, H, S, D, causal) in CASES:
        q, k, v = attention_inputs(B, H, S, D)
        ref = sdpa(q, k, v, is_causal=causal).float()
        for (bm, bn, stages, threads) in CONFIGS:
            key = f"{B}x{H}x{S}x{D}{' causal' if causal else ''} | {bm}x{bn} s{stages} t{threads}"
            try:
                kernel = flashattn(B, H, S, S, D, causal, block_M=bm, block_N=bn, num_stages=stages, threads=threads)
                err = float((kernel(q, k, v).float() - ref).norm() / ref.norm())
                if err > 1e-2:
                    out[key] = f"wrong (rel err {err:.1e})"
                    continue
                ms = do_bench(lambda: kernel(q, k, v), warmup=25, rep=200, return_mode="median")
                out[key] = round(attn_flops(B, H, S, D, causal) / ms / 1e9, 1)
            except Exception as e:  # a config the compiler rejects (shared memory, ...)
                out[key] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return out


def main():
    if serve_child("--setting", run_setting):
        return
    results = {}
    for setting in SETTINGS:
        result = run_in_child(__file__, "--setting", setting)
        if result is not None:
            results[setting] = result
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {__import__('triton').__version__}")
    print("| case | config | " + " | ".join(SETTINGS) + " |\n|" + "---|" * (len(SETTINGS) + 2))
    for key in {key: None for setting in results.values() for key in setting}:
        case, config = key.split(" | ")
        print(f"| {case} | {config} | " + " | ".join(str(results.get(s, {}).get(key)) for s in SETTINGS) + " |")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "attention_configs.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
