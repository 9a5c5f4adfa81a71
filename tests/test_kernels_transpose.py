"""`T.transpose(src, dst)` (TileLang's test_tilelang_language_transpose.py: dst[j, i] = src[i, j]
of a 2-D tile) and what it lowers to, a tile read at its loop variables in another order inside
`T.Parallel` (`x[j, i]` in `T.Parallel(i, j)`: `tl.permute` / `gl.permute`, a permuted shared
view on Gluon), and a tile written that way (`Y_tile[j, i] = X_tile[i, j]`, TileLang's eager
transpose), an `if` masking some lanes.

On the `device` fixture's tensors (CPU: the reference interpreter, or Triton's interpreter with
TRITILE_BACKEND=triton; CUDA: the compiled kernel), against torch; compiled for sm_90 and sm_80
through both backends on the CPU.
"""
import pytest
import torch

import tritile
import tritile.language as T
from tritile.runtime.target import Target


@tritile.jit(out_idx=[1])
def transpose_tiles(M, N, block_M, block_N, src_scope, dtype="float16"):
    """TileLang's tilelang_transpose, the source tile in shared memory or a fragment."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((N, M), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            if src_scope == "shared":
                tile = T.alloc_shared((block_M, block_N), dtype)
            else:
                tile = T.alloc_fragment((block_M, block_N), dtype)
            tile_T = T.alloc_shared((block_N, block_M), dtype)
            T.copy(A[by * block_M:(by + 1) * block_M, bx * block_N:(bx + 1) * block_N], tile)
            T.transpose(tile, tile_T)
            T.copy(tile_T, B[bx * block_N:(bx + 1) * block_N, by * block_M:(by + 1) * block_M])

    return main


@tritile.jit(out_idx=[2])
def transposed_sum(M, N):
    """C = A + B^T with B's fragment read as b[j, i] inside T.Parallel(i, j)."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((N, M), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(1, threads=128) as _:
            a = T.alloc_fragment((M, N), "float32")
            b = T.alloc_fragment((N, M), "float32")
            T.copy(A, a)
            T.copy(B, b)
            for i, j in T.Parallel(M, N):
                a[i, j] = a[i, j] + b[j, i] * 2.0
            T.copy(a, C)

    return main


@tritile.jit(out_idx=[1])
def permuted_3d(P, Q, R):
    """B[i, j, k] = A[k, i, j]: a 3-D tile read in a rotated order."""

    @T.prim_func
    def main(A: T.Tensor((R, P, Q), "float32"), B: T.Tensor((P, Q, R), "float32")):
        with T.Kernel(1, threads=128) as _:
            a = T.alloc_shared((R, P, Q), "float32")
            b = T.alloc_fragment((P, Q, R), "float32")
            T.copy(A, a)
            for i, j, k in T.Parallel(P, Q, R):
                b[i, j, k] = a[k, i, j]
            T.copy(b, B)

    return main


@tritile.jit
def transpose_by_writes(X, Y, block_M: int = 32, block_N: int = 64, dst_scope: str = "shared"):
    """TileLang's test_tilelang_language_eager_jit.py transpose: `Y_tile[j, i] = X_tile[i, j]`
    (a tile written at its loop variables in another order); the lanes with i == j are left 0
    by an `if` (a masked permuted write)."""
    M, N = T.const("M N")
    X: T.Tensor[[M, N], T.float32]
    Y: T.Tensor[[N, M], T.float32]
    with T.Kernel(T.ceildiv(M, block_M), T.ceildiv(N, block_N), threads=128) as (bx, by):
        X_tile = T.alloc_shared((block_M, block_N), T.float32)
        if dst_scope == "shared":
            Y_tile = T.alloc_shared((block_N, block_M), T.float32)
        else:
            Y_tile = T.alloc_fragment((block_N, block_M), T.float32)
        T.copy(X[bx * block_M, by * block_N], X_tile)
        T.clear(Y_tile)
        for i, j in T.Parallel(block_M, block_N):
            if bx * block_M + i != by * block_N + j:
                Y_tile[j, i] = X_tile[i, j]
        T.copy(Y_tile, Y[by * block_N, bx * block_M])


@pytest.mark.parametrize("dst_scope", ["shared", "fragment"])
def test_transpose_by_permuted_writes(dst_scope, device):
    x = torch.randn(64, 128, device=device)
    y = torch.empty(128, 64, device=device)
    transpose_by_writes(x, y, dst_scope=dst_scope)
    want = x.T.clone()
    want.fill_diagonal_(0.0)
    torch.testing.assert_close(y, want, rtol=0, atol=0)
    for backend in ("gluon", "triton"):
        kernel = transpose_by_writes.compile(M=64, N=128, dst_scope=dst_scope, target="cuda:90", backend=backend)
        assert ".entry" in kernel.get_source("ptx")


@pytest.mark.parametrize("src_scope", ["shared", "fragment"])
@pytest.mark.parametrize("M, N, block_M, block_N", [(64, 64, 64, 64), (128, 64, 32, 64), (64, 128, 64, 32)])
def test_transpose(M, N, block_M, block_N, src_scope, device):
    a = torch.randn(M, N, device=device).half()
    torch.testing.assert_close(transpose_tiles(M, N, block_M, block_N, src_scope)(a), a.T.contiguous(), rtol=0,
                               atol=0)


def test_transposed_read_in_parallel(device):
    a, b = torch.randn(32, 64, device=device), torch.randn(64, 32, device=device)
    torch.testing.assert_close(transposed_sum(32, 64)(a, b), a + b.T * 2.0)


def test_permuted_3d_read(device):
    a = torch.randn(8, 4, 16, device=device)
    torch.testing.assert_close(permuted_3d(4, 16, 8)(a), a.permute(1, 2, 0).contiguous(), rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["gluon", "triton"])
@pytest.mark.parametrize("arch", [90, 80])
@pytest.mark.parametrize("kernel, args", [(transpose_tiles, (128, 64, 32, 64, "shared")),
                                          (transpose_tiles, (128, 64, 64, 32, "fragment")),
                                          (transposed_sum, (32, 64))], ids=["shared", "fragment", "parallel"])
def test_transposes_compile(kernel, args, arch, backend):
    compiled = tritile.compile(kernel.fn(*args), target=Target("cuda", arch), backend=backend)
    assert ".entry" in compiled.get_source("ptx")
    assert ("tl.permute" if backend == "triton" else "permute(") in compiled.get_kernel_source()


def test_transpose_shapes_are_checked():
    with pytest.raises(tritile.CompileError, match=r"test_kernels_transpose.py:\d+: T.transpose: src x tile \[16, 32\] and dst y tile \[16, 32\] must be"):
        @T.prim_func
        def main(A: T.Tensor((16, 32), "float32")):
            with T.Kernel(1, threads=128) as _:
                x = T.alloc_shared((16, 32), "float32")
                y = T.alloc_shared((16, 32), "float32")
                T.transpose(x, y)
