"""GQA decoding attention with split KV (flash-decoding), in TileLang's lazy style.

One new query token per sequence: q (batch, heads, dim) against a cache K, V (batch, kv_heads,
seq, dim), heads = groups * kv_heads.  Two kernels:
* `decode_split` - one program per (batch, kv head, split): the `groups` query heads of the kv
  head fill the top rows of a `block_H`-row tile (wgmma's 64-row minimum; the rows below are
  computed and dropped), and the online softmax of examples/flash_attention.py walks the
  split's `block_N`-key tiles (keys past `seq` masked), writing the split's normalised partial
  output and its base-2 log-sum-exp;
* `decode_combine` - one program per (batch, head): the splits' outputs weighted by
  exp2(lse - max lse), normalised.
Splits spread one sequence's keys over many SMs when batch * kv_heads alone cannot fill them.
Runs on CUDA when available, else on the CPU reference interpreter with small sizes.
Run: ``python examples/flash_decoding.py``.
"""
import torch

import tritile
import tritile.language as T

LOG2E = 1.44269504


@tritile.jit(out_idx=[3, 4])
def decode_split(batch, heads, kv_heads, seq, dim, num_split, block_N=128, block_H=64, num_stages=2, threads=128):
    scale = (1.0 / dim) ** 0.5 * LOG2E
    groups = heads // kv_heads
    chunk = -(-seq // num_split)
    chunk = -(-chunk // block_N) * block_N  # keys per split: whole tiles, so splits never share one
    dtype, accum_dtype = "float16", "float"

    @T.prim_func
    def main(Q: T.Tensor([batch, heads, dim], dtype), K: T.Tensor([batch, kv_heads, seq, dim], dtype),
             V: T.Tensor([batch, kv_heads, seq, dim], dtype),
             O_partial: T.Tensor([batch, heads, num_split, dim], accum_dtype),
             LSE_partial: T.Tensor([batch, heads, num_split], accum_dtype)):
        with T.Kernel(num_split, kv_heads, batch, threads=threads) as (sid, hid, bid):
            Q_shared = T.alloc_shared([block_H, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            acc_s = T.alloc_fragment([block_H, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_H, block_N], dtype)
            acc_o = T.alloc_fragment([block_H, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_H], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_H], accum_dtype)
            scores_scale = T.alloc_fragment([block_H], accum_dtype)
            scores_sum = T.alloc_fragment([block_H], accum_dtype)
            logsum = T.alloc_fragment([block_H], accum_dtype)

            T.copy(Q[bid, hid * groups:hid * groups + block_H, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))
            start = sid * chunk
            for k in T.Pipelined(T.ceildiv(T.min(chunk, seq - start), block_N), num_stages=num_stages):
                T.copy(K[bid, hid, start + k * block_N:start + (k + 1) * block_N, :], K_shared)
                T.clear(acc_s)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(block_H, block_N):  # keys past the cache's end
                    acc_s[i, j] = T.if_then_else(start + k * block_N + j < seq, acc_s[i, j], -T.infinity(accum_dtype))
                T.copy(scores_max, scores_max_prev)
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_H):
                    scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_H, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                for i in T.Parallel(block_H):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                T.copy(acc_s, acc_s_cast)
                for i, j in T.Parallel(block_H, dim):
                    acc_o[i, j] *= scores_scale[i]
                T.copy(V[bid, hid, start + k * block_N:start + (k + 1) * block_N, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_H, dim):
                if i < groups:  # the rows of this kv head's query heads
                    O_partial[bid, hid * groups + i, sid, j] = acc_o[i, j] / logsum[i]
            for i in T.Parallel(block_H):
                if i < groups:
                    LSE_partial[bid, hid * groups + i, sid] = T.log2(logsum[i]) + scores_max[i] * scale

    return main


@tritile.jit(out_idx=[2])
def decode_combine(batch, heads, num_split, dim, threads=128):
    @T.prim_func
    def main(O_partial: T.Tensor([batch, heads, num_split, dim], "float"),
             LSE_partial: T.Tensor([batch, heads, num_split], "float"), Output: T.Tensor([batch, heads, dim], "float16")):
        with T.Kernel(heads, batch, threads=threads) as (hid, bid):
            lse = T.alloc_fragment([num_split], "float")
            lse_max = T.alloc_fragment([1], "float")
            weight_sum = T.alloc_fragment([1], "float")
            parts = T.alloc_fragment([num_split, dim], "float")
            out = T.alloc_fragment([dim], "float")
            T.copy(LSE_partial[bid, hid, :], lse)
            T.copy(O_partial[bid, hid, :, :], parts)
            T.reduce_max(lse, lse_max, dim=0)
            for s in T.Parallel(num_split):
                lse[s] = T.exp2(lse[s] - lse_max[0])
            T.reduce_sum(lse, weight_sum, dim=0)
            for s, j in T.Parallel(num_split, dim):
                parts[s, j] *= lse[s]
            T.reduce_sum(parts, out, dim=0)
            for j in T.Parallel(dim):
                out[j] /= weight_sum[0]
            T.copy(out, Output[bid, hid, :])

    return main


def tile_config(device_type: str, batch: int, kv_heads: int, seq: int) -> dict:
    """Small tiles for the CPU interpreter.  On CUDA: 128-key tiles, and as many splits (a power
    of two, up to 16) as it takes for batch * kv_heads * splits to cover the H100's 132 SMs;
    three stages without a split, two with (an H100 sweep, bench/NOTES.md session 16: 2.92
    against 2.71 TB/s unsplit at 64x32/8x8192x128; at 8x64/8x32768 four splits, 2.79)."""
    if device_type != "cuda":
        return dict(block_N=32, block_H=16, num_split=2, num_stages=1)
    splits = 1
    while splits < 16 and batch * kv_heads * splits < 132 and seq // (splits * 2) >= 128:
        splits *= 2
    return dict(block_N=128, block_H=64, num_split=splits, num_stages=3 if splits == 1 else 2)


def gqa_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of one query token per sequence: q (batch, heads, dim), k / v (batch, kv_heads, seq, dim)."""
    batch, heads, dim = q.shape
    kv_heads, seq = k.shape[1], k.shape[2]
    config = tile_config(q.device.type, batch, kv_heads, seq)
    o_partial, lse_partial = decode_split(batch, heads, kv_heads, seq, dim, **config)(q, k, v)
    if config["num_split"] == 1:  # one split is already normalised: nothing to combine
        return o_partial[:, :, 0].to(q.dtype)
    return decode_combine(batch, heads, config["num_split"], dim)(o_partial, lse_partial)


def ref_program(q, k, v):
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1).float(), v.repeat_interleave(groups, dim=1).float()
    scores = torch.einsum("bhd,bhsd->bhs", q.float(), k) / q.shape[-1] ** 0.5
    return torch.einsum("bhs,bhsd->bhd", scores.softmax(-1), v).to(q.dtype)


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch, heads, kv_heads, seq, dim = (8, 32, 8, 8192, 128) if device == "cuda" else (2, 8, 2, 200, 32)
    q = torch.randn(batch, heads, dim, dtype=torch.float16, device=device)
    k, v = (torch.randn(batch, kv_heads, seq, dim, dtype=torch.float16, device=device) for _ in range(2))
    out = gqa_decode(q, k, v)
    ref = ref_program(q, k, v)
    error = (out.float() - ref.float()).abs().max().item()
    print(f"gqa decode b={batch} h={heads} h_kv={kv_heads} s={seq} d={dim} on {device}: max |tritile - torch| = {error:.3e}")
    torch.testing.assert_close(out, ref, rtol=1e-2, atol=1e-2)
    print("All checks passed.")


if __name__ == "__main__":
    main()
