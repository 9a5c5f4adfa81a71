"""GQA decoding (examples/flash_decoding.py) against SDPA's cuDNN backend (issue #19).

q (batch, heads, 1, dim) against K / V (batch, kv_heads, seq, dim), fp16, `enable_gqa=True`.

    python bench/flash_decoding_h100.py --fused --out bench/results/flash_decoding_fused_h100.json [--dry]
    python bench/flash_decoding_h100.py --out bench/results/flash_decoding_h100.json [--sweep]

--fused: one process times, interleaved, at each of SHAPES: SDPA's cuDNN backend, a device copy
of as many bytes as the K / V cache (read + written), the example's two-kernel path (split +
combine), its one-kernel path (`decode_fused`) with the example's tiles, and the one-kernel path
with each of FUSED_VARIANTS' tiles (each compiled once).  Timing as bench/bench_h100.py's: every
candidate checked against an fp32 SDPA first, `triton.testing.do_bench` medians (the L2 flushed
before each call), each candidate timed three times in rotated orders and keeping its median.
Reported per candidate: ms, TB/s of the cache read, ratio to cuDNN (> 1: faster) and to the copy.
--dry runs the same on the CPU through the interpreter at tiny shapes (DRY_SHAPES), each
"timing" one wall-clock call: a check of the script, no measurement.

Without --fused: the example's default call against cuDNN and the copy (CUDA events, no L2
flush); --sweep also times every (num_split, block_N, num_stages) of SWEEP through the two-kernel
path (`sweep`: TB/s and ratio to cuDNN per config), the data behind the example's `tile_config`.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

import bench_h100
from timing import load_example, median_ms, save

SHAPES = [(64, 32, 8, 8192, 128), (8, 64, 8, 32768, 128)]
SWEEP = [(splits, block_N, stages) for splits in (1, 2, 4, 8) for block_N in (64, 128) for stages in (2, 3, 4)]
# one-kernel tiles besides the example's own, per shape (the example: 1 split of 128-key tiles, 3
# stages, at the first; 4 splits, 2 stages at the second); block_H stays the example's 64
FUSED_VARIANTS = {
    SHAPES[0]: [dict(num_split=1, block_N=64, num_stages=3), dict(num_split=2, block_N=128, num_stages=2),
                dict(num_split=2, block_N=64, num_stages=3), dict(num_split=4, block_N=128, num_stages=2)],
    SHAPES[1]: [dict(num_split=2, block_N=128, num_stages=2), dict(num_split=8, block_N=128, num_stages=2),
                dict(num_split=16, block_N=128, num_stages=2), dict(num_split=4, block_N=128, num_stages=3),
                dict(num_split=8, block_N=64, num_stages=3)],
}
DRY_SHAPES = [(2, 8, 2, 200, 32), (1, 16, 4, 300, 32)]  # the interpreter's tiles: 2 splits of 32-key tiles
DRY_VARIANTS = [dict(num_split=1), dict(num_split=3)]


def decode_with(D, q, k, v, splits: int, block_N: int, stages: int):
    """examples/flash_decoding.py's two kernels with these tiles (block_H as the example's)."""
    batch, heads, dim = q.shape
    kv_heads, seq = k.shape[1], k.shape[2]
    return D.decoder(batch, heads, kv_heads, seq, dim, "cuda", fused=False, num_split=splits, block_N=block_N,
                     num_stages=stages)


def variant_name(tiles: dict) -> str:
    return "fused_" + "_".join(f"{key}{value}" for key, value in tiles.items())


def fused_rows(D, shapes, variants_of, device: str, log) -> list:
    """One row per shape: every candidate checked against an fp32 SDPA, then timed interleaved
    (`bench_h100.median_of_rotations`)."""
    rows = []
    for shape in shapes:
        batch, heads, kv_heads, seq, dim = shape
        q = torch.randn(batch, heads, dim, device=device, dtype=torch.float16)
        k, v = (torch.randn(batch, kv_heads, seq, dim, device=device, dtype=torch.float16) for _ in range(2))
        cache_bytes = 2 * k.numel() * k.element_size()
        ref = sdpa(q[:, :, None].float(), k.float(), v.float(), enable_gqa=True)[:, :, 0]
        row = {"shape": list(shape), "cache_bytes": cache_bytes, "configs": {}}

        def cudnn(q, k, v):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return sdpa(q[:, :, None], k, v, enable_gqa=True)[:, :, 0]

        timers = {}
        bench_h100.add_candidate(row, timers, "cudnn", lambda: cudnn, (q, k, v), ref)
        src = torch.randn(cache_bytes // 4, device=device, dtype=torch.float16)  # half the bytes: read + write
        dst = torch.empty_like(src)
        bench_h100.add_candidate(row, timers, "copy", lambda: dst.copy_, (src,), src)
        base = D.tile_config(device, batch, kv_heads, seq)
        candidates = {"two_kernel": (False, {}), "fused": (True, {}),
                      **{variant_name(tiles): (True, tiles) for tiles in variants_of(shape)}}
        for name, (fused, tiles) in candidates.items():
            row["configs"][name] = {**base, **tiles}
            bench_h100.add_candidate(row, timers, name, lambda fused=fused, tiles=tiles: D.decoder(
                batch, heads, kv_heads, seq, dim, device, fused=fused, **tiles), (q, k, v), ref)
        ms = bench_h100.median_of_rotations(timers)
        row["ms"] = {name: round(t, 5) for name, t in ms.items()}
        row["tb_s"] = {name: round(cache_bytes / t / 1e9, 3) for name, t in ms.items()}
        row["ratio_to_cudnn"] = ({name: round(ms["cudnn"] / t, 4) for name, t in ms.items() if name in candidates}
                                 if "cudnn" in ms else None)
        row["of_copy"] = ({name: round(ms["copy"] / t, 4) for name, t in ms.items() if name in candidates}
                          if "copy" in ms else None)
        log(row)
        rows.append(row)
    return rows


def print_row(row: dict) -> None:
    print("shape", "x".join(map(str, row["shape"])), flush=True)
    for name in row["configs"] | {"cudnn": None, "copy": None}:
        if name not in row["ms"]:
            print(f"  {name:<44} error: {row.get(name + '_error', 'not timed')[:120]}")
            continue
        ratio = row["ratio_to_cudnn"].get(name) if row["ratio_to_cudnn"] else None
        of_copy = row["of_copy"].get(name) if row["of_copy"] else None
        print(f"  {name:<44} {row['ms'][name]:.4f} ms {row['tb_s'][name]:6.3f} TB/s"
              + (f"  x{ratio:.3f} cuDNN" if ratio else "") + (f"  {of_copy:.3f} of copy" if of_copy else ""),
              flush=True)


def wall_clock_ms(fn) -> float:
    """--dry's stand-in for do_bench: one call's wall-clock time (no GPU, not a measurement)."""
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--fused", action="store_true", help="the one-kernel comparison (module docstring)")
    parser.add_argument("--dry", action="store_true", help="with --fused: tiny shapes on the CPU interpreter")
    args = parser.parse_args(argv)
    D = load_example("flash_decoding")
    if args.fused:
        if args.dry:
            bench_h100.bench = wall_clock_ms
            rows = fused_rows(D, DRY_SHAPES, lambda shape: DRY_VARIANTS, "cpu", print_row)
        else:
            rows = fused_rows(D, SHAPES, FUSED_VARIANTS.get, "cuda", print_row)
        save(args.out, rows)
        return rows
    rows = []
    for batch, heads, kv_heads, seq, dim in SHAPES:
        q = torch.randn(batch, heads, dim, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(batch, kv_heads, seq, dim, device="cuda", dtype=torch.float16) for _ in range(2))
        cache_bytes = 2 * k.numel() * k.element_size()
        ours_ms = median_ms(lambda: D.gqa_decode(q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            cudnn = lambda: sdpa(q[:, :, None], k, v, enable_gqa=True)  # noqa: E731
            sdpa_ms = median_ms(cudnn)
            error = (D.gqa_decode(q, k, v).float() - cudnn()[:, :, 0].float()).abs().max().item()
        src = torch.empty(cache_bytes // 2, device="cuda", dtype=torch.float16)
        dst = torch.empty_like(src)
        copy_ms = median_ms(lambda: dst.copy_(src))
        row = {"shape": [batch, heads, kv_heads, seq, dim], "config": D.tile_config("cuda", batch, kv_heads, seq),
               "fused": D.FUSED, "tritile_ms": round(ours_ms, 4), "cudnn_ms": round(sdpa_ms, 4),
               "tritile_tb_s": round(cache_bytes / ours_ms / 1e9, 3), "cudnn_tb_s": round(cache_bytes / sdpa_ms / 1e9, 3),
               "copy_tb_s": round(2 * cache_bytes / copy_ms / 1e9, 3), "ratio": round(sdpa_ms / ours_ms, 3),
               "max_abs_diff": round(error, 5)}
        if args.sweep:
            row["sweep"] = []
            reference = D.gqa_decode(q, k, v).float()
            for splits, block_N, stages in SWEEP:
                try:
                    run = decode_with(D, q, k, v, splits, block_N, stages)
                    assert (run(q, k, v).float() - reference).abs().max().item() < 1e-2
                    ms = median_ms(lambda: run(q, k, v))
                    row["sweep"].append({"num_split": splits, "block_N": block_N, "num_stages": stages,
                                         "tb_s": round(cache_bytes / ms / 1e9, 3), "ratio": round(sdpa_ms / ms, 3)})
                except Exception as e:  # a config that does not compile or fit: recorded, the sweep goes on
                    row["sweep"].append({"num_split": splits, "block_N": block_N, "num_stages": stages,
                                         "error": f"{type(e).__name__}: {e}"[:200]})
        print(json.dumps(row), flush=True)
        rows.append(row)
    save(args.out, rows)
    return rows


if __name__ == "__main__":
    main()
