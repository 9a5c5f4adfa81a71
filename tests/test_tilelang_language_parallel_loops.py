"""Serial loops inside `T.Parallel` (each element's own loop, TileLang's
examples/deepseek_mhc/example_mhc_post.py: `for k in T.serial(hc): x[i, j] += a[k, i] * b[k, j]`):
the interpreter and Triton's interpreter of the triton.language kernel against torch, and both
backends' sm_90 PTX; bounds that vary across the parallel indices are a CompileError at the loop."""
import pytest
import torch

import tritile
import tritile.language as T
from tritile.errors import CompileError

BACKENDS = ["auto", "triton"]  # on CPU tensors: tritile's interpreter / Triton's interpreter


def mhc_post(n, hc, h, h_blk=64):
    @T.prim_func
    def main(a: T.Tensor((n, hc, hc), T.float32), b: T.Tensor((n, hc, h), T.bfloat16),
             c: T.Tensor((n, hc), T.float32), d: T.Tensor((n, h), T.bfloat16),
             x: T.Tensor((n, hc, h), T.bfloat16)):
        with T.Kernel(n, threads=128) as i_n:
            b_shared = T.alloc_shared((hc, h_blk), T.bfloat16)
            x_local = T.alloc_fragment((hc, h_blk), T.float32)
            b_local = T.alloc_fragment((hc, h_blk), T.float32)
            d_local = T.alloc_fragment(h_blk, T.float32)
            a_local = T.alloc_fragment((hc, hc), T.float32)
            c_local = T.alloc_fragment(hc, T.float32)
            T.copy(a[i_n, 0, 0], a_local)
            T.copy(c[i_n, 0], c_local)
            for i0_h in T.Pipelined(T.ceildiv(h, h_blk), num_stages=2):
                T.copy(b[i_n, 0, i0_h * h_blk], b_shared)
                T.copy(b_shared, b_local)
                T.copy(d[i_n, i0_h * h_blk], d_local)
                for i_hco, i1_h in T.Parallel(hc, h_blk):
                    x_local[i_hco, i1_h] = c_local[i_hco] * d_local[i1_h]
                    for i_hci in T.serial(hc):
                        x_local[i_hco, i1_h] += a_local[i_hci, i_hco] * b_local[i_hci, i1_h]
                T.copy(x_local, x[i_n, 0, i0_h * h_blk])

    return main


def loops(M, N, K):
    """A start and step, an `if` and a lane-varying let inside the loop, T.unroll, the loop's
    index in a fragment's row (a write) and in a global read."""

    @T.prim_func
    def main(A: T.Tensor((K, M, N), T.float32), B: T.Tensor((M, N), T.float32), C: T.Tensor((K, N), T.float32)):
        with T.Kernel(2, threads=128) as bx:
            acc = T.alloc_fragment((M, N), T.float32)
            rows = T.alloc_fragment((K, N), T.float32)
            T.clear(rows)
            for i, j in T.Parallel(M, N):
                acc[i, j] = 0
                t = i * 0.5 + bx
                for k in T.serial(1, K, 2):
                    if A[k, i, j] > 0:
                        acc[i, j] += A[k, i, j] * t
                for k in T.unroll(K):
                    acc[i, j] = T.max(acc[i, j], A[k, i, j] - 1.0)
            for j in T.Parallel(N):
                for k in T.serial(K):
                    rows[k, j] = A[k, 0, j] + A[k, 1, j] * bx
            if bx == 1:
                T.copy(acc, B)
                T.copy(rows, C)

    return main


