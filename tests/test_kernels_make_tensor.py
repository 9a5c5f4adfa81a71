"""TileLang's pointer tables: `T.Tensor([n], T.ptr)` (int64 addresses, `tensor.data_ptr()`) and
`T.make_tensor(address, shape, dtype)` (a global tensor at an address the kernel loads), as
TileLang's examples/grouped_gemm/example_grouped_gemm_fwd_ptr.py uses them.  On CPU tensors:
tritile's interpreter (a view of the memory at the address) and Triton's interpreter running the
triton.language kernel (a pointer cast); sm_90 PTX of both backends (cp.async / vector loads, no
TMA: the address is the kernel's, not the host's)."""
import math
import re

import pytest
import torch

import tritile
import tritile.language as T
from kernels import compile_error

BACKENDS = ["gluon", "triton"]  # on CPU tensors: tritile's interpreter, Triton's interpreter


def grouped_gemm_ptr(batch_sizes, K, N, block_M=32, block_N=32, block_K=32, dtype="float16"):
    """The example's kernel: per-group A, B, C tensors reached through address tables."""
    count, max_M = len(batch_sizes), max(batch_sizes)
    total_m_blocks = sum(math.ceil(size / block_M) for size in batch_sizes)

    @T.prim_func
    def kernel(A_ptrs: T.Tensor([count], T.ptr), B_ptrs: T.Tensor([count], T.ptr),
               C_ptrs: T.Tensor([count], T.ptr), tile_offsets: T.Tensor([count], T.int32)):
        with T.Kernel(total_m_blocks, T.ceildiv(N, block_N), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), T.float32)
            group = T.alloc_var(dtype=T.int32)
            group_offset = T.alloc_var(dtype=T.int32)
            group = 0
            group_offset = 0
            for i in range(count):
                inside = bx >= tile_offsets[i]
                group = T.if_then_else(inside, i, group)
                group_offset = T.if_then_else(inside, tile_offsets[i], group_offset)
            m_start = (bx - group_offset) * block_M
            A = T.make_tensor(A_ptrs[group], (max_M, K), dtype)
            B = T.make_tensor(B_ptrs[group], (K, N), dtype)
            C = T.make_tensor(C_ptrs[group], (max_M, N), dtype)
            T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.copy(A[m_start, ko * block_K], A_shared)
                T.copy(B[ko * block_K, by * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[m_start, by * block_N])

    return kernel


def table(tensors):
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)


def grouped_inputs(batch_sizes, K, N, block_M=32):
    max_M = max(batch_sizes)
    offsets = [0]
    for size in batch_sizes[:-1]:
        offsets.append(offsets[-1] + math.ceil(size / block_M))
    a = [torch.zeros(max_M, K, dtype=torch.float16) for _ in batch_sizes]
    for t, size in zip(a, batch_sizes):
        t[:size] = torch.randn(size, K, dtype=torch.float16)
    b = [torch.randn(K, N, dtype=torch.float16) for _ in batch_sizes]
    c = [torch.full((max_M, N), 7.0, dtype=torch.float16) for _ in batch_sizes]
    return a, b, c, torch.tensor(offsets, dtype=torch.int32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grouped_gemm_through_pointer_tables(backend):
    sizes, K, N = [16, 33, 64], 96, 80  # N: a ragged last column tile
    kernel = tritile.compile(grouped_gemm_ptr(sizes, K, N), backend=backend)
    a, b, c, offsets = grouped_inputs(sizes, K, N)
    kernel(table(a), table(b), table(c), offsets)
    for x, w, out, size in zip(a, b, c, sizes):
        torch.testing.assert_close(out[:size].float(), x[:size].float() @ w.float(), atol=2e-2, rtol=2e-2)
        written = math.ceil(size / 32) * 32  # rows past the group's tiles are not written
        assert bool((out[written:] == 7).all())


def scale_rows(count, M, N, dtype="float32"):
    """Element loads and stores (T.Parallel) of tensors made from a table: y_g = 2 * x_g + g."""

    @T.prim_func
    def kernel(X_ptrs: T.Tensor([count], T.ptr), Y_ptrs: T.Tensor([count], T.ptr)):
        with T.Kernel(count, T.ceildiv(M, 16), threads=128) as (g, bm):
            X = T.make_tensor(X_ptrs[g], (M, N), dtype)
            Y = T.make_tensor(Y_ptrs[g], (M, N), dtype)
            for i, j in T.Parallel(16, N):
                Y[bm * 16 + i, j] = X[bm * 16 + i, j] * 2 + g

    return kernel


@pytest.mark.parametrize("backend", BACKENDS)
def test_elementwise_loads_and_stores_through_addresses(backend):
    count, M, N = 3, 40, 32  # M: a ragged last row tile, masked
    kernel = tritile.compile(scale_rows(count, M, N), backend=backend)
    xs = [torch.randn(M, N) for _ in range(count)]
    ys = [torch.full((M, N), -1.0) for _ in range(count)]
    kernel(table(xs), table(ys))
    for g, (x, y) in enumerate(zip(xs, ys)):
        torch.testing.assert_close(y, x * 2 + g)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sm90_ptx_addresses_tiles_without_tma(backend):
    kernel = tritile.compile(grouped_gemm_ptr([64, 128], 128, 128), target="cuda:90", backend=backend)
    ptx = kernel.get_source("ptx")
    assert "cp.async.bulk.tensor" not in ptx  # no host descriptor can describe a kernel-loaded address
    assert re.search(r"wgmma\.mma_async|mma\.sync", ptx)
    # 16-byte cp.async (Triton's pipeliner / tritile's) and stores: the address is taken 16-byte aligned
    assert "cp.async.cg.shared.global" in ptx and "st.global.v4" in ptx
    assert "multiple_of" in kernel.get_source(backend)


def test_interpreter_refuses_an_unaligned_address():
    kernel = tritile.compile(scale_rows(2, 16, 32), backend="gluon")
    xs = [torch.randn(16, 33) for _ in range(2)]
    ys = [torch.zeros(16, 32) for _ in range(2)]
    addresses = table(xs)
    addresses[1] += 4  # a float32 address, but not 16-byte aligned
    with pytest.raises(tritile.CompileError, match="16-byte aligned"):
        kernel(addresses, table(ys))


def test_refusals():
    def nested():
        @T.prim_func
        def kernel(P: T.Tensor([2], T.ptr), Y: T.Tensor([4], "float32")):
            with T.Kernel(1, threads=32):
                for g in range(2):
                    X = T.make_tensor(P[g], (4,), "float32")
                    Y[0] = X[0]

    assert "kernel body's own level" in compile_error(nested)

    def strided():
        @T.prim_func
        def kernel(P: T.Tensor([2], T.ptr), Y: T.Tensor([4], "float32")):
            with T.Kernel(1, threads=32):
                X = T.make_tensor(P[0], (4,), "float32", strides=(1,))
                Y[0] = X[0]

    assert "row-major" in compile_error(strided)

    def narrow():
        @T.prim_func
        def kernel(P: T.Tensor([2], T.int32), Y: T.Tensor([4], "float32")):
            with T.Kernel(1, threads=32):
                X = T.make_tensor(P[0], (4,), "float32")
                Y[0] = X[0]

    assert "64-bit integer" in compile_error(narrow)
