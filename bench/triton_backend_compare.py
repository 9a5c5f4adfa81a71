"""The same tile programs through both backends: what tritile's own passes (Gluon) add over
Triton's pipeliner (triton.language backend).

Run on the GPU machine from the repo root:  PYTHONPATH=$PWD python bench/triton_backend_compare.py
Rows: the library GEMM (`tritile.ops.matmul`, its H100 tile config) and FlashAttention
(`examples/flash_attention.py`, its H100 config), each compiled with backend="gluon" and
backend="triton" from one program; each result is checked against torch before it is timed
(median of `triton.testing.do_bench`, TFLOP/s).  Prints one line per row and writes
$OUT/triton_backend_compare.json when OUT is set.
"""
from __future__ import annotations

import json
import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import flash_attention as FA  # noqa: E402
import tritile  # noqa: E402
from tritile.ops import matmul as library  # noqa: E402

BACKENDS = ("gluon", "triton")


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def gemm_row(n: int) -> dict:
    a = torch.randn(n, n, dtype=torch.float16, device="cuda")
    b = torch.randn(n, n, dtype=torch.float16, device="cuda")
    config = library.tile_config("cuda", n, n, n, a.dtype)
    ref = a.float() @ b.float()
    row = {"case": f"gemm {n}^3 fp16", "config": config}
    for backend in BACKENDS:
        jit = tritile.jit(library.matmul.fn, backend=backend)
        out = jit(a, b, **config)
        torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-1)
        row[backend] = tflops(2 * n ** 3, do_bench(lambda: jit(a, b, **config), warmup=50, rep=300,
                                                   return_mode="median"))
    return row


def attention_row(batch: int, heads: int, seq: int, dim: int, causal: bool) -> dict:
    q, k, v = (torch.randn(batch, heads, seq, dim, dtype=torch.float16, device="cuda") for _ in range(3))
    config = FA.tile_config("cuda", dim, causal)
    ref = FA.ref_program(q, k, v, causal)
    flops = 4 * batch * heads * seq * seq * dim * (0.5 if causal else 1.0)
    row = {"case": f"attention b{batch} h{heads} s{seq} d{dim}{' causal' if causal else ''}", "config": config}
    for backend in BACKENDS:
        kernel = tritile.jit(out_idx=[3], backend=backend)(FA.flashattn.fn)(batch, heads, seq, seq, dim, causal,
                                                                             **config)
        torch.testing.assert_close(kernel(q, k, v), ref, rtol=1e-2, atol=1e-2)
        row[backend] = tflops(flops, do_bench(lambda: kernel(q, k, v), warmup=50, rep=300, return_mode="median"))
    return row


def main():
    rows = []
    cases = [(gemm_row, (4096,)), (gemm_row, (8192,)), (attention_row, (4, 16, 4096, 128, False)),
             (attention_row, (4, 16, 4096, 128, True)), (attention_row, (4, 16, 4096, 64, False))]
    for fn, args in cases:
        try:
            row = fn(*args)
        except Exception as err:  # a backend failing one case must not lose the others
            row = {"case": f"{fn.__name__}{args}", "error": f"{type(err).__name__}: {str(err)[:400]}"}
        rows.append(row)
        print(json.dumps(row), flush=True)
    device = torch.cuda.get_device_name()
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "triton_backend_compare.json"), "w") as f:
            json.dump({"device": device, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