def gemm_then_loop(M, N, K):
    """The loop reads and writes a GEMM's accumulator (a wgmma token on the Gluon backend)."""

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16), bias: T.Tensor((3, N), T.float32),
             C: T.Tensor((M, N), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            A_s = T.alloc_shared((M, K), T.float16)
            B_s = T.alloc_shared((K, N), T.float16)
            acc = T.alloc_fragment((M, N), T.float32)
            T.copy(A, A_s)
            T.copy(B, B_s)
            T.gemm(A_s, B_s, acc, clear_accum=True)
            for i, j in T.Parallel(M, N):
                for k in T.serial(3):
                    acc[i, j] = acc[i, j] * 0.5 + bias[k, j]
            T.copy(acc, C)

    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_mhc_post_loop_inside_parallel(backend):
    torch.manual_seed(0)
    n, hc, h = 3, 4, 128
    a, c = torch.randn(n, hc, hc), torch.randn(n, hc)
    b, d = torch.randn(n, hc, h).bfloat16(), torch.randn(n, h).bfloat16()
    x = torch.zeros(n, hc, h).bfloat16()
    tritile.compile(mhc_post(n, hc, h), backend=backend)(a, b, c, d, x)
    expected = d.float().unsqueeze(-2) * c.unsqueeze(-1) + torch.bmm(a.mT, b.float())
    torch.testing.assert_close(x.float(), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_loop_forms_inside_parallel(backend):
    torch.manual_seed(1)
    M, N, K = 6, 16, 5  # 6: padded lanes
    A = torch.randn(K, M, N)
    expected = torch.zeros(M, N)
    t = torch.arange(M)[:, None] * 0.5 + 1
    for k in range(1, K, 2):
        expected += torch.where(A[k] > 0, A[k] * t, 0)
    for k in range(K):
        expected = torch.maximum(expected, A[k] - 1)
    B, C = torch.zeros(M, N), torch.zeros(K, N)
    tritile.compile(loops(M, N, K), backend=backend)(A, B, C)
    torch.testing.assert_close(B, expected)
    torch.testing.assert_close(C, A[:, 0] + A[:, 1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_loop_on_a_gemm_accumulator(backend):
    torch.manual_seed(2)
    A, B = torch.randn(64, 32).half(), torch.randn(32, 64).half()
    bias, C = torch.randn(3, 64), torch.zeros(64, 64)
    tritile.compile(gemm_then_loop(64, 64, 32), backend=backend)(A, B, bias, C)
    expected = A.float() @ B.float()
    for k in range(3):
        expected = expected * 0.5 + bias[k]
    torch.testing.assert_close(C, expected, rtol=1e-3, atol=1e-3)


def test_loops_inside_parallel_compile_for_hopper():
    for func in (mhc_post(3, 4, 128), loops(6, 16, 5), gemm_then_loop(64, 64, 32)):
        for backend in ("gluon", "triton"):
            ptx = tritile.compile(func, target="cuda:90", backend=backend).get_source("ptx")
            assert ".target sm_90" in ptx, backend


def test_bounds_varying_across_lanes_are_a_compile_error():
    @T.prim_func
    def main(A: T.Tensor((8, 8), T.float32)):
        with T.Kernel(1, threads=32) as bx:
            for i, j in T.Parallel(8, 8):
                for k in T.serial(i):
                    A[i, j] += 1.0

    for backend in ("gluon", "triton"):
        with pytest.raises(CompileError, match="bounds depend on the parallel indices") as info:
            tritile.compile(main, target="cuda:90", backend=backend).get_kernel_source()
        assert "for k in T.serial(i)" in str(info.value)


def test_parallel_reads_are_snapshots_of_on_chip_buffers():
    """A value read from a shared buffer inside T.Parallel is the element at the read, not a view
    that follows later stores: `val = s[i]` before `s[i] = s[j]` (a bitonic sort's swap,
    examples/dsa_sparse_finetune/indexer_topk_reducesum.py), and `s[i + 1] = s[i]` (every lane
    reads, then writes; the interpreter's dense-box load was a view of the storage)."""
    N = 8

    @T.prim_func
    def main(X: T.Tensor((N,), T.float32), Y: T.Tensor((N,), T.float32), Z: T.Tensor((N,), T.float32)):
        with T.Kernel(1, threads=32) as bx:
            s = T.alloc_shared([N], T.float32)
            t = T.alloc_shared([N], T.float32)
            T.copy(X, s)
            T.copy(X, t)
            for i in T.Parallel(N):
                j = i ^ 1
                if i < j and s[i] > s[j]:
                    val = s[i]
                    s[i] = s[j]
                    s[j] = val
            for i in T.Parallel(N - 1):
                t[i + 1] = t[i] * 2.0
            T.copy(s, Y)
            T.copy(t, Z)

    torch.manual_seed(3)
    X = torch.randn(N)
    Y, Z = torch.zeros(N), torch.zeros(N)
    tritile.compile(main)(X, Y, Z)
    pairs = X.view(-1, 2)
    torch.testing.assert_close(Y, torch.stack([pairs.min(1).values, pairs.max(1).values], 1).flatten())
    torch.testing.assert_close(Z, torch.cat([X[:1], X[:-1] * 2]))
