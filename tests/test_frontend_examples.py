"""TileLang's reference kernels (elementwise, FlashAttention fwd, reductions, split-K
atomic_add), written exactly as TileLang users write them, parse and (where the frontend
alone decides the result) run correctly through the interpreter."""
import pytest
import torch

import tritile
import tritile.language as T
from tritile.ir import nodes as ir
from tritile.ir.transform import walk


def elementwise_add(M=128, N=128, block_M=32, block_N=32, dtype="float16"):
    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                y = by * block_M + i
                x = bx * block_N + j
                C[y, x] = A[y, x] + B[y, x]

    return main


def flashattn(batch=1, heads=2, seq_len=128, dim=64, is_causal=True, block_M=64, block_N=64, num_stages=1,
              threads=128):
    scale = (1.0 / dim) ** 0.5 * 1.44269504
    shape = [batch, seq_len, heads, dim]
    dtype = T.float16
    accum_dtype = T.float32

    @T.macro
    def softmax(acc_s, scores_max, scores_max_prev, scores_scale, scores_sum, logsum):
        T.copy(scores_max, scores_max_prev)
        T.reduce_max(acc_s, scores_max, dim=1, clear=False)
        for i in T.Parallel(block_M):
            scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
        for i in T.Parallel(block_M):
            scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
        for i, j in T.Parallel(block_M, block_N):
            acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
        T.reduce_sum(acc_s, scores_sum, dim=1)
        for i in T.Parallel(block_M):
            logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]

    @T.prim_func
    def main(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
             Output: T.Tensor(shape, dtype)):
        with T.Kernel(T.ceildiv(seq_len, block_M), heads, batch, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_M, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            O_shared = T.alloc_shared([block_M, dim], dtype)
            acc_s = T.alloc_fragment([block_M, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_M, block_N], dtype)
            acc_o = T.alloc_fragment([block_M, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_M], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_M], accum_dtype)
            scores_scale = T.alloc_fragment([block_M], accum_dtype)
            scores_sum = T.alloc_fragment([block_M], accum_dtype)
            logsum = T.alloc_fragment([block_M], accum_dtype)

            T.copy(Q[bz, bx * block_M:(bx + 1) * block_M, by, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))
            loop_range = (
                T.min(T.ceildiv(seq_len, block_N), T.ceildiv((bx + 1) * block_M, block_N))
                if is_causal else T.ceildiv(seq_len, block_N))
            for k in T.Pipelined(loop_range, num_stages=num_stages):
                T.copy(K[bz, k * block_N:(k + 1) * block_N, by, :], K_shared)
                if is_causal:
                    for i, j in T.Parallel(block_M, block_N):
                        acc_s[i, j] = T.if_then_else(bx * block_M + i >= k * block_N + j, 0,
                                                     -T.infinity(acc_s.dtype))
                else:
                    T.clear(acc_s)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                softmax(acc_s, scores_max, scores_max_prev, scores_scale, scores_sum, logsum)
                T.copy(acc_s, acc_s_cast)
                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= scores_scale[i]
                T.copy(V[bz, k * block_N:(k + 1) * block_N, by, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, bx * block_M:(bx + 1) * block_M, by, :])

    return main


def row_reduce(M=64, N=128, dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), S: T.Tensor((M,), dtype), X: T.Tensor((M,), dtype)):
        with T.Kernel(1, threads=128) as bx:
            A_local = T.alloc_fragment((M, N), dtype)
            sums = T.alloc_fragment((M,), dtype)
            maxes = T.alloc_fragment((M,), dtype)
            T.copy(A, A_local)
            T.reduce_sum(A_local, sums, dim=1)
            T.reduce_absmax(A_local, maxes, dim=-1)
            T.copy(sums, S)
            T.copy(maxes, X)

    return main


def split_k_gemm(tile_form, M=128, N=128, K=128, block_M=64, block_N=64, block_K=32, split_k=2,
                 dtype="float16", accum_dtype="float", out_dtype="float32"):
    splitK = K // split_k

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), split_k, threads=128) as (bx, by, bz):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_shared = T.alloc_shared((block_M, block_N), out_dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(splitK, block_K), num_stages=0):
                T.copy(A[by * block_M, bz * splitK + ko * block_K], A_shared)
                T.copy(B[bz * splitK + ko * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C_shared)
            if tile_form:
                T.atomic_add(C[by * block_M, bx * block_N], C_shared)
            else:
                for i, j in T.Parallel(block_M, block_N):
                    T.atomic_add(C[by * block_M + i, bx * block_N + j], C_shared[i, j])

    return main



@pytest.mark.parametrize("causal", [True, False])
def test_flash_attention_parses(causal):
    func = flashattn(is_causal=causal)
    nodes = list(walk(func.kernel.body))
    assert any(isinstance(n, ir.Reduce) and n.kind == "max" and not n.clear for n in nodes)
    assert any(isinstance(n, ir.Call) and n.fn == "infinity" for n in nodes)
    gemms = [n for n in nodes if isinstance(n, ir.Gemm)]
    assert [g.transpose_b for g in gemms] == [True, False] and {g.policy for g in gemms} == {"FullRow"}
    (loop,) = [n for n in nodes if isinstance(n, ir.For)]
    assert loop.kind == "pipelined" and isinstance(loop.stop, ir.Var if causal else ir.Const)


def test_elementwise_runs(assert_close):
    kernel = tritile.compile(elementwise_add(), out_idx=-1, target="cpu")
    a, b = torch.randn(128, 128, dtype=torch.float16), torch.randn(128, 128, dtype=torch.float16)
    assert_close(kernel(a, b), a + b)


def test_reductions_run(assert_close):
    kernel = tritile.compile(row_reduce(), out_idx=[1, 2], target="cpu")
    a = torch.randn(64, 128)
    sums, maxes = kernel(a)
    assert_close(sums, a.sum(dim=1))
    assert_close(maxes, a.abs().amax(dim=1))


@pytest.mark.parametrize("tile_form", [False, True], ids=["scalar", "tile"])
def test_split_k_atomic_add(tile_form):
    func = split_k_gemm(tile_form)
    (atomic,) = [n for n in walk(func.kernel.body) if isinstance(n, ir.AtomicAdd)]
    assert isinstance(atomic.value, ir.Region if tile_form else ir.Expr)
    assert atomic.dst.extents == ((1, 64, 64)[1:] if tile_form else (1, 1))
    kernel = tritile.compile(func, target="cpu")
    a, b = torch.randn(128, 128, dtype=torch.float16), torch.randn(128, 128, dtype=torch.float16)
    c = torch.zeros(128, 128)  # the split-K partial sums accumulate into C
    kernel(a, b, c)
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-4, atol=1e-3)
