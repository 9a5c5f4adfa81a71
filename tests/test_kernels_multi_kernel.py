"""Functions of several `with T.Kernel` blocks and `T.alloc_global` workspaces.

A split kernel writes partial results into workspaces the runtime allocates for the call; a
combine kernel, launched after it, reads them (TileLang's flash decoding: a split of the keys per
program, then a log-sum-exp combine).  On the `device` fixture's tensors (CPU: each kernel
through the reference interpreter, or Triton's interpreter with TRITILE_BACKEND=triton; CUDA:
the GPU kernels) against torch; compile checks show every kernel in each stage's source.
"""
import math

import pytest
import torch

import tritile
import tritile.language as T


@tritile.jit(out_idx=[1])
def copy_through_workspace(N, block_N, dtype=T.float32):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype)):
        staging = T.alloc_global((N,), dtype)
        with T.Kernel(T.ceildiv(N, block_N), threads=block_N) as bx:
            T.copy(A[bx * block_N:(bx + 1) * block_N], staging[bx * block_N:(bx + 1) * block_N])
            T.copy(staging[bx * block_N:(bx + 1) * block_N], B[bx * block_N:(bx + 1) * block_N])

    return main


def test_one_kernel_with_a_workspace(device, assert_close):
    a = torch.randn(256, device=device)
    assert_close(copy_through_workspace(256, 64)(a), a)


@tritile.jit
def eager_copy_through_workspace(A, block_N: int = 64):
    N = T.const("N")
    A: T.Tensor[[N], T.float16]
    B = T.empty((N,), T.float16)
    staging = T.alloc_global((N,), T.float16)
    with T.Kernel(T.ceildiv(N, block_N), threads=block_N) as bx:
        T.copy(A[bx * block_N:(bx + 1) * block_N], staging[bx * block_N:(bx + 1) * block_N])
    with T.Kernel(T.ceildiv(N, block_N), threads=block_N) as bx:
        for i in T.Parallel(block_N):
            B[bx * block_N + i] = staging[bx * block_N + i] * 2.0
    return B


def test_eager_style_workspace_and_two_kernels(device, assert_close):
    a = torch.randn(192, dtype=torch.float16, device=device)
    assert_close(eager_copy_through_workspace(a), a * 2)


@tritile.jit(out_idx=[1])
def split_row_sum(N, splits, block_M, threads=128):
    """Out[m] = sum of A[m, :]: kernel 0 sums each of `splits` column chunks into a workspace
    [splits, M] (M a T.dynamic size), kernel 1 adds the chunks' sums, scaled by a runtime scalar."""
    M = T.dynamic("M")
    chunk = N // splits

    @T.prim_func
    def main(A: T.Tensor((M, N), T.float32), Out: T.Tensor((M,), T.float32), scale: T.float32):
        partial = T.alloc_global((splits, M), T.float32)
        with T.Kernel(T.ceildiv(M, block_M), splits, threads=threads) as (bx, s):
            tile = T.alloc_fragment((block_M, chunk), T.float32)
            sums = T.alloc_fragment((block_M,), T.float32)
            T.copy(A[bx * block_M, s * chunk], tile)
            T.reduce_sum(tile, sums, dim=1)
            T.copy(sums, partial[s, bx * block_M])
        with T.Kernel(T.ceildiv(M, block_M), threads=threads) as bx:
            chunks = T.alloc_fragment((splits, block_M), T.float32)
            total = T.alloc_fragment((block_M,), T.float32)
            T.copy(partial[0, bx * block_M], chunks)
            T.reduce_sum(chunks, total, dim=0)
            for i in T.Parallel(block_M):
                total[i] = total[i] * scale
            T.copy(total, Out[bx * block_M])

    return main


@pytest.mark.parametrize("M", [64, 40, 0])
def test_split_and_combine_with_dynamic_workspace(device, assert_close, M):
    """The workspace's shape follows the call's T.dynamic size; M = 0 launches nothing."""
    a = torch.randn(M, 256, device=device)
    assert_close(split_row_sum(256, 4, 32)(a, 0.5), a.sum(dim=1) * 0.5)


