"""GEMM tile configs and persistent scheduling of examples/gemm.py's T-language kernel vs cuBLAS.

Run on the GPU machine from the repo root:
    PYTHONPATH=$PWD python bench/gemm_variants.py [--shapes 16x4096x4096,...] [--dtypes float16,bfloat16]
Every variant is checked against a float32 torch reference (relative error <= 1e-2) before it
is timed; a failing variant is reported and skipped.  Two timings per row (TFLOP/s = 2MNK / median):
`call` = `triton.testing.do_bench` of the call as a user makes it (host launch overhead included:
small-M shapes take ~25-60 us on the GPU, the same order as one Python launch), `graph` =
`triton.testing.do_bench_cudagraph` of the same call (device time only).  cuBLAS is timed the
same two ways.  `example` is `examples.gemm.tritile_matmul` (the shape-aware `tile_config`,
persistent tiles where lowering/persistent_tiles.py enables them); the other variants compile the
same program with an explicit config and TRITILE_PERSISTENT forced on ("P") or off ("NP").
Prints one compact table last; with $OUT set, also writes $OUT/gemm_variants.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import torch
from triton.testing import do_bench, do_bench_cudagraph

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import tritile.language as T  # noqa: E402
from examples.gemm import _compiled as example_kernels  # noqa: E402
from examples.gemm import matmul, tile_config, tritile_matmul  # noqa: E402
from tritile.frontend import parse_kernel  # noqa: E402
from tritile.runtime.kernel import JITKernel  # noqa: E402

SHAPES = "4096x4096x4096,8192x8192x8192,16x4096x4096,128x4096x4096,1024x4096x4096,16x8192x8192,128x8192x8192,1024x8192x8192"


def cfg(bm, bn, bk, s, w):
    return dict(block_M=bm, block_N=bn, block_K=bk, num_stages=s, threads=32 * w)


WIDE = cfg(128, 256, 64, 3, 8)  # the single config of the previous runs


def variants(M):
    """(name, config, TRITILE_PERSISTENT) alternatives to the example's choice for this M."""
    if M <= 64:
        return [("64x64x64 s8 w4", cfg(64, 64, 64, 8, 4), "auto"), ("64x128x64 s6 w4", cfg(64, 128, 64, 6, 4), "auto"),
                ("64x64x64 s4 w4", cfg(64, 64, 64, 4, 4), "auto"), ("128x256x64 s3 w8 (old)", WIDE, "0")]
    if M <= 256:
        return [("128x64x64 s6 w4", cfg(128, 64, 64, 6, 4), "auto"), ("64x64x64 s8 w4", cfg(64, 64, 64, 8, 4), "auto"),
                ("64x64x128 s4 w4", cfg(64, 64, 128, 4, 4), "auto"), ("64x128x128 s3 w4", cfg(64, 128, 128, 3, 4), "auto"),
                ("128x128x64 s4 w4", cfg(128, 128, 64, 4, 4), "auto"), ("128x256x64 s3 w8 (old)", WIDE, "0")]
    if M > 1024:
        return [("128x256x64 s3 w8 NP", WIDE, "0")]
    return [("128x256x64 s3 w8 NP", WIDE, "0"), ("128x256x64 s3 w8 P", WIDE, "1"),
            ("128x128x64 s4 w4 P", cfg(128, 128, 64, 4, 4), "1")]


def compiled(M, N, K, dtype, config, persistent):
    os.environ["TRITILE_PERSISTENT"] = persistent
    try:
        return JITKernel(parse_kernel(matmul.fn, dict(M=M, N=N, K=K, dtype=dtype, **config)), target="cuda")
    finally:
        os.environ.pop("TRITILE_PERSISTENT", None)


def tflops(M, N, K, ms):
    return 2.0 * M * N * K / (ms * 1e-3) / 1e12


def timings(fn, M, N, K):
    call = do_bench(fn, warmup=25, rep=100, return_mode="median")
    graph = do_bench_cudagraph(fn, rep=100, return_mode="median")
    return tflops(M, N, K, call), tflops(M, N, K, graph)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--example-only-for", default="bfloat16", help="dtypes timed without the alternatives")
    args = parser.parse_args()
    rows = []
    for dtype_name in args.dtypes.split(","):
        torch_dtype = getattr(torch, dtype_name)
        t_dtype = T.bfloat16 if dtype_name == "bfloat16" else T.float16
        for shape in args.shapes.split(","):
            M, N, K = (int(x) for x in shape.split("x"))
            a = torch.randn(M, K, device="cuda", dtype=torch_dtype)
            b = torch.randn(K, N, device="cuda", dtype=torch_dtype)
            ref = a.float() @ b.float()
            cublas = timings(lambda: a @ b, M, N, K)
            rows.append(dict(dtype=dtype_name, shape=shape, variant="cuBLAS", call=cublas[0], graph=cublas[1], err=0.0))
            chosen = tile_config("cuda", M, N, K)
            label = "example " + "x".join(str(chosen[k]) for k in ("block_M", "block_N", "block_K"))
            todo = [(label + f" s{chosen['num_stages']} w{chosen['threads'] // 32}", lambda: tritile_matmul)]
            if dtype_name not in args.example_only_for.split(","):
                todo += [(name, lambda c=c, p=p: compiled(M, N, K, t_dtype, c, p)) for name, c, p in variants(M)]
            for name, make in todo:
                try:
                    kernel = make()
                    out = kernel(a, b)
                    err = float((out.double() - ref.double()).norm() / ref.double().norm())
                    if not err <= 1e-2:
                        raise AssertionError(f"rel err {err:.3g}")
                    jit_kernel = kernel if isinstance(kernel, JITKernel) else example_kernels[(M, N, K, t_dtype)]
                    persistent = "persistent_tile_loop" in jit_kernel.func.attrs
                    call, graph = timings(lambda: kernel(a, b), M, N, K)
                    rows.append(dict(dtype=dtype_name, shape=shape, variant=name + (" [P]" if persistent else ""),
                                     call=call, graph=graph, err=err))
                    print(rows[-1], flush=True)
                except Exception as e:  # report and go on
                    traceback.print_exc()
                    rows.append(dict(dtype=dtype_name, shape=shape, variant=f"{name} FAILED {type(e).__name__}: "
                                     f"{str(e)[:60]}", call=0.0, graph=0.0, err=float("nan")))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gemm_variants.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)
    print(f"\n{'dtype':9} {'M x N x K':16} {'variant':30} {'call':>7} {'ratio':>6} {'graph':>7} {'ratio':>6} rel_err")
    base = {}
    for r in rows:
        if r["variant"] == "cuBLAS":
            base = r
        print(f"{r['dtype']:9} {r['shape']:16} {r['variant'][:30]:30} {r['call']:7.1f} {r['call'] / base['call']:6.3f} "
              f"{r['graph']:7.1f} {r['graph'] / base['graph']:6.3f} {r['err']:.1e}")
    import triton

    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)


if __name__ == "__main__":
    main()
