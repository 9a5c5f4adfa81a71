"""Does the GPU's thermal and power state decide the benchmark's ratios?  SM clock and board
power during each timing, tritile against the libraries, from a rested GPU and from a hot one.

For each case (GEMM fp16 4096^3 against cuBLAS and Triton's best config; causal attention
4x32x4096x128 and attention 16x16x1024x64 against cuDNN), three rounds of every candidate,
the order rotating each round, each timing `do_bench(warmup=50, rep=300, median)` as in
bench_h100.py:
* "rested": the GPU idles REST_S seconds before each timing;
* "hot":    timings back to back, right after the rested rounds.
A sampler thread reads the SM clock, power and temperature (NVML through pynvml when it is
installed, else `nvidia-smi --query-gpu` polled) and each timing gets the mean of the samples
inside its window.  Every result is checked against torch first.
Run: PYTHONPATH=$PWD python bench/clock_check.py  (writes $OUT/clock_check.json when OUT is set)
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from triton_gemm import CONFIGS, triton_matmul  # noqa: E402

REST_S = 2.0
ROUNDS = 3


class Sampler(threading.Thread):
    """(time.monotonic(), sm clock MHz, power W, temperature C) every ~50 ms."""

    def __init__(self):
        super().__init__(daemon=True)
        self.samples, self.stop, self.source = [], threading.Event(), None
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            self.read = lambda: (pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                                 pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                                 pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
            self.source = "pynvml"
        except Exception:
            self.read = self._nvidia_smi
            self.source = "nvidia-smi"

    @staticmethod
    def _nvidia_smi():
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                              "--format=csv,noheader,nounits", "-i", str(torch.cuda.current_device())],
                             capture_output=True, text=True, timeout=5).stdout
        clock, power, temp = (float(x) for x in out.strip().split(","))
        return clock, power, temp

    def run(self):
        while not self.stop.is_set():
            self.samples.append((time.monotonic(), *self.read()))
            time.sleep(0.05)

    def window(self, start, end):
        inside = [s for s in self.samples if start <= s[0] <= end]
        if not inside:
            return {}
        return {"sm_mhz": statistics.mean(s[1] for s in inside), "power_w": statistics.mean(s[2] for s in inside),
                "temp_c": max(s[3] for s in inside), "samples": len(inside)}


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


def gemm_case():
    from examples.gemm import tritile_matmul

    n = 4096
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.float16) for _ in range(2))
    ref = a.float() @ b.float()
    best = min((cfg for cfg in CONFIGS if rel_err(triton_matmul(a, b, cfg), ref) < 1e-2),
               key=lambda cfg: do_bench(lambda: triton_matmul(a, b, cfg), warmup=25, rep=100, return_mode="median"))
    assert rel_err(tritile_matmul(a, b), ref) < 1e-2
    return f"gemm fp16 {n}^3", 2.0 * n ** 3, {
        "tritile": lambda: tritile_matmul(a, b),
        "cublas": lambda: torch.matmul(a, b),
        f"triton {best}": lambda: triton_matmul(a, b, best),
    }


def attention_case(B, H, S, D, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from examples.flash_attention import tritile_attention

    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = sdpa(q, k, v, is_causal=causal)
    assert rel_err(tritile_attention(q, k, v, causal), ref.float()) < 1e-2

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return sdpa(q, k, v, is_causal=causal)
    return (f"attention {B}x{H}x{S}x{D}{' causal' if causal else ''}",
            4.0 * B * H * S * S * D * (0.5 if causal else 1.0),
            {"tritile": lambda: tritile_attention(q, k, v, causal), "cudnn": cudnn})


def timed_rounds(name, flops, candidates, sampler, rest_s, log):
    rows, names = [], list(candidates)
    for round_index in range(ROUNDS):
        order = names[round_index % len(names):] + names[:round_index % len(names)]
        for candidate in order:
            if rest_s:
                torch.cuda.synchronize()
                time.sleep(rest_s)
            start = time.monotonic()
            ms = do_bench(candidates[candidate], warmup=50, rep=300, return_mode="median")
            row = {"case": name, "mode": "rested" if rest_s else "hot", "round": round_index,
                   "candidate": candidate, "tflops": flops / (ms * 1e-3) / 1e12,
                   **sampler.window(start, time.monotonic())}
            log(row)
            rows.append(row)
    return rows


def main():
    sampler = Sampler()
    sampler.start()
    out_dir = os.environ.get("OUT", os.path.join(os.path.dirname(__file__), "results"))
    rows = []

    def log(row):
        print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}), flush=True)

    for make in (gemm_case, lambda: attention_case(4, 32, 4096, 128, True),
                 lambda: attention_case(16, 16, 1024, 64, False)):
        name, flops, candidates = make()
        rows += timed_rounds(name, flops, candidates, sampler, REST_S, log)
        rows += timed_rounds(name, flops, candidates, sampler, 0.0, log)
    sampler.stop.set()
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"sensor source {sampler.source}; median over {ROUNDS} rounds")
    print(f"{'case':34s} {'mode':7s} {'candidate':30s} {'TFLOP/s':>8s} {'SM MHz':>7s} {'W':>6s} {'C':>4s}")
    for key in dict.fromkeys((r["case"], r["mode"], r["candidate"]) for r in rows):
        group = [r for r in rows if (r["case"], r["mode"], r["candidate"]) == key]

        def med(field):
            values = [r[field] for r in group if field in r]
            return statistics.median(values) if values else float("nan")
        print(f"{key[0]:34s} {key[1]:7s} {key[2]:30s} {med('tflops'):8.1f} {med('sm_mhz'):7.0f} "
              f"{med('power_w'):6.0f} {med('temp_c'):4.0f}")
    with open(os.path.join(out_dir, "clock_check.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "triton": triton.__version__, "sensor": sampler.source, "rest_s": REST_S, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
