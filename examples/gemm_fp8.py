"""FP8 (e4m3) GEMM with per-tensor scales and fp16 output, in TileLang's lazy style.

`C = (A @ B^T) * scale_a * scale_b` for A (M, K) and B (N, K), both K-major as FP8 wgmma wants
them.  FP8 wgmma accumulates with reduced precision over a long K; as cuBLASLt and DeepGEMM do,
the kernel promotes: the tensor cores accumulate `promote_every` k-steps into a partial
fragment, which is then added into a float32 accumulator in registers and cleared.  The scales
arrive as a 2-element float32 tensor.  Runs on CUDA when available, else on the CPU reference
interpreter with small sizes.  Run: ``python examples/gemm_fp8.py``.
"""
import torch

import tritile
import tritile.language as T


@tritile.jit(out_idx=[3])
def gemm_fp8(M, N, K, block_M=128, block_N=128, block_K=128, num_stages=3, threads=256, promote_every=4):
    in_dtype, accum_dtype, out_dtype = "float8_e4m3", "float", "float16"

    @T.prim_func
    def main(A: T.Tensor((M, K), in_dtype), B: T.Tensor((N, K), in_dtype), Scales: T.Tensor((2,), "float32"),
             C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), in_dtype)
            B_shared = T.alloc_shared((block_N, block_K), in_dtype)
            partial = T.alloc_fragment((block_M, block_N), accum_dtype)
            total = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.use_swizzle(panel_size=10)
            T.clear(partial)
            T.clear(total)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * block_K], B_shared)
                T.gemm(A_shared, B_shared, partial, transpose_B=True)
                if (k + 1) % promote_every == 0:  # promote the tensor cores' partial sum to float32
                    for i, j in T.Parallel(block_M, block_N):
                        total[i, j] += partial[i, j]
                    T.clear(partial)
            for i, j in T.Parallel(block_M, block_N):
                total[i, j] = (total[i, j] + partial[i, j]) * (Scales[0] * Scales[1])
            T.copy(total, C[by * block_M, bx * block_N])

    return main


def tile_config(device_type: str) -> dict:
    """Small tiles for the CPU interpreter; on CUDA 128x128x128 tiles on two warpgroups (two
    float32 accumulators of 64 registers a thread each), four stages, promoting every k-step
    (every 128 of K, DeepGEMM's interval): the only setting as accurate as cuBLASLt on the H100
    (bench/NOTES.md, session 18: 971 / 899 TFLOP/s at 4096³ / 8192³; promoting every 2 or 4
    k-steps 1115-1124 / 1054-1083 with 1.1-1.5x cuBLASLt's error)."""
    if device_type != "cuda":
        return dict(block_M=32, block_N=32, block_K=32, num_stages=1, threads=128, promote_every=2)
    return dict(block_M=128, block_N=128, block_K=128, num_stages=4, threads=256, promote_every=1)


def quantize(x: torch.Tensor) -> tuple:
    """(x / scale as e4m3, scale) with the per-tensor scale that maps max |x| to e4m3's 448."""
    scale = x.abs().max().float().clamp(min=1e-12) / 448.0
    return (x.float() / scale).to(torch.float8_e4m3fn), scale


def tritile_gemm_fp8(a8, b8, scale_a, scale_b) -> torch.Tensor:
    """(a8 @ b8^T) * scale_a * scale_b in fp16, for e4m3 a8 (M, K) and b8 (N, K)."""
    (M, K), N = a8.shape, b8.shape[0]
    scales = torch.stack([scale_a.float().reshape(()), scale_b.float().reshape(())])
    return gemm_fp8(M, N, K, **tile_config(a8.device.type))(a8, b8, scales)


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    M, N, K = (1024, 1024, 4096) if device == "cuda" else (64, 64, 128)
    a8, scale_a = quantize(torch.randn(M, K, device=device))
    b8, scale_b = quantize(torch.randn(N, K, device=device))
    c = tritile_gemm_fp8(a8, b8, scale_a, scale_b)
    exact = (a8.double() @ b8.double().t()) * (scale_a.double() * scale_b.double())  # of the same fp8 values
    error = ((c.double() - exact).abs().max() / exact.abs().max()).item()
    print(f"gemm fp8 e4m3 {M}x{N}x{K} on {device}: max |tritile - torch| / max |C| = {error:.3e}")
    torch.testing.assert_close(c.double(), exact, rtol=1e-2, atol=1e-2 * exact.abs().max().item())
    print("All checks passed.")


if __name__ == "__main__":
    main()
