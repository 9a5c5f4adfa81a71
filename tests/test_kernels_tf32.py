"""GEMMs over TileLang's `T.tfloat32` operands: float32 storage read as TF32 by the tensor
cores (mantissa truncated to 10 bits), in TileLang's test_tilelang_kernel_gemm style."""
import pytest
import torch

import tritile
import tritile.language as T
from tritile.ir.dtypes import truncate_to_tf32
from tritile.ops.gemm_loop import load_operand_tiles


def matmul(M, N, K, block_M, block_N, block_K, trans_A, trans_B, in_dtype, num_stages=2):
    A_shape = (K, M) if trans_A else (M, K)
    B_shape = (N, K) if trans_B else (K, N)
    A_shared_shape = (block_K, block_M) if trans_A else (block_M, block_K)
    B_shared_shape = (block_N, block_K) if trans_B else (block_K, block_N)

    @T.prim_func
    def main(A: T.Tensor(A_shape, in_dtype), B: T.Tensor(B_shape, in_dtype), C: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared(A_shared_shape, in_dtype)
            B_shared = T.alloc_shared(B_shared_shape, in_dtype)
            C_local = T.alloc_fragment((block_M, block_N), T.float32)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                load_operand_tiles(A, B, A_shared, B_shared, k, bx, by, block_M, block_N, block_K, trans_A, trans_B)
                T.gemm(A_shared, B_shared, C_local, trans_A, trans_B)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return main


def _reference(a, b, trans_A, trans_B, tf32):
    a, b = (a.t() if trans_A else a), (b.t() if trans_B else b)
    if tf32:
        a, b = truncate_to_tf32(a.contiguous()), truncate_to_tf32(b.contiguous())
    return (a.double() @ b.double()).float()


def _inputs(M, N, K, trans_A, trans_B, device):
    a = torch.randn((K, M) if trans_A else (M, K), device=device)
    b = torch.randn((N, K) if trans_B else (K, N), device=device)
    return a, b


@pytest.mark.parametrize("trans_A,trans_B", [(False, False), (False, True), (True, False)])
def test_tfloat32_gemm_reads_truncated_operands(trans_A, trans_B, device):
    M, N, K = (512, 1024, 768) if device == "cuda" else (64, 96, 80)
    kernel = tritile.compile(matmul(M, N, K, 64, 32 if device == "cpu" else 128, 16 if device == "cpu" else 32,
                                    trans_A, trans_B, T.tfloat32), out_idx=[2])
    a, b = _inputs(M, N, K, trans_A, trans_B, device)
    c = kernel(a, b)
    # the tensor cores and the interpreter read the same truncated values: only the order of
    # the float32 sums differs
    torch.testing.assert_close(c, _reference(a, b, trans_A, trans_B, tf32=True), rtol=1e-4, atol=1e-3)
    # and the result is measurably not float32's, so the test would see a GEMM that ignored tf32
    assert (c - _reference(a, b, trans_A, trans_B, tf32=False)).abs().max() > 1e-3


def test_float32_gemm_keeps_float32_precision(device):
    kernel = tritile.compile(matmul(64, 64, 64, 32, 32, 16, False, False, T.float32), out_idx=[2])
    a, b = _inputs(64, 64, 64, False, False, device)
    torch.testing.assert_close(kernel(a, b), _reference(a, b, False, False, tf32=False), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("backend,arch,instruction", [
    ("gluon", 80, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
    ("gluon", 90, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"),
    ("triton", 90, "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32")])
def test_tfloat32_gemm_compiles_to_tf32_mma(backend, arch, instruction):
    kernel = tritile.compile(matmul(128, 128, 128, 64, 64, 32, False, False, T.tfloat32), out_idx=[2],
                             target=f"cuda:{arch}", backend=backend)
    assert "tf32=True" in kernel.get_source("tile")
    assert instruction in kernel.get_source("ptx")
    exact = tritile.compile(matmul(128, 128, 128, 64, 64, 32, False, False, T.float32), out_idx=[2],
                            target=f"cuda:{arch}", backend=backend)
    assert "tf32" not in exact.get_source("ptx")
