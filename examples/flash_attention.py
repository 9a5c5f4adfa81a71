"""FlashAttention forward (layout [batch, heads, seq, dim]) in TileLang's lazy style.

`flashattn(...)` returns a `@T.prim_func`; `@tritile.jit(out_idx=[3])` turns it into a kernel that
allocates and returns `Output`.  The softmax is the online one: a running row max (`T.reduce_max`
with `clear=False`), `exp2` with the softmax scale folded together with log2(e), and a rescale of
the running output whenever the max grows; that loop is `attention_rows`, a `@T.macro` the
backward example's forward (examples/flash_attention_bwd.py) shares.  Runs on CUDA when available, else on the CPU
reference interpreter with small sizes.  Run: ``python examples/flash_attention.py``.
`tritile_attention(q, k, v, is_causal)` is what bench/bench_h100.py times.
"""
import torch
import torch.nn.functional as F

import tritile
import tritile.language as T


def attention_rows(seq_kv, past_len, dim, is_causal, block_M, block_N, num_stages, dtype="float16",
                   accum_dtype="float"):
    """The forward's main loop as a `@T.macro`: over the key tiles of query rows
    [bx * block_M, (bx + 1) * block_M) of head (bz, by), it leaves the unnormalised output in
    `acc_o`, the softmax denominators in `logsum` and the running row maxima in `scores_max`
    (scores in base 2: scaled by 1/sqrt(dim) * log2(e)), and returns those three fragments.
    Shared by this example's kernel and examples/flash_attention_bwd.py's forward, which also
    writes the log-sum-exp."""
    scale = (1.0 / dim) ** 0.5 * 1.44269504  # 1/sqrt(dim) * log2(e)

    @T.macro
    def rows(Q, K, V, bx, by, bz):
        Q_shared = T.alloc_shared([block_M, dim], dtype)
        K_shared = T.alloc_shared([block_N, dim], dtype)
        V_shared = T.alloc_shared([block_N, dim], dtype)
        acc_s = T.alloc_fragment([block_M, block_N], accum_dtype)
        acc_s_cast = T.alloc_fragment([block_M, block_N], dtype)
        acc_o = T.alloc_fragment([block_M, dim], accum_dtype)
        scores_max = T.alloc_fragment([block_M], accum_dtype)
        scores_max_prev = T.alloc_fragment([block_M], accum_dtype)
        scores_scale = T.alloc_fragment([block_M], accum_dtype)
        scores_sum = T.alloc_fragment([block_M], accum_dtype)
        logsum = T.alloc_fragment([block_M], accum_dtype)

        T.copy(Q[bz, by, bx * block_M:(bx + 1) * block_M, :], Q_shared)
        T.fill(acc_o, 0)
        T.fill(logsum, 0)
        T.fill(scores_max, -T.infinity(accum_dtype))

        loop_range = (
            T.min(T.ceildiv(seq_kv, block_N), T.ceildiv((bx + 1) * block_M + past_len, block_N))
            if is_causal else T.ceildiv(seq_kv, block_N))

        for k in T.Pipelined(loop_range, num_stages=num_stages):
            # S = Q K^T, with future keys masked to -inf when causal
            T.copy(K[bz, by, k * block_N:(k + 1) * block_N, :], K_shared)
            if is_causal:
                for i, j in T.Parallel(block_M, block_N):
                    q_idx = bx * block_M + i + past_len
                    k_idx = k * block_N + j
                    acc_s[i, j] = T.if_then_else(q_idx >= k_idx, 0, -T.infinity(acc_s.dtype))
            else:
                T.clear(acc_s)
            T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

            # online softmax
            T.copy(scores_max, scores_max_prev)
            T.fill(scores_max, -T.infinity(accum_dtype))
            T.reduce_max(acc_s, scores_max, dim=1, clear=False)
            for i in T.Parallel(block_M):  # a row with every key of the tile masked keeps its max
                scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
            for i in T.Parallel(block_M):
                scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
            for i, j in T.Parallel(block_M, block_N):
                acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
            T.reduce_sum(acc_s, scores_sum, dim=1)
            for i in T.Parallel(block_M):
                logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
            T.copy(acc_s, acc_s_cast)

            # O = O * rescale + P V
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] *= scores_scale[i]
            T.copy(V[bz, by, k * block_N:(k + 1) * block_N, :], V_shared)
            T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
        return acc_o, logsum, scores_max

    return rows


