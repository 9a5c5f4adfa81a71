"""Split-K sweep: for GEMMs with few output tiles (small M; decoding's linears; the weight
gradients of a training step), each (tile config, splits) candidate of tritile/ops/split_k.py
against cuBLAS in the same run, and what `tritile.mm` runs for the shape (its plan,
`split_k_config`).  The data behind split_k_config's rule (bench/NOTES.md).

    PYTHONPATH=$PWD python bench/gemm_split_k_h100.py --out bench/results/gemm_split_k_h100.json

Times are `triton.testing.do_bench` medians (L2 flushed before each call), each candidate the
median of three timings with the candidates' order rotated (bench_h100.median_of_rotations);
every candidate's result is checked against an fp32 product first.  The kernels are compiled in
parallel child processes first (one shared on-disk cache), then loaded by the timing process.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from bench_h100 import median_of_rotations, rel_err, tflops  # noqa: E402
from timing import save  # noqa: E402
from triton.testing import do_bench  # noqa: E402

SMALL_M = [(m, n, n) for m in (16, 64, 128) for n in (4096, 8192)]
DECODE_LINEARS = [(64, 1024, 1024), (64, 4096, 1024), (64, 1024, 4096), (64, 3072, 1024)]
WEIGHT_GRADIENTS = [(1024, 1024, 16384), (3072, 1024, 16384), (1024, 4096, 16384)]
NARROW_TILES = [dict(block_M=64, block_N=64, block_K=64, num_stages=8, threads=128),
                dict(block_M=64, block_N=128, block_K=64, num_stages=6, threads=128),
                dict(block_M=128, block_N=64, block_K=64, num_stages=6, threads=128)]
WIDE_TILES = [dict(block_M=128, block_N=256, block_K=64, num_stages=3, threads=256),
              dict(block_M=128, block_N=128, block_K=64, num_stages=4, threads=256)]


def candidates(M: int, N: int, K: int) -> list:
    """(tile config with `splits`) to try for one shape: splits 1 (the plain GEMM) to 8, each
    share at least 4 K tiles."""
    tiles = WIDE_TILES if M >= 1024 else [t for t in NARROW_TILES if t["block_M"] <= max(64, M)]
    return [dict(t, splits=s) for t in tiles for s in (1, 2, 4, 8) if K // t["block_K"] // s >= 4]


def build(M: int, N: int, K: int, dtype: torch.dtype, config: dict):
    """The callable for one candidate: the plain `matmul` kernel for splits 1, else SplitKGemm."""
    import tritile.language as T
    from tritile.ops.matmul import matmul
    from tritile.ops.split_k import SplitKGemm, matmul_partial_sums, reduce_partial_sums, reduction_rows

    t_dtype = T.bfloat16 if dtype == torch.bfloat16 else T.float16
    config = dict(config)
    splits = config.pop("splits")
    if splits == 1:
        return matmul.compile(M=M, N=N, K=K, dtype=t_dtype, **config)
    partial = matmul_partial_sums.compile(M=M, N=N, K=K, dtype=t_dtype, splits=splits, **config)
    reduction = reduce_partial_sums.compile(S=splits, M=M, N=N, dtype=t_dtype, block_M=reduction_rows(M))
    placeholders = tuple(torch.empty(shape, dtype=dtype, device="cuda") for shape in ((1,), (1, 1), (1, 1)))
    return SplitKGemm(partial, reduction, placeholders)


def _compile_in_child(args) -> str:
    try:
        build(*args)
        return ""
    except Exception as e:  # recorded by the timing process when it builds the same candidate
        return f"{type(e).__name__}: {e}"[:200]


def name(config: dict) -> str:
    return (f"{config['block_M']}x{config['block_N']}x{config['block_K']} s{config['num_stages']} "
            f"w{config['threads'] // 32} split{config['splits']}")


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--jobs", type=int, default=12)
    args = parser.parse_args(argv)
    from tritile.ops.split_k import split_k_config

    shapes = [(s, torch.float16) for s in SMALL_M + DECODE_LINEARS + WEIGHT_GRADIENTS]
    shapes += [(s, torch.bfloat16) for s in SMALL_M]
    work = [(M, N, K, dtype, c) for (M, N, K), dtype in shapes for c in candidates(M, N, K)]
    ctx = __import__("multiprocessing").get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
        list(pool.map(_compile_in_child, work))
    rows = []
    for (M, N, K), dtype in shapes:
        a = torch.randn(M, K, device="cuda", dtype=dtype)
        b = torch.randn(K, N, device="cuda", dtype=dtype)
        ref = a.float() @ b.float()
        timers = {"cublas": lambda: do_bench(lambda: torch.matmul(a, b), warmup=25, rep=100, return_mode="median"),
                  "tritile.mm": lambda: do_bench(lambda: torch.ops.tritile.mm(a, b), warmup=25, rep=100,
                                                 return_mode="median")}
        row = {"dtype": str(dtype).replace("torch.", ""), "M": M, "N": N, "K": K,
               "plan": split_k_config("cuda", M, N, K, dtype), "errors": {}}
        for config in candidates(M, N, K):
            try:
                kernel = build(M, N, K, dtype, config)
                err = rel_err(kernel(a, b), ref)
                if err > 1e-2:
                    raise AssertionError(f"rel err {err:.3g}")
                timers[name(config)] = lambda kernel=kernel: do_bench(lambda: kernel(a, b), warmup=25, rep=100,
                                                                      return_mode="median")
            except Exception as e:
                row["errors"][name(config)] = f"{type(e).__name__}: {e}"[:300]
        err = rel_err(torch.ops.tritile.mm(a, b), ref)
        if err > 1e-2:
            row["errors"]["tritile.mm"] = f"rel err {err:.3g}"
            del timers["tritile.mm"]
        ms = median_of_rotations(timers)
        flops = 2.0 * M * N * K
        row["tflops"] = {k: round(tflops(flops, v), 1) for k, v in ms.items()}
        row["ratio_to_cublas"] = {k: round(ms["cublas"] / v, 3) for k, v in ms.items()}
        best = max((k for k in ms if k not in ("cublas", "tritile.mm")), key=lambda k: -ms[k])
        row["best"] = best
        print(f"{row['dtype']} {M}x{N}x{K}: cuBLAS {row['tflops']['cublas']}, tritile.mm "
              f"{row['tflops'].get('tritile.mm')} ({row['ratio_to_cublas'].get('tritile.mm')}x, plan "
              f"{row['plan'] and row['plan']['splits']}), best {best} {row['tflops'][best]} "
              f"({row['ratio_to_cublas'][best]}x)", flush=True)
        rows.append(row)
    save(args.out, rows)


if __name__ == "__main__":
    main()
