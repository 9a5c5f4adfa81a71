"""GQA decoding (examples/flash_decoding.py) against SDPA's cuDNN backend, one run (issue #19).

q (batch, heads, 1, dim) against K / V (batch, kv_heads, seq, dim), fp16, `enable_gqa=True`.
Reported: time, the cache bandwidth (K and V bytes read / time) of both, and the bandwidth a
plain device copy reaches on the same GPU (read + write bytes / time of `dst.copy_(src)` of a
tensor the size of K and V together).

    python bench/flash_decoding_h100.py --out bench/results/flash_decoding_h100.json [--sweep]

With --sweep, each shape's row also times every (num_split, block_N, num_stages) of SWEEP
(`sweep`: TB/s and ratio to cuDNN per config), the data behind the example's `tile_config`.
"""
from __future__ import annotations

import argparse
import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from timing import load_example, median_ms, save

SHAPES = [(64, 32, 8, 8192, 128), (8, 64, 8, 32768, 128)]
SWEEP = [(splits, block_N, stages) for splits in (1, 2, 4, 8) for block_N in (64, 128) for stages in (2, 3, 4)]


def decode_with(D, q, k, v, splits: int, block_N: int, stages: int):
    """examples/flash_decoding.py's two kernels with these tiles (block_H as the example's)."""
    batch, heads, dim = q.shape
    kv_heads, seq = k.shape[1], k.shape[2]
    split = D.decode_split(batch, heads, kv_heads, seq, dim, num_split=splits, block_N=block_N, num_stages=stages)
    combine = D.decode_combine(batch, heads, splits, dim) if splits > 1 else None

    def run():
        o_partial, lse_partial = split(q, k, v)
        return o_partial[:, :, 0].to(q.dtype) if combine is None else combine(o_partial, lse_partial)

    return run


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args(argv)
    D = load_example("flash_decoding")
    rows = []
    for batch, heads, kv_heads, seq, dim in SHAPES:
        q = torch.randn(batch, heads, dim, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(batch, kv_heads, seq, dim, device="cuda", dtype=torch.float16) for _ in range(2))
        cache_bytes = 2 * k.numel() * k.element_size()
        ours_ms = median_ms(lambda: D.gqa_decode(q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)  # noqa: E731
            sdpa_ms = median_ms(sdpa)
            error = (D.gqa_decode(q, k, v).float() - sdpa()[:, :, 0].float()).abs().max().item()
        src = torch.empty(cache_bytes // 2, device="cuda", dtype=torch.float16)
        dst = torch.empty_like(src)
        copy_ms = median_ms(lambda: dst.copy_(src))
        row = {"shape": [batch, heads, kv_heads, seq, dim], "config": D.tile_config("cuda", batch, kv_heads, seq),
               "tritile_ms": round(ours_ms, 4), "cudnn_ms": round(sdpa_ms, 4),
               "tritile_tb_s": round(cache_bytes / ours_ms / 1e9, 3), "cudnn_tb_s": round(cache_bytes / sdpa_ms / 1e9, 3),
               "copy_tb_s": round(2 * cache_bytes / copy_ms / 1e9, 3), "ratio": round(sdpa_ms / ours_ms, 3),
               "max_abs_diff": round(error, 5)}
        if args.sweep:
            row["sweep"] = []
            reference = D.gqa_decode(q, k, v).float()
            for splits, block_N, stages in SWEEP:
                try:
                    run = decode_with(D, q, k, v, splits, block_N, stages)
                    assert (run().float() - reference).abs().max().item() < 1e-2
                    ms = median_ms(run)
                    row["sweep"].append({"num_split": splits, "block_N": block_N, "num_stages": stages,
                                         "tb_s": round(cache_bytes / ms / 1e9, 3), "ratio": round(sdpa_ms / ms, 3)})
                except Exception as e:  # a config that does not compile or fit: recorded, the sweep goes on
                    row["sweep"].append({"num_split": splits, "block_N": block_N, "num_stages": stages,
                                         "error": f"{type(e).__name__}: {e}"[:200]})
        print(json.dumps(row), flush=True)
        rows.append(row)
    save(args.out, rows)


if __name__ == "__main__":
    main()
