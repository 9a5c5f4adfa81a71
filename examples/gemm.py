"""GEMM in TileLang's eager style: `C = A @ B` with a software-pipelined K loop.

The kernel is `tritile.ops.matmul.matmul`, a T-language program (read it there: tensor shapes
come from `T.const`, the output from `T.empty`, `return C` hands it back; the K loop is a
`T.Pipelined` of two tile copies and a `T.gemm`), with `tile_config` choosing tiles per shape
and device; the same kernel backs `torch.ops.tritile.mm` and the torch.compile backend.  On a
CUDA machine it compiles through Gluon/Triton; on a CPU-only machine the same call runs through
tritile's reference interpreter (small sizes then).
Run: ``python examples/gemm.py``; it prints the max error against torch and asserts tolerance.
`tritile_matmul(a, b)` and `build_matmul_kernel(M, N, K)` are what bench/bench_h100.py times.
"""
import torch

import tritile.language as T
from tritile.ops.matmul import matmul, tile_config  # noqa: F401  (tile_config: bench and tests)

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