@tritile.jit(out_idx=[3])
def flash_decoding(batch, heads, seqlen_q, seqlen_kv, dim, splits, block_M, block_N, threads=128):
    """Attention split over the keys: kernel 0 runs online softmax over each split's keys and
    leaves the split's normalised output and log2-sum-exp in workspaces; kernel 1 weighs the
    splits' outputs by exp2(lse - combined lse)."""
    scale = 1.44269504 / math.sqrt(dim)  # log2(e) / sqrt(dim): softmax in base 2
    per_split = seqlen_kv // splits
    q_shape, kv_shape = [batch, seqlen_q, heads, dim], [batch, seqlen_kv, heads, dim]
    dtype, accum = T.float16, T.float32

    @T.prim_func
    def main(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
             Output: T.Tensor(q_shape, dtype)):
        lse = T.alloc_global([batch, heads, splits, seqlen_q], accum)
        partial_out = T.alloc_global([batch, seqlen_q, heads, splits, dim], accum)
        with T.Kernel(T.ceildiv(seqlen_q, block_M), heads * batch, splits, threads=threads) as (bx, by, sid):
            q_tile = T.alloc_shared([block_M, dim], dtype)
            k_tile = T.alloc_shared([block_N, dim], dtype)
            v_tile = T.alloc_shared([block_N, dim], dtype)
            scores = T.alloc_fragment([block_M, block_N], accum)
            probs = T.alloc_fragment([block_M, block_N], dtype)
            acc = T.alloc_fragment([block_M, dim], accum)
            row_max = T.alloc_fragment([block_M], accum)
            prev_max = T.alloc_fragment([block_M], accum)
            rescale = T.alloc_fragment([block_M], accum)
            row_sum = T.alloc_fragment([block_M], accum)
            denom = T.alloc_fragment([block_M], accum)
            h, b = by % heads, by // heads
            T.copy(Q[b, bx * block_M:(bx + 1) * block_M, h, :], q_tile)
            T.fill(acc, 0)
            T.fill(denom, 0)
            T.fill(row_max, -T.infinity(accum))
            for k in T.Pipelined(T.ceildiv(per_split, block_N), num_stages=2):
                start = per_split * sid + k * block_N
                T.copy(K[b, start:start + block_N, h, :], k_tile)
                T.clear(scores)
                T.gemm(q_tile, k_tile, scores, transpose_B=True)
                T.copy(row_max, prev_max)
                T.reduce_max(scores, row_max, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    rescale[i] = T.exp2(prev_max[i] * scale - row_max[i] * scale)
                for i, j in T.Parallel(block_M, block_N):
                    scores[i, j] = T.exp2(scores[i, j] * scale - row_max[i] * scale)
                T.reduce_sum(scores, row_sum, dim=1)
                for i in T.Parallel(block_M):
                    denom[i] = denom[i] * rescale[i] + row_sum[i]
                T.copy(scores, probs)
                for i, j in T.Parallel(block_M, dim):
                    acc[i, j] *= rescale[i]
                T.copy(V[b, start:start + block_N, h, :], v_tile)
                T.gemm(probs, v_tile, acc)
            for i, j in T.Parallel(block_M, dim):
                acc[i, j] /= denom[i]
            for i in T.Parallel(block_M):
                denom[i] = T.log2(denom[i]) + row_max[i] * scale
            T.copy(denom, lse[b, h, sid, bx * block_M:(bx + 1) * block_M])
            T.copy(acc, partial_out[b, bx * block_M:(bx + 1) * block_M, h, sid, :])
        with T.Kernel(T.ceildiv(seqlen_q, block_M), heads, batch, threads=threads) as (bx, h, b):
            split_lse = T.alloc_fragment([block_M], accum)
            lse_max = T.alloc_fragment([block_M], accum)
            lse_total = T.alloc_fragment([block_M], accum)
            split_out = T.alloc_fragment([block_M, dim], accum)
            out = T.alloc_fragment([block_M, dim], accum)
            T.fill(lse_max, -T.infinity(accum))
            for s in T.serial(splits):
                T.copy(lse[b, h, s, bx * block_M:(bx + 1) * block_M], split_lse)
                for i in T.Parallel(block_M):
                    lse_max[i] = T.max(lse_max[i], split_lse[i])
            T.clear(lse_total)
            for s in T.serial(splits):
                T.copy(lse[b, h, s, bx * block_M:(bx + 1) * block_M], split_lse)
                for i in T.Parallel(block_M):
                    lse_total[i] += T.exp2(split_lse[i] - lse_max[i])
            for i in T.Parallel(block_M):
                lse_total[i] = T.log2(lse_total[i]) + lse_max[i]
            T.clear(out)
            for s in T.serial(splits):
                T.copy(lse[b, h, s, bx * block_M:(bx + 1) * block_M], split_lse)
                T.copy(partial_out[b, bx * block_M:(bx + 1) * block_M, h, s, :], split_out)
                for i, j in T.Parallel(block_M, dim):
                    out[i, j] += split_out[i, j] * T.exp2(split_lse[i] - lse_total[i])
            T.copy(out, Output[b, bx * block_M:(bx + 1) * block_M, h, :])

    return main


def _attention(q, k, v):
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) / math.sqrt(q.shape[-1])
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), v.float()).half()


