"""TileLang's `T.im2col` (and its deprecated name `T.c2d_im2col`): the implicit-GEMM convolution
of TileLang's examples/convolution, against `torch.conv2d` on fresh random inputs.

`T.im2col(img, col, nhw_step, c_step, kernel, stride, dilation, pad)` fills the (block_M,
block_K) tile of the im2col matrix of an NHWC image: row m = output pixel (n, oh, ow), column
k = filter tap (kh, kw, c) in a (KH, KW, C, F) weight's order; the padding, the rows past the
last pixel and the columns past the last tap read 0.  On the `device` fixture's tensors (CPU:
the tile-IR interpreter), and compiled for sm_90 by both backends on CPU.
"""
import pytest
import torch

import tritile
import tritile.language as T


def convolution(N, C, H, W, F, K, S, D, P, block_M, block_N, block_K, num_stages=2, threads=128,
                dtype=T.float16, accum_dtype=T.float32, deprecated_name=False):
    """examples/convolution/example_convolution.py as TileLang writes it (lazy style)."""
    KH, KW = K, K
    OH = (H + 2 * P - D * (K - 1) - 1) // S + 1
    OW = (W + 2 * P - D * (K - 1) - 1) // S + 1
    im2col = T.c2d_im2col if deprecated_name else T.im2col

    @T.prim_func
    def main(data: T.Tensor((N, H, W, C), dtype), kernel: T.Tensor((KH, KW, C, F), dtype),
             out: T.Tensor((N, OH, OW, F), dtype)):
        with T.Kernel(T.ceildiv(F, block_N), T.ceildiv(N * OH * OW, block_M), threads=threads) as (bx, by):
            data_shared = T.alloc_shared((block_M, block_K), dtype)
            kernel_shared = T.alloc_shared((block_K, block_N), dtype)
            out_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            out_shared = T.alloc_shared((block_M, block_N), dtype)
            kernel_flat = T.Tensor((KH * KW * C, F), dtype, kernel.data)
            out_flat = T.Tensor((N * OH * OW, F), dtype, out.data)
            T.clear(out_local)
            for k_iter in T.Pipelined(T.ceildiv(KH * KW * C, block_K), num_stages=num_stages):
                im2col(data, data_shared, by, k_iter, KH, S, D, P)
                T.copy(kernel_flat[k_iter * block_K, bx * block_N], kernel_shared)
                T.gemm(data_shared, kernel_shared, out_local)
            T.copy(out_local, out_shared)
            T.copy(out_shared, out_flat[by * block_M, bx * block_N])

    return main


def reference(a, b, S, D, P):
    """TileLang's ref_program: NHWC image, (KH, KW, C, F) weight, NHWC output."""
    out = torch.conv2d(a.permute(0, 3, 1, 2).float(), b.permute(3, 2, 0, 1).float(), stride=S, padding=P, dilation=D)
    return out.permute(0, 2, 3, 1)


@pytest.mark.parametrize("N,C,H,W,F,K,S,D,P", [
    (2, 32, 8, 8, 32, 3, 1, 1, 1),   # the example's shape of convolution, small
    (1, 16, 9, 7, 24, 3, 2, 1, 1),   # stride 2, odd sizes: the last pixel block and F block partial
    (1, 16, 10, 10, 16, 3, 1, 2, 2),  # dilation 2
    (1, 8, 6, 6, 16, 5, 1, 1, 0),    # no padding, 5x5 taps: K*K*C = 200 ends inside a block_K tile
])
def test_im2col_convolution_matches_torch(device, N, C, H, W, F, K, S, D, P):
    a = torch.randn(N, H, W, C, device=device).half()
    b = torch.randn(K, K, C, F, device=device).half()
    kernel = tritile.compile(convolution(N, C, H, W, F, K, S, D, P, block_M=32, block_N=32, block_K=16), out_idx=[2])
    out = kernel(a, b)
    torch.testing.assert_close(out.float(), reference(a, b, S, D, P), rtol=1e-2, atol=2e-2)


def test_im2col_tile_is_the_im2col_matrix(device):
    """The col tile itself (copied out), every element: padding zeros and the tap order."""
    N, H, W, C, K, S, D, P = 1, 5, 6, 4, 3, 1, 1, 1
    OH, OW = H, W
    block_M, block_K = 16, 16

    @T.prim_func
    def main(img: T.Tensor((N, H, W, C), T.float32),
             col: T.Tensor((T.ceildiv(N * OH * OW, block_M) * block_M, T.ceildiv(K * K * C, block_K) * block_K),
                           T.float32)):
        with T.Kernel(T.ceildiv(K * K * C, block_K), T.ceildiv(N * OH * OW, block_M), threads=128) as (bx, by):
            tile = T.alloc_shared((block_M, block_K), T.float32)
            T.im2col(img, tile, by, bx, K, S, D, P)
            T.copy(tile, col[by * block_M, bx * block_K])

    img = torch.randn(N, H, W, C, device=device)
    col = tritile.compile(main, out_idx=[1])(img)
    padded = torch.nn.functional.pad(img, (0, 0, P, P, P, P))  # (N, H + 2P, W + 2P, C)
    ref = torch.zeros_like(col)
    for oh in range(OH):
        for ow in range(OW):
            taps = padded[0, oh:oh + K, ow:ow + K, :]  # (kh, kw, c)
            ref[oh * OW + ow, :K * K * C] = taps.reshape(-1)
    torch.testing.assert_close(col, ref)


def test_c2d_im2col_is_im2col(device):
    a = torch.randn(1, 8, 8, 16, device=device).half()
    b = torch.randn(3, 3, 16, 16, device=device).half()
    func = convolution(1, 16, 8, 8, 16, 3, 1, 1, 1, 32, 16, 16, deprecated_name=True)
    out = tritile.compile(func, out_idx=[2])(a, b)
    torch.testing.assert_close(out.float(), reference(a, b, 1, 1, 1), rtol=1e-2, atol=2e-2)


def test_im2col_compiles_for_hopper():
    func = convolution(2, 64, 16, 16, 64, 3, 1, 1, 1, block_M=64, block_N=64, block_K=32, num_stages=3)
    for backend in ("gluon", "triton"):
        kernel = tritile.compile(func, out_idx=[2], target="cuda:90", backend=backend)
        assert ".target sm_90" in kernel.get_source("ptx")


def test_im2col_refusals_are_compile_errors():
    with pytest.raises(tritile.CompileError, match=r"T.im2col: img must be a 4-D"):
        @T.prim_func
        def flat(A: T.Tensor((64, 16), T.float16)):
            with T.Kernel(1, threads=128) as _:
                s = T.alloc_shared((16, 16), T.float16)
                T.im2col(A, s, 0, 0, 3, 1, 1, 1)
    with pytest.raises(tritile.CompileError, match=r"T.im2col kernel must be a compile-time integer"):
        @T.prim_func
        def runtime_kernel(A: T.Tensor((1, 8, 8, 16), T.float16), k: T.int32):
            with T.Kernel(1, threads=128) as _:
                s = T.alloc_shared((16, 16), T.float16)
                T.im2col(A, s, 0, 0, k, 1, 1, 1)
