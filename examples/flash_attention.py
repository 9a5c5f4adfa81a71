"""FlashAttention forward (layout [batch, heads, seq, dim]) in TileLang's lazy style.

`flashattn(...)` returns a `@T.prim_func`; `@tritile.jit(out_idx=[3])` turns it into a kernel that
allocates and returns `Output`.  The softmax is the online one: a running row max (`T.reduce_max`
with `clear=False`), `exp2` with the softmax scale folded together with log2(e), and a rescale of
the running output whenever the max grows; that loop is `attention_rows`, a `@T.macro` of the
library module tritile/ops/attention.py, whose forward with log-sum-exp shares it.  Runs on CUDA
when available, else on the CPU reference interpreter with small sizes.  Run: ``python examples/flash_attention.py``.
`tritile_attention(q, k, v, is_causal)` is what bench/bench_h100.py times.
"""
import torch
import torch.nn.functional as F

import tritile
import tritile.language as T
from tritile.ops.attention import attention_rows


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
