"""TileLang's dynamic_shape example GEMM with runtime (`T.dynamic`) vs compile-time sizes.

Run on the GPU machine from the repo root:
    PYTHONPATH=$PWD python bench/dynamic_shape_gemm.py [--size 8192] [--out bench/results/dynamic_shape_gemm_h100.json]
The program is /work/shared/tilelang-examples/dynamic_shape/example_dynamic.py's (fp16, fp32
accumulator, 128x128x32 tiles, 3 stages, 128 threads), written here with the sizes either
`T.dynamic` or ints.  Rows, per backend (gluon, triton), at size^3:
* `static`            - the sizes compiled in;
* `dynamic`           - the call as the user makes it: its sizes are multiples of 16, so it runs
                        the variant specialised on that (tritile/ir/divisibility.py: TMA / cp.async);
* `dynamic, no 16 | dims` - the same sizes through the variant that assumes nothing of them (what
                        every dynamic call ran before the specialisation: synchronous masked loads).
Each result is checked against torch first; times are the median of `triton.testing.do_bench`
of the call (ms, and TFLOP/s).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tritile  # noqa: E402
import tritile.language as T  # noqa: E402

TILES = dict(block_M=128, block_N=128, block_K=32, num_stages=3, threads=128)


def gemm(M, N, K, block_M, block_N, block_K, num_stages, threads):
    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), "float16")
            B_shared = T.alloc_shared((block_K, block_N), "float16")
            C_local = T.alloc_fragment((block_M, block_N), "float32")
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[k * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return main


def timed(fn, ref, n: int) -> dict:
    out = fn()
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-1)
    ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
    return {"ms": round(ms, 4), "tflops": round(2 * n ** 3 / (ms * 1e-3) / 1e12, 1)}


def rows(n: int, backend: str) -> list:
    a = torch.rand(n, n, dtype=torch.float16, device="cuda")
    b = torch.rand(n, n, dtype=torch.float16, device="cuda")
    ref = a.float() @ b.float()
    static = tritile.compile(gemm(n, n, n, **TILES), out_idx=[-1], backend=backend)
    dynamic = tritile.compile(gemm(*T.dynamic("m, n, k"), **TILES), out_idx=[-1], backend=backend)
    out = [dict(case="static", **timed(lambda: static(a, b), ref, n)),
           dict(case="dynamic", **timed(lambda: dynamic(a, b), ref, n))]
    # the variant assuming nothing of the sizes, launched on the same tensors
    plain = dynamic._codegen(dynamic._device_target())
    c = torch.empty(n, n, dtype=torch.float16, device="cuda")
    dims = {v: n for v in dynamic.func.dynamic_vars}

    def run_plain():
        plain.launch_bound([a, b, c], dims)
        return c

    out.append(dict(case="dynamic, no 16 | dims", **timed(run_plain, ref, n)))
    return [dict(backend=backend, size=n, **row) for row in out]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--backends", default="gluon,triton")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    results = []
    for backend in args.backends.split(","):
        for row in rows(args.size, backend):
            print(f"{row['backend']:7s} {row['size']}^3 {row['case']:24s} {row['ms']:9.3f} ms "
                  f"{row['tflops']:7.1f} TFLOP/s", flush=True)
            results.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "tiles": TILES, "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
