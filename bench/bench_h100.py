"""Side-by-side GEMM and attention benchmark: tritile vs cuBLAS / Triton / SDPA (cuDNN, flash).

Run on the GPU machine from the repo root:  PYTHONPATH=$PWD python bench/bench_h100.py [--quick]
Every result is checked against torch before it is timed; figures are TFLOP/s (median of
`triton.testing.do_bench`; each candidate's median of three timings, the candidates' order
rotated between them), ratios are tritile / best other.  Writes bench/results/h100.json
(or $OUT/h100.json when OUT is set) and a PNG plot beside it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time
import traceback

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from triton_gemm import CONFIGS, triton_matmul  # noqa: E402

WARMUP_MS, REP_MS = 50, 300


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def bench(fn) -> float:
    return do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median")


ROTATIONS = 3


def median_of_rotations(timers: dict) -> dict:
    """name -> ms: each timer (a call returning milliseconds) runs ROTATIONS times, round r
    starting at the r-th candidate, and keeps its median.  Clocks drift within a run: a GPU
    that rested while the previous case compiled runs its first timing 5-7 % faster than the
    next ones (bench/results/gemm_epilogue_stages_h100.txt: 746 then 697 and 694 TFLOP/s), so
    a best-of rule rewards whichever candidate draws the rested slot; the median over rotated
    orders gives each candidate each position once and drops that one sample."""
    names = list(timers)
    samples = {name: [] for name in names}
    for r in range(ROTATIONS):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(timers[name]())
    return {name: sorted(xs)[len(xs) // 2] for name, xs in samples.items()}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def gemm_rows(shapes, dtypes, log):
    from examples.gemm import tritile_matmul  # the T-language kernel of examples/gemm.py

    rows = []
    for dtype in dtypes:
        for (M, N, K) in shapes:
            a = torch.randn(M, K, device="cuda", dtype=dtype)
            b = torch.randn(K, N, device="cuda", dtype=dtype)
            ref = torch.matmul(a.float(), b.float())
            flops = 2.0 * M * N * K
            row = {"op": "gemm", "dtype": str(dtype).replace("torch.", ""), "M": M, "N": N, "K": K}
            timers = {"cublas": lambda: bench(lambda: torch.matmul(a, b))}
            best_cfg, best_ms = None, math.inf
            for cfg in CONFIGS:  # Triton's best config for this shape, then timed with the others
                try:
                    out = triton_matmul(a, b, cfg)
                    if rel_err(out, ref) > 1e-2:
                        continue
                    ms = bench(lambda: triton_matmul(a, b, cfg))
                    if ms < best_ms:
                        best_cfg, best_ms = cfg, ms
                except Exception:  # a config that doesn't fit this shape
                    continue
            if best_cfg is not None:
                timers["triton"] = lambda: bench(lambda: triton_matmul(a, b, best_cfg))
            try:
                out = tritile_matmul(a, b)
                row["tritile_rel_err"] = rel_err(out, ref)
                if row["tritile_rel_err"] > 1e-2:
                    raise AssertionError(f"tritile result wrong: rel err {row['tritile_rel_err']:.3g}")
                timers["tritile"] = lambda: bench(lambda: tritile_matmul(a, b))
            except Exception as e:  # report, keep benchmarking the rest
                row["tritile_error"] = f"{type(e).__name__}: {e}"[:400]
                traceback.print_exc()
            # the search only picks Triton's config: its own timings would hand Triton the best of
            # one more noisy sample per config (bench/NOTES.md, session 13)
            ms = median_of_rotations(timers)
            if best_cfg is not None:
                row["triton_config"] = list(best_cfg)
            for name in ("cublas", "triton", "tritile"):
                row[name] = tflops(flops, ms[name]) if name in ms else 0.0
            row["ratio"] = row["tritile"] / max(row["cublas"], row["triton"])
            log(row)
            rows.append(row)
    return rows


def attention_rows(cases, log):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from examples.flash_attention import tritile_attention  # the T-language kernel

    rows = []
    for (B, H, S, D, causal) in cases:
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
        flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
        ref = sdpa(q.float(), k.float(), v.float(), is_causal=causal) if B * H * S <= 16 * 16 * 1024 else None
        row = {"op": "attention", "B": B, "H": H, "S": S, "D": D, "causal": causal}
        timers = {}
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            def library(backend=backend):
                with sdpa_kernel(backend):
                    return bench(lambda: sdpa(q, k, v, is_causal=causal))
            try:
                library()
                timers[name] = library
            except Exception as e:
                row[name + "_error"] = str(e)[:200]
        try:
            out = tritile_attention(q, k, v, causal)
            check = ref if ref is not None else sdpa(q, k, v, is_causal=causal).float()
            row["tritile_rel_err"] = rel_err(out, check)
            if row["tritile_rel_err"] > 1e-2:
                raise AssertionError(f"tritile result wrong: rel err {row['tritile_rel_err']:.3g}")
            timers["tritile"] = lambda: bench(lambda: tritile_attention(q, k, v, causal))
        except Exception as e:
            row["tritile_error"] = f"{type(e).__name__}: {e}"[:400]
            traceback.print_exc()
        ms = median_of_rotations(timers)
        for name in ("cudnn", "flash", "tritile"):
            row[name] = tflops(flops, ms[name]) if name in ms else 0.0
        row["ratio"] = row["tritile"] / max(row["cudnn"], row["flash"], 1e-9)
        log(row)
        rows.append(row)
    return rows


def overheads(log):
    """Cold compile time of the GEMM (fresh cache dir) and warm launch overhead vs Triton."""
    import tempfile

    from examples.gemm import build_matmul_kernel
    from triton_gemm import _gemm_kernel  # noqa: F401

    out = {}
    os.environ["TRITILE_CACHE_DIR"] = tempfile.mkdtemp()
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
    t0 = time.perf_counter()
    kernel = build_matmul_kernel(1024, 1024, 1024)
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
    b = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
    kernel(a, b)
    torch.cuda.synchronize()
    out["gemm_cold_compile_s"] = time.perf_counter() - t0
    small_a = torch.randn(128, 128, device="cuda", dtype=torch.float16)
    small_b = torch.randn(128, 128, device="cuda", dtype=torch.float16)
    small = build_matmul_kernel(128, 128, 128)
    small(small_a, small_b)

    def host_us(fn, n=2000):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / n * 1e6

    out["tritile_launch_us"] = host_us(lambda: small(small_a, small_b))
    out["triton_launch_us"] = host_us(lambda: triton_matmul(small_a, small_b, (64, 128, 64, 4, 4)))
    log(out)
    return out


def plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    labels, ratios = [], []
    for r in rows:
        if r["op"] == "gemm":
            labels.append(f"{r['dtype']} {r['M']}x{r['N']}x{r['K']}")
        else:
            labels.append(f"attn B{r['B']}H{r['H']}S{r['S']}D{r['D']}{' causal' if r['causal'] else ''}")
        ratios.append(r["ratio"])
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(rows) + 1.5))
    ax.barh(range(len(rows)), ratios, color=["tab:green" if x >= 1 else "tab:orange" for x in ratios])
    ax.axvline(1.0, color="k", lw=1)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set_xlabel("tritile / best library (higher is better)")
    ax.set_title("tritile on H100: ratio to cuBLAS/Triton (GEMM) and cuDNN/flash SDPA (attention)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer shapes, for a smoke run")
    args = parser.parse_args()
    out_dir = os.environ.get("OUT") or os.path.join(os.path.dirname(__file__), "results")
    os.makedirs(out_dir, exist_ok=True)
    lines = []

    def log(row):
        text = json.dumps(row, default=str)
        lines.append(text)
        print(text, flush=True)

    big = [(4096, 4096, 4096), (8192, 8192, 8192)]
    skinny = [(m, n, n) for n in (4096, 8192) for m in (16, 128, 1024)]
    gemm_shapes = big[:1] if args.quick else big + skinny
    dtypes = [torch.float16] if args.quick else [torch.float16, torch.bfloat16]
    attn = [(4, 32, 4096, 128, False), (4, 32, 4096, 128, True), (16, 16, 1024, 64, False)]
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
        "cuda": torch.version.cuda, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "timing": f"triton.testing.do_bench(warmup={WARMUP_MS}, rep={REP_MS}, median), median of "
                  f"{ROTATIONS} timings per candidate, the candidates' order rotated each time",
    }
    rows = []
    for section in (lambda: gemm_rows(gemm_shapes, dtypes, log), lambda: attention_rows(attn[:1] if args.quick else attn, log)):
        try:
            rows += section()
        except Exception as e:
            traceback.print_exc()
            result.setdefault("errors", []).append(f"{type(e).__name__}: {e}"[:400])
    try:
        result["overheads"] = overheads(log)
    except Exception as e:
        traceback.print_exc()
        result.setdefault("errors", []).append(f"overheads: {type(e).__name__}: {e}"[:400])
    result["rows"] = rows
    with open(os.path.join(out_dir, "h100.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    plot(rows, os.path.join(out_dir, "h100.png"))
    print("\n%-40s %9s %9s %9s %7s" % ("case", "tritile", "lib1", "lib2", "ratio"))
    for r in rows:
        if r["op"] == "gemm":
            name, l1, l2 = f"gemm {r['dtype']} {r['M']}x{r['N']}x{r['K']}", r["cublas"], r["triton"]
        else:
            name, l1, l2 = f"attn {r['B']}x{r['H']}x{r['S']}x{r['D']} c={int(r['causal'])}", r["cudnn"], r["flash"]
        print("%-40s %9.1f %9.1f %9.1f %7.3f" % (name, r["tritile"], l1, l2, r["ratio"]))
    if not math.isfinite(sum(r["ratio"] for r in rows)):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
