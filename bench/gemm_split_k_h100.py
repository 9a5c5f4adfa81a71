"""Split-K and thin-GEMM sweep: for GEMMs with few output tiles (small M: decoding's linears; a
weight gradient of a training step), the one-kernel split GEMM of tritile/ops/split_k.py (each
(tile, share of K) program stores its partial, the tile's last arrival sums them) for each (tile
config, splits) candidate, and for A of at most 32 rows the unsplit narrow tiles with and without
the swapped product (`swap_ab`: B^T A^T, A's rows on wgmma's N side), against the unsplit tritile
GEMM (`tritile.ops.matmul` with tile_config's tiles), what `tritile.mm` runs (its plan,
`split_k_config`) and cuBLAS (`torch.mm`), all in one process.  The data behind tile_config's
thin tiles and split_k_config's rule (bench/NOTES.md).

    PYTHONPATH=$PWD python bench/gemm_split_k_h100.py            # H100: writes the json below
    PYTHONPATH=$PWD python bench/gemm_split_k_h100.py --dry      # CPU: tiny shapes, the interpreter

Writes bench/results/gemm_split_k_fused_h100.json (`--out`; the dry run writes only with
`--out`): device, torch / triton versions, date, and per (dtype, M, N, K) each candidate's
TFLOP/s and ratio to cuBLAS; prints a table of the ratios.  Times are `triton.testing.do_bench`
medians (the L2 flushed before each call, as bench/bench_h100.py's), each candidate the median
of three timings with the candidates' order rotated (bench_h100.median_of_rotations).  Every
candidate is checked first: its result against an fp32 product (relative error <= 1e-2), a
second call bit-identical to the first (the sum's order is fixed whichever program arrives
last), the counters back at zero.  The kernels are compiled (down to PTX / cubin, into the
shared on-disk caches) in parallel child processes first, each once, then loaded by the timing
process.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from bench_h100 import median_of_rotations, rel_err, tflops  # noqa: E402

SMALL_M = [(m, n, n) for m in (16, 128) for n in (4096, 8192)]
THIN = [(1, 8192, 8192), (32, 4096, 4096), (16, 1024, 4096), (16, 4096, 1024)]  # decoding's other linears
WEIGHT_GRADIENT = (1024, 1024, 16384)
SPLITS = (2, 3, 4, 6, 8)
# small M: tile_config's one-warpgroup tiles on deep pipelines (one CTA an SM), and shallower ones
# of half the shared memory or less, where two CTAs fit on an SM
SMALL_M_TILES = [dict(block_M=64, block_N=64, block_K=128, num_stages=6, threads=128),   # 192 KB
                 dict(block_M=64, block_N=64, block_K=128, num_stages=3, threads=128),   # 96 KB
                 dict(block_M=64, block_N=128, block_K=64, num_stages=6, threads=128),   # 144 KB
                 dict(block_M=64, block_N=128, block_K=64, num_stages=4, threads=128)]   # 96 KB
# A of at most 32 rows: the swapped product on A's 16 / 32 rows (tile_config's since session 24)
SWAPPED_TILES = {16: [dict(block_M=16, block_N=64, block_K=256, num_stages=5, threads=128, swap_ab=True),   # 200 KB
                      dict(block_M=16, block_N=64, block_K=128, num_stages=10, threads=128, swap_ab=True)],
                 32: [dict(block_M=32, block_N=64, block_K=256, num_stages=4, threads=128, swap_ab=True),   # 192 KB
                      dict(block_M=32, block_N=64, block_K=128, num_stages=8, threads=128, swap_ab=True)]}
WIDE_TILES = [dict(block_M=128, block_N=128, block_K=64, num_stages=4, threads=256),
              dict(block_M=128, block_N=256, block_K=64, num_stages=3, threads=256)]
MAX_WAVES = 4  # splits whose programs outnumber this many waves of one program an SM are left out
WARMUP_MS, REP_MS = 10, 40
# --dry: the interpreter's tiles on tiny shapes (ragged M and N, a short last share)
DRY_SHAPES = [(16, 96, 256), (40, 130, 96)]
DRY_TILES = [dict(block_M=64, block_N=64, block_K=32, num_stages=2, threads=128)]
DRY_SWAPPED = [dict(block_M=16, block_N=64, block_K=32, num_stages=2, threads=128, swap_ab=True)]
DRY_SPLITS = (2, 3, 4)


def candidates(M: int, N: int, K: int, dtype: torch.dtype, dry: bool = False, num_sms: int = 132) -> list:
    """The configs to time for one shape: each split tile config at each split count of at least
    one K tile a share and at most MAX_WAVES waves of programs (split_k_config's candidates); for
    A of at most 32 rows also the unsplit narrow tiles, swapped and not (no `splits` key)."""
    from tritile.ops.split_k import output_tiles, split_k_config

    thin = [] if M > 32 else DRY_SWAPPED if dry else SWAPPED_TILES[16 if M <= 16 else 32]
    # a thin A's splits: of the swapped tiles, and of session 20's thin split tile (64x64x128 s6)
    if dry:
        tiles = DRY_TILES + thin
    elif M >= 1024:
        tiles = WIDE_TILES
    else:
        tiles = SMALL_M_TILES[:1] + thin if thin else SMALL_M_TILES
    unsplit = [] if not thin else thin if dry else SMALL_M_TILES[::2] + thin
    configs = [dict(t) for t in unsplit]
    for t in tiles:
        for splits in DRY_SPLITS if dry else SPLITS:
            if splits <= -(-K // t["block_K"]) and (dry or output_tiles(M, N, t) * splits <= MAX_WAVES * num_sms):
                configs.append(split_k_config("cuda", M, N, K, dtype, tiles=t, splits=splits))
    return configs


def shapes(dry: bool, rows: tuple = ()) -> list:
    """(shape, dtype) pairs to sweep; `rows`: only the shapes with these M."""
    return [(shape, dtype) for shape in (DRY_SHAPES if dry else SMALL_M + THIN + [WEIGHT_GRADIENT])
            if not rows or shape[0] in rows for dtype in (torch.float16, torch.bfloat16)]


def t_dtype(dtype: torch.dtype):
    import tritile.language as T

    return T.bfloat16 if dtype == torch.bfloat16 else T.float16


def compile_kernel(M: int, N: int, K: int, dtype: torch.dtype, config: dict):
    """One candidate's kernel (the split kernel; without `splits` the unsplit `matmul`), compiled
    for this machine's GPU down to its binary."""
    from tritile.ops.matmul import matmul
    from tritile.ops.split_k import matmul_split_k

    kernel = (matmul_split_k if "splits" in config else matmul).compile(M=M, N=N, K=K, dtype=t_dtype(dtype), **config)
    kernel.get_source("ptx")  # runs Triton's compile (PTX and cubin) into its on-disk cache
    return kernel


def _compile_in_child(args) -> str:
    try:
        compile_kernel(*args)
        return ""
    except Exception as e:  # recorded by the timing process when it builds the same candidate
        return f"{type(e).__name__}: {e}"[:200]


def name(config: dict) -> str:
    return (("swap " if config.get("swap_ab") else "") + f"{config['block_M']}x{config['block_N']}x"
            f"{config['block_K']} s{config['num_stages']} " + (f"split{config['splits']}" if "splits" in config
                                                               else "unsplit"))


def check_split(gemm, a, b, ref) -> None:
    """The candidate's result is the product, the same bits on a second call, counters at zero."""
    first = gemm(a, b)
    err = rel_err(first, ref)
    if err > 1e-2:
        raise AssertionError(f"rel err {err:.3g}")
    if not torch.equal(gemm(a, b), first):
        raise AssertionError("a second call gave other bits")
    if gemm.counters.any():
        raise AssertionError("counters not reset")


def timer(fn, dry: bool):
    """A zero-argument timer of `fn` in ms: do_bench's median (L2 flushed) on the GPU, the median
    of five wall-clock calls in the dry run."""
    if dry:
        def wall_clock():
            times = []
            for _ in range(5):
                start = time.perf_counter()
                fn()
                times.append((time.perf_counter() - start) * 1e3)
            return sorted(times)[2]
        return wall_clock
    from triton.testing import do_bench

    return lambda: do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median")


def measure(M: int, N: int, K: int, dtype: torch.dtype, device: str, dry: bool) -> dict:
    """One shape's row: every candidate checked, then timed interleaved with cuBLAS."""
    from tritile.ops.gemm_loop import tile_config
    from tritile.ops.matmul import matmul
    from tritile.ops.split_k import SplitKGemm, split_k_config

    a = torch.randn(M, K, device=device, dtype=dtype)
    b = torch.randn(K, N, device=device, dtype=dtype)
    ref = a.float() @ b.float()
    plan = split_k_config(device, M, N, K, dtype)
    row = {"dtype": str(dtype).replace("torch.", ""), "M": M, "N": N, "K": K, "plan": plan, "errors": {}}
    unsplit = matmul.compile(M=M, N=N, K=K, dtype=t_dtype(dtype), **tile_config(device, M, N, K, dtype))
    timers = {"cublas": timer(lambda: torch.mm(a, b), dry), "unsplit": timer(lambda: unsplit(a, b), dry)}
    if plan is not None:  # tritile.mm splits this shape: the op as a user calls it
        timers["tritile.mm"] = timer(lambda: torch.ops.tritile.mm(a, b), dry)
    for config in candidates(M, N, K, dtype, dry):
        try:
            if "splits" in config:
                gemm = SplitKGemm.build(a, b, config, t_dtype(dtype))
                check_split(gemm, a, b, ref)
            else:
                gemm = matmul.compile(M=M, N=N, K=K, dtype=t_dtype(dtype), **config)
                if rel_err(gemm(a, b), ref) > 1e-2:
                    raise AssertionError(f"rel err {rel_err(gemm(a, b), ref):.3g}")
            timers[name(config)] = timer(lambda gemm=gemm: gemm(a, b), dry)
        except Exception as e:  # recorded, the sweep goes on
            row["errors"][name(config)] = f"{type(e).__name__}: {e}"[:300]
    for label, fn in (("unsplit", lambda: unsplit(a, b)), ("tritile.mm", lambda: torch.ops.tritile.mm(a, b))):
        if label in timers and rel_err(fn(), ref) > 1e-2:
            row["errors"][label] = f"rel err {rel_err(fn(), ref):.3g}"
            del timers[label]
    ms = median_of_rotations(timers)
    flops = 2.0 * M * N * K
    row["ms"] = {k: round(v, 5) for k, v in ms.items()}
    row["tflops"] = {k: round(tflops(flops, v), 2) for k, v in ms.items()}
    row["ratio_to_cublas"] = {k: round(ms["cublas"] / v, 3) for k, v in ms.items()}
    splits = [k for k in ms if k.split(" ")[-1].startswith("split")]
    narrow = [k for k in ms if k.endswith(" unsplit")]
    row["best_split"] = min(splits, key=ms.get) if splits else None
    row["best_narrow"] = min(narrow, key=ms.get) if narrow else None
    return row


def table(rows: list) -> str:
    """Ratio to cuBLAS per shape: unsplit, tritile.mm's plan, the best split and the best at each
    split count."""
    head = ["shape", "cuBLAS us", "unsplit", "tritile.mm", "best narrow", "", "best split", ""] + \
        [f"split{s}" for s in SPLITS]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for row in rows:
        ratios = row["ratio_to_cublas"]
        per_count = []
        for s in SPLITS:
            of_count = [k for k in ratios if k.endswith(f" split{s}")]
            per_count.append(f"{max(ratios[k] for k in of_count):.3f}" if of_count else "-")
        best, narrow = row["best_split"], row.get("best_narrow")
        lines.append(" | ".join([f"{row['dtype']} {row['M']}x{row['N']}x{row['K']}",
                                 f"{row['ms']['cublas'] * 1e3:.1f}", f"{ratios.get('unsplit', 0):.3f}",
                                 f"{ratios['tritile.mm']:.3f}" if "tritile.mm" in ratios else "(unsplit)",
                                 f"{ratios[narrow]:.3f}" if narrow else "-", narrow or "",
                                 f"{ratios[best]:.3f}" if best else "-", best or ""] + per_count))
    return "\n".join(lines)


def save(path: str, rows: list, device: str) -> None:
    import triton

    result = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run: the interpreter)",
              "torch": torch.__version__, "triton": triton.__version__,
              "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "timing": "dry run: median of 5 wall-clock calls" if device == "cpu" else
              f"triton.testing.do_bench(warmup={WARMUP_MS}, rep={REP_MS}, median; L2 flushed), median of 3 rotations",
              "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None,
                        help="json to write (default bench/results/gemm_split_k_fused_h100.json; dry: none)")
    parser.add_argument("--jobs", type=int, default=14, help="compiling child processes")
    parser.add_argument("--dry", action="store_true", help="tiny shapes on CPU through the interpreter")
    parser.add_argument("--rows", type=int, nargs="*", default=(), help="only the shapes with these M")
    args = parser.parse_args(argv)
    from tritile.ops.gemm_loop import tile_config

    device = "cpu" if args.dry else "cuda"
    out = args.out or (None if args.dry else os.path.join(os.path.dirname(__file__), "results",
                                                          "gemm_split_k_fused_h100.json"))
    started = time.time()
    if not args.dry:
        work = [(*shape, dtype, config) for shape, dtype in shapes(False, args.rows)
                for config in [tile_config("cuda", *shape, dtype)] + candidates(*shape, dtype)]
        ctx = __import__("multiprocessing").get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
            failed = [e for e in pool.map(_compile_in_child, work) if e]
        print(f"compiled {len(work)} split kernels in {time.time() - started:.0f} s ({len(failed)} failed)",
              flush=True)
    rows = []
    for (M, N, K), dtype in shapes(args.dry, args.rows):
        row = measure(M, N, K, dtype, device, args.dry)
        ratios = row["ratio_to_cublas"]
        print(f"{row['dtype']} {M}x{N}x{K}: unsplit {ratios.get('unsplit')}, best {row['best_split']} "
              f"{ratios.get(row['best_split'])}, errors {len(row['errors'])} ({time.time() - started:.0f} s)",
              flush=True)
        rows.append(row)
    print(table(rows))
    if out:
        save(out, rows, device)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
