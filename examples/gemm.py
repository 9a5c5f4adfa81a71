"""GEMM in TileLang's eager style: `C = A @ B` with a software-pipelined K loop.

The body of `matmul` is the kernel: tensor shapes come from `T.const`, the output from `T.empty`,
and `return C` hands it back.  On a CUDA machine the kernel is compiled through Gluon/Triton; on a
CPU-only machine the same call runs through tritile's reference interpreter (small sizes then).
Run: ``python examples/gemm.py``; it prints the max error against torch and asserts tolerance.
`tritile_matmul(a, b)` and `build_matmul_kernel(M, N, K)` are what bench/bench_h100.py times.
"""
import torch

import tritile
import tritile.language as T


@tritile.jit
def matmul(A, B, block_M: int = 128, block_N: int = 128, block_K: int = 32, num_stages: int = 3,
           threads: int = 128, dtype=T.float16, accum_dtype=T.float32):
    M, N, K = T.const("M, N, K")
    A: T.Tensor[[M, K], dtype]
    B: T.Tensor[[K, N], dtype]
    C = T.empty((M, N), dtype)

    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
        A_shared = T.alloc_shared((block_M, block_K), dtype)
        B_shared = T.alloc_shared((block_K, block_N), dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)

        # Rasterise thread blocks in panels for L2 reuse (a launch-order hint, not a layout).
        T.use_swizzle(panel_size=10)

        T.clear(C_local)
        for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
            T.copy(A[by * block_M, k * block_K], A_shared)
            T.copy(B[k * block_K, bx * block_N], B_shared)
            T.gemm(A_shared, B_shared, C_local)

        T.copy(C_local, C[by * block_M, bx * block_N])
    return C


def tile_config(device_type: str, M: int = None, N: int = None, K: int = None) -> dict:
    """Tile sizes for a problem shape (M, N, K; None = large).

    CPU: small tiles for the interpreter.  CUDA (measured on an H100, bench/NOTES.md
    2026-11-24): large M uses two warpgroups on a 128x256 tile.  Small M leaves most SMs idle
    with 128x256 tiles (M=128, N=4096: 16 programs on 132 SMs) and is bound by reading B, so
    it takes narrow tiles with one warpgroup and a deep pipeline: 128x64 when that still gives
    about one wave of programs (B is then read once), else 64-row tiles (wgmma's minimum)."""
    if device_type != "cuda":
        return dict(block_M=64, block_N=64, block_K=32, num_stages=2, threads=128)
    if M is not None and N is not None and M <= 256:
        if M > 64 and -(-M // 128) * -(-N // 64) >= 120:
            return dict(block_M=128, block_N=64, block_K=64, num_stages=6, threads=128)
        if M <= 64 and -(-N // 128) >= 64:
            return dict(block_M=64, block_N=128, block_K=64, num_stages=6, threads=128)
        return dict(block_M=64, block_N=64, block_K=64, num_stages=8, threads=128)
    return dict(block_M=128, block_N=256, block_K=64, num_stages=3, threads=256)


_compiled = {}  # (M, N, K, dtype) -> compiled kernel: a warm call skips the jit's argument parsing


def tritile_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a @ b` for fp16/bf16 matrices (used by bench/bench_h100.py)."""
    dtype = T.bfloat16 if a.dtype == torch.bfloat16 else T.float16
    (M, K), N = a.shape, b.shape[-1]
    if a.device.type != "cuda":
        return matmul(a, b, dtype=dtype, **tile_config(a.device.type))
    key = (M, N, K, dtype)
    if key not in _compiled:
        _compiled[key] = build_matmul_kernel(M, N, K, dtype=dtype)
    return _compiled[key](a, b)


def build_matmul_kernel(M: int, N: int, K: int, device_type: str = "cuda", dtype=T.float16):
    """The compiled kernel for one shape; call it as `kernel(a, b)` -> C."""
    return matmul.compile(M=M, N=N, K=K, dtype=dtype, **tile_config(device_type, M, N, K))


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    M, N, K = (1024, 1024, 1024) if device == "cuda" else (256, 256, 256)
    a = torch.randn(M, K, dtype=torch.float16, device=device)
    b = torch.randn(K, N, dtype=torch.float16, device=device)

    c = tritile_matmul(a, b)

    ref = (a.float() @ b.float()).to(torch.float16)
    max_error = (c.float() - ref.float()).abs().max().item()
    print(f"gemm {M}x{N}x{K} fp16 on {device}: max |tritile - torch| = {max_error:.3e}")
    torch.testing.assert_close(c, ref, rtol=1e-2, atol=1e-2)
    print("All checks passed.")


if __name__ == "__main__":
    main()