@tritile.jit(out_idx=[3])
def flashattn(batch, heads, seq_q, seq_kv, dim, is_causal, block_M=64, block_N=64, num_stages=1,
              threads=128):
    q_shape = [batch, heads, seq_q, dim]
    kv_shape = [batch, heads, seq_kv, dim]
    dtype = "float16"
    accum_dtype = "float"
    rows = attention_rows(seq_kv, seq_kv - seq_q, dim, is_causal, block_M, block_N, num_stages, dtype, accum_dtype)

    @T.prim_func
    def main(
            Q: T.Tensor(q_shape, dtype),
            K: T.Tensor(kv_shape, dtype),
            V: T.Tensor(kv_shape, dtype),
            Output: T.Tensor(q_shape, dtype),
    ):
        with T.Kernel(T.ceildiv(seq_q, block_M), heads, batch, threads=threads) as (bx, by, bz):
            acc_o, logsum, scores_max = rows(Q, K, V, bx, by, bz)
            O_shared = T.alloc_shared([block_M, dim], dtype)
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, by, bx * block_M:(bx + 1) * block_M, :])

    return main


def ref_program(Q, K, V, is_causal):
    dim = Q.size(-1)
    scores = torch.einsum("bhqd,bhkd->bhqk", Q.float(), K.float()) / dim ** 0.5
    if is_causal:
        seq_q, seq_kv = Q.size(2), K.size(2)
        mask = torch.ones(seq_q, seq_kv, device=Q.device).tril(diagonal=seq_kv - seq_q)
        scores = scores.masked_fill(mask == 0, float("-inf"))
    return torch.einsum("bhqk,bhkd->bhqd", F.softmax(scores, dim=-1), V.float()).to(Q.dtype)


def tile_config(device_type: str, dim: int = 128, is_causal: bool = False) -> dict:
    """On CUDA: TileLang's tuned Hopper config (128x128 tiles, two warpgroups) for head dim 128;
    for head dim <= 64, one warpgroup on 64-row tiles, small enough for several CTAs an SM to
    overlap each other's softmax: 64x128 (three CTAs, 72 KB of shared memory once the
    epilogue reuses Q's bytes), or 64x64 when causal, whose short diagonal rows favour the
    smaller tile (H100, 16x16x1024x64: 424 and 327 TFLOP/s against 400 and 318 the other
    way round, bench/results/d64_smem_whatif_h100.txt).  Small tiles for the CPU interpreter."""
    if device_type != "cuda":
        return dict(block_M=64, block_N=64, num_stages=1, threads=128)
    if dim <= 64:
        return dict(block_M=64, block_N=64 if is_causal else 128, num_stages=2, threads=128)
    return dict(block_M=128, block_N=128, num_stages=2, threads=256)


def tritile_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v for fp16 [batch, heads, seq, dim] tensors (used by the benchmarks)."""
    batch, heads, seq_q, dim = q.shape
    kernel = flashattn(batch, heads, seq_q, k.shape[2], dim, is_causal, **tile_config(q.device.type, dim, is_causal))
    return kernel(q, k, v)


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch, heads, seq, dim = (1, 8, 1024, 64) if device == "cuda" else (1, 2, 128, 64)
    for is_causal in (False, True):
        q, k, v = (torch.randn(batch, heads, seq, dim, dtype=torch.float16, device=device)
                   for _ in range(3))
        out = tritile_attention(q, k, v, is_causal)
        ref = ref_program(q, k, v, is_causal)
        max_error = (out.float() - ref.float()).abs().max().item()
        print(f"flash attention b={batch} h={heads} s={seq} d={dim} causal={is_causal} on {device}: "
              f"max |tritile - torch| = {max_error:.3e}")
        torch.testing.assert_close(out, ref, rtol=1e-2, atol=1e-2)
    print("All checks passed.")


if __name__ == "__main__":
    main()
