"""The fused linear's tiles: the training step's four linears (bench/torch_compile_h100.py's model,
bf16, 8 x 2048 tokens, d_model 1024, MLP 4096) as `tritile.linear` kernels with their epilogues,
each tile config against what the torch.compile backend weighs them with (`gemm_choice.
measure_linear`'s rival: cuBLAS's linear and torch's elementwise ops) and against inductor's
compilation of that unfused code (the rival inside a compiled step), in one run.

    PYTHONPATH=$PWD python bench/linear_epilogue_h100.py --out bench/results/linear_epilogue_h100.json

Times are `triton.testing.do_bench` medians (L2 flushed before each call), each candidate the
median of three timings with the order rotated (bench_h100.median_of_rotations); every
candidate's output is checked against the unfused torch result first.  Kernels compile in
parallel child processes first (one shared on-disk cache).  The data behind linear.py's
`epilogue_tile_config`.
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

TOKENS = 8 * 2048
# name -> (N, K, epilogue) of the block's linears (tritile.contrib.torch_backend's rewrites)
LINEARS = {"qkv": (3072, 1024, dict(has_bias=True)),
           "out_proj+residual": (1024, 1024, dict(has_bias=True, has_residual=True)),
           "fc1+gelu_tanh (pre kept)": (4096, 1024, dict(has_bias=True, activation="gelu_tanh", keep_pre=True)),
           "fc2+residual": (1024, 4096, dict(has_bias=True, has_residual=True))}
CONFIGS = [(128, 256, 64, 3, 256), (128, 256, 64, 2, 256), (128, 128, 64, 4, 256), (128, 128, 64, 5, 256),
           (256, 128, 64, 2, 256), (256, 128, 64, 3, 256), (128, 128, 64, 4, 128)]


def config_name(config, backend) -> str:
    bm, bn, bk, s, t = config
    return f"{bm}x{bn}x{bk} s{s} w{t // 32} {backend}"


def build(N, K, epilogue, config, backend):
    import tritile.language as T
    from tritile.ops.linear import matmul_epilogue

    bm, bn, bk, s, t = config
    return matmul_epilogue.compile(M=TOKENS, N=N, K=K, dtype=T.bfloat16, **epilogue, block_M=bm, block_N=bn,
                                   block_K=bk, num_stages=s, threads=t, backend=backend)


def _compile_in_child(args) -> str:
    try:
        build(*args)
        return ""
    except Exception as e:  # recorded again by the timing process
        return f"{type(e).__name__}: {e}"[:200]


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--jobs", type=int, default=12)
    args = parser.parse_args(argv)
    from triton.testing import do_bench

    from tritile.ops.epilogues import activation_fn

    candidates = [(c, "gluon") for c in CONFIGS] + [(CONFIGS[0], "triton")]
    work = [(N, K, epi, c, b) for N, K, epi in LINEARS.values() for c, b in candidates]
    ctx = __import__("multiprocessing").get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
        list(pool.map(_compile_in_child, work))

    def bench(fn):
        return lambda: do_bench(fn, warmup=25, rep=100, return_mode="median")

    rows = []
    for label, (N, K, epi) in LINEARS.items():
        torch.manual_seed(0)
        x = torch.randn(TOKENS, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        res = torch.randn(TOKENS, N, device="cuda", dtype=torch.bfloat16) if epi.get("has_residual") else None
        act = activation_fn(epi.get("activation", "none"))

        def unfused(x=x, w=w, bias=bias, res=res, act=act):
            pre = torch.nn.functional.linear(x, w, bias)
            y = act(pre)
            return (y + res if res is not None else y), pre

        inductor = torch.compile(unfused)
        ref = unfused()[0]
        timers = {"cublas+torch": bench(unfused), "cublas+inductor": bench(inductor)}
        placeholder_v, placeholder_m = x.new_empty(1), x.new_empty((1, 1))
        row = {"linear": label, "M": TOKENS, "N": N, "K": K, "epilogue": epi, "errors": {}}
        for config, backend in candidates:
            name = config_name(config, backend)
            try:
                kernel = build(N, K, epi, config, backend)
                pre = x.new_empty((TOKENS, N)) if epi.get("keep_pre") else placeholder_m
                operands = (x, w, bias, placeholder_m if res is None else res, pre)
                err = rel_err(kernel(*operands), ref)
                if err > 2e-2:
                    raise AssertionError(f"rel err {err:.3g}")
                timers[name] = bench(lambda kernel=kernel, operands=operands: kernel(*operands))
            except Exception as e:
                row["errors"][name] = f"{type(e).__name__}: {e}"[:300]
        ms = median_of_rotations(timers)
        flops = 2.0 * TOKENS * N * K
        row["ms"] = {k: round(v, 4) for k, v in ms.items()}
        row["tflops"] = {k: round(tflops(flops, v), 1) for k, v in ms.items()}
        rival = min(ms["cublas+torch"], ms["cublas+inductor"])
        row["ratio_to_best_unfused"] = {k: round(rival / v, 3) for k, v in ms.items()}
        best = min((k for k in ms if not k.startswith("cublas")), key=ms.get)
        row["best"] = best
        print(f"{label} {TOKENS}x{N}x{K}: cuBLAS+torch {ms['cublas+torch']:.4f} ms, cuBLAS+inductor "
              f"{ms['cublas+inductor']:.4f} ms; best fused {best} {ms[best]:.4f} ms "
              f"({row['ratio_to_best_unfused'][best]}x the better unfused)", flush=True)
        for k in ms:
            print(f"    {k:28s} {ms[k]:.4f} ms  {row['ratio_to_best_unfused'][k]}x", flush=True)
        rows.append(row)
    save(args.out, rows)


if __name__ == "__main__":
    main()
