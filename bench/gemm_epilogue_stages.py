"""Does a fourth pipeline stage pay for the 128x256 GEMM?  cuBLAS's kernel at 4096^3 fp16
(`ncu_gemm_4096_fp16_cublas.txt`: nvjet_sm90_hsh_256x128_64x4_1x2) keeps 4 stages of 64-deep
K slices; ours keeps 3, because the TMA-store epilogue's 64 KB staging tile takes the room of a
fourth (4 stages + staging = 262 KB > 227 KB).  This script times examples/gemm.py's kernel
with the epilogue as generated (TMA store, 3 stages) or with register stores straight to global
memory (`--register-epilogue`: `instructions.uses_tma_store` patched off, in this process
only, with a private kernel cache) at `--stages` 3 or 4, against cuBLAS in the same process,
each result checked against torch first.  One configuration per process; alternate them:

    for r in 1 2; do for v in "" "--register-epilogue" "--register-epilogue --stages 4"; do
      PYTHONPATH=$PWD python3 bench/gemm_epilogue_stages.py $v; done; done

Prints one line per (dtype, shape): TFLOP/s (median of `ROUNDS` do_bench medians) and the ratio.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--register-epilogue", action="store_true")
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--shapes", default="4096,8192")
    args = parser.parse_args()
    if args.register_epilogue:
        os.environ["TRITILE_CACHE_DIR"] = tempfile.mkdtemp(prefix="tritile_register_epilogue_")
        import tritile.ir.instructions as isel

        isel.uses_tma_store = lambda copy, target: False
    import tritile.language as T
    from examples.gemm import matmul
    from tritile.frontend import parse_kernel
    from tritile.runtime.kernel import JITKernel

    variant = f"{'register' if args.register_epilogue else 'TMA-store'} epilogue, {args.stages} stages"
    for torch_dtype, t_dtype in ((torch.float16, T.float16), (torch.bfloat16, T.bfloat16)):
        for n in (int(s) for s in args.shapes.split(",")):
            config = dict(M=n, N=n, K=n, dtype=t_dtype, block_M=128, block_N=256, block_K=64,
                          num_stages=args.stages, threads=256)
            kernel = JITKernel(parse_kernel(matmul.fn, config), target="cuda")
            a = torch.randn(n, n, device="cuda", dtype=torch_dtype)
            b = torch.randn(n, n, device="cuda", dtype=torch_dtype)
            ref = a.float() @ b.float()
            err = float((kernel(a, b).float() - ref).norm() / ref.norm())
            assert err < 1e-2, f"{variant}: relative error {err}"
            samples = {"tritile": [], "cublas": []}
            for _ in range(int(os.environ.get("ROUNDS", "3"))):
                for name, fn in (("tritile", lambda: kernel(a, b)), ("cublas", lambda: a @ b)):
                    ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
                    samples[name].append(2.0 * n ** 3 / ms / 1e9)
            med = {name: sorted(xs)[len(xs) // 2] for name, xs in samples.items()}
            shared = kernel._device_kernel.metadata.shared
            print(f"{variant:34s} {str(torch_dtype)[6:]:9s} {n}^3  tritile {med['tritile']:6.1f}  cuBLAS "
                  f"{med['cublas']:6.1f}  ratio {med['tritile'] / med['cublas']:.3f}  shared {shared} B  "
                  f"samples {[round(x, 1) for x in samples['tritile']]}", flush=True)


if __name__ == "__main__":
    main()