def test_flash_decoding_split_and_combine(device, assert_close):
    batch, heads, seqlen_q, seqlen_kv, dim = 1, 2, 16, 256, 32
    q = torch.randn(batch, seqlen_q, heads, dim, dtype=torch.float16, device=device)
    k = torch.randn(batch, seqlen_kv, heads, dim, dtype=torch.float16, device=device)
    v = torch.randn(batch, seqlen_kv, heads, dim, dtype=torch.float16, device=device)
    kernel = flash_decoding(batch, heads, seqlen_q, seqlen_kv, dim, 4, 16, 32)
    assert_close(kernel(q, k, v), _attention(q, k, v))


def test_sources_show_every_kernel(gluon_backend):
    kernel = split_row_sum(256, 4, 32)
    tile = kernel.get_source("tile")
    assert "partial = T.alloc_global([4, M], float32)" in tile
    assert tile.index("# kernel main_0") < tile.index("# kernel main_1")
    assert tile.count("with T.Kernel(") == 2
    assert kernel.get_source("layout_inference").count("with T.Kernel(") == 2
    gluon = kernel.get_source("gluon")
    assert gluon.startswith("# kernel 0 of 2: main_0\n") and "# kernel 1 of 2: main_1\n" in gluon
    assert "def main_0(A, Out, partial, M, scale):" in gluon and "def main_1(A, Out, partial, M, scale):" in gluon
    ptx = kernel.get_source("ptx")
    assert ".entry main_0(" in ptx and ".entry main_1(" in ptx
    triton = tritile.compile(split_row_sum.fn(256, 4, 32), out_idx=[1], backend="triton").get_source("triton")
    assert "def main_0(A, Out, partial, M, scale):" in triton and "def main_1(A, Out, partial, M, scale):" in triton


def test_flash_decoding_compiles_for_sm90_and_sm80(gluon_backend):
    kernel = flash_decoding(1, 2, 64, 512, 64, 4, 64, 64)
    for target in ("cuda:90", "cuda:80"):
        ptx = tritile.compile(flash_decoding.fn(1, 2, 64, 512, 64, 4, 64, 64), out_idx=[3],
                              target=target).get_source("ptx")
        assert ptx.count(".entry ") == 2
    assert "wgmma" in kernel.get_source("ptx")


def test_alloc_global_inside_a_kernel_is_a_compile_error():
    with pytest.raises(tritile.CompileError, match=r"T.alloc_global cannot be used inside `with T.Kernel") as info:
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1, threads=64) as _:
                T.alloc_global((64,), T.float32)
    assert "test_kernels_multi_kernel.py" in str(info.value)


def test_workspace_size_without_a_binding_is_a_compile_error():
    n = T.dynamic("n")
    with pytest.raises(tritile.CompileError, match="the symbol 'n' is used but no tensor parameter's shape has it"):
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            scratch = T.alloc_global((n,), T.float32)
            with T.Kernel(1, threads=64) as _:
                T.copy(A, scratch[0:64])


@pytest.mark.gpu
def test_split_and_combine_on_the_gpu_with_both_backends(assert_close):
    a = torch.randn(100, 256, device="cuda")
    q = torch.randn(2, 64, 4, 64, dtype=torch.float16, device="cuda")
    k = torch.randn(2, 1024, 4, 64, dtype=torch.float16, device="cuda")
    v = torch.randn(2, 1024, 4, 64, dtype=torch.float16, device="cuda")
    for backend in ("gluon", "triton"):
        kernel = tritile.compile(split_row_sum.fn(256, 4, 32), out_idx=[1], backend=backend)
        assert_close(kernel(a, 2.0), a.sum(dim=1) * 2.0)
        attention = tritile.compile(flash_decoding.fn(2, 4, 64, 1024, 64, 4, 64, 64), out_idx=[3], backend=backend)
        assert_close(attention(q, k, v), _attention(q, k, v))
