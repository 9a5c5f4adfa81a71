"""FlashAttention backward (layout [batch, heads, seq, dim]) in TileLang's lazy style.

Three kernels, as in FlashAttention-2:
* `flashattn_fwd` - the forward of examples/flash_attention.py (its `attention_rows` loop) that
  also writes the log-sum-exp of each query row, `LSE = max * scale + log2(sum)` in base 2 (scores scaled by
  1/sqrt(dim) * log2(e)), which is all the backward needs to rebuild P;
* `flashattn_bwd_preprocess` - `Delta[i] = sum_d O[i, d] * dO[i, d]`;
* `flashattn_bwd` - one program per block of `block_M` keys: K and V stay in shared memory, the
  loop walks the query blocks (from the diagonal when causal), rebuilds P^T = exp2(K Q^T * scale
  - LSE), and accumulates dV += P^T dO, dK += dS^T Q (dS = P * (dP - Delta) / sqrt(dim),
  dP^T = V dO^T) in registers; dQ += dS K is added to a float32 dQ with tile atomics (one
  add per query block and key block).

`attention(q, k, v, is_causal)` is an autograd Function over these kernels: forward saves
(q, k, v, o, lse), backward returns dq, dk, dv.  Runs on CUDA when available, else on the CPU
reference interpreter with small sizes.  Run: ``python examples/flash_attention_bwd.py``.
"""
import os
import sys

import torch

import tritile
import tritile.language as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the forward example, beside this one
from flash_attention import attention_rows  # noqa: E402

LOG2E = 1.44269504


@tritile.jit(out_idx=[3, 4])
def flashattn_fwd(batch, heads, seq, dim, is_causal, block_M=64, block_N=64, num_stages=1, threads=128):
    scale = (1.0 / dim) ** 0.5 * LOG2E
    shape = [batch, heads, seq, dim]
    dtype, accum_dtype = "float16", "float"
    rows = attention_rows(seq, 0, dim, is_causal, block_M, block_N, num_stages, dtype, accum_dtype)

    @T.prim_func
    def main(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
             Output: T.Tensor(shape, dtype), LSE: T.Tensor([batch, heads, seq], accum_dtype)):
        with T.Kernel(T.ceildiv(seq, block_M), heads, batch, threads=threads) as (bx, by, bz):
            acc_o, logsum, scores_max = rows(Q, K, V, bx, by, bz)
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, Output[bz, by, bx * block_M:(bx + 1) * block_M, :])
            for i in T.Parallel(block_M):
                logsum[i] = T.log2(logsum[i]) + scores_max[i] * scale
            T.copy(logsum, LSE[bz, by, bx * block_M:(bx + 1) * block_M])

    return main


@tritile.jit(out_idx=[2])
def flashattn_bwd_preprocess(batch, heads, seq, dim, block=32):
    shape = [batch, heads, seq, dim]

    @T.prim_func
    def main(O: T.Tensor(shape, "float16"), dO: T.Tensor(shape, "float16"),
             Delta: T.Tensor([batch, heads, seq], "float")):
        with T.Kernel(T.ceildiv(seq, block), heads, batch, threads=128) as (bx, by, bz):
            o = T.alloc_fragment([block, dim], "float")
            do = T.alloc_fragment([block, dim], "float")
            delta = T.alloc_fragment([block], "float")
            T.copy(O[bz, by, bx * block:(bx + 1) * block, :], o)
            T.copy(dO[bz, by, bx * block:(bx + 1) * block, :], do)
            for i, j in T.Parallel(block, dim):
                o[i, j] *= do[i, j]
            T.reduce_sum(o, delta, dim=1)
            T.copy(delta, Delta[bz, by, bx * block:(bx + 1) * block])

    return main


@tritile.jit
def flashattn_bwd(batch, heads, seq, dim, is_causal, block_M=64, block_N=32, num_stages=1, threads=128):
    sm_scale = (1.0 / dim) ** 0.5
    scale = sm_scale * LOG2E
    shape = [batch, heads, seq, dim]
    dtype, accum_dtype = "float16", "float"

    @T.prim_func
    def main(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
             dO: T.Tensor(shape, dtype), LSE: T.Tensor([batch, heads, seq], accum_dtype),
             Delta: T.Tensor([batch, heads, seq], accum_dtype), dQ: T.Tensor(shape, accum_dtype),
             dK: T.Tensor(shape, dtype), dV: T.Tensor(shape, dtype)):
        with T.Kernel(T.ceildiv(seq, block_M), heads, batch, threads=threads) as (bx, by, bz):
            K_shared = T.alloc_shared([block_M, dim], dtype)
            V_shared = T.alloc_shared([block_M, dim], dtype)
            q = T.alloc_shared([block_N, dim], dtype)
            do = T.alloc_shared([block_N, dim], dtype)
            lse = T.alloc_shared([block_N], accum_dtype)
            delta = T.alloc_shared([block_N], accum_dtype)
            dsT_shared = T.alloc_shared([block_M, block_N], dtype)
            qkT = T.alloc_fragment([block_M, block_N], accum_dtype)
            dpT = T.alloc_fragment([block_M, block_N], accum_dtype)
            pT_cast = T.alloc_fragment([block_M, block_N], dtype)
            dsT_cast = T.alloc_fragment([block_M, block_N], dtype)
            dv = T.alloc_fragment([block_M, dim], accum_dtype)
            dk = T.alloc_fragment([block_M, dim], accum_dtype)
            dq = T.alloc_fragment([block_N, dim], accum_dtype)

            T.copy(K[bz, by, bx * block_M:(bx + 1) * block_M, :], K_shared)
            T.copy(V[bz, by, bx * block_M:(bx + 1) * block_M, :], V_shared)
            T.clear(dv)
            T.clear(dk)
            # causal: query blocks before this key block see none of its keys
            first = T.floordiv(bx * block_M, block_N) if is_causal else 0
            for j in T.Pipelined(first, T.ceildiv(seq, block_N), num_stages=num_stages):
                T.copy(Q[bz, by, j * block_N:(j + 1) * block_N, :], q)
                T.clear(qkT)
                T.gemm(K_shared, q, qkT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)  # (K Q^T)[key, query]
                T.copy(LSE[bz, by, j * block_N:(j + 1) * block_N], lse)
                for i, jj in T.Parallel(block_M, block_N):
                    qkT[i, jj] = T.exp2(qkT[i, jj] * scale - lse[jj])  # P^T
                if is_causal:
                    for i, jj in T.Parallel(block_M, block_N):
                        qkT[i, jj] = T.if_then_else(bx * block_M + i <= j * block_N + jj, qkT[i, jj], 0)
                T.copy(dO[bz, by, j * block_N:(j + 1) * block_N, :], do)
                T.clear(dpT)
                T.gemm(V_shared, do, dpT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)  # (V dO^T) = dP^T
                T.copy(qkT, pT_cast)
                T.gemm(pT_cast, do, dv, policy=T.GemmWarpPolicy.FullRow)  # dV += P^T dO
                T.copy(Delta[bz, by, j * block_N:(j + 1) * block_N], delta)
                for i, jj in T.Parallel(block_M, block_N):
                    dsT_cast[i, jj] = qkT[i, jj] * (dpT[i, jj] - delta[jj]) * sm_scale  # dS^T
                T.gemm(dsT_cast, q, dk, policy=T.GemmWarpPolicy.FullRow)  # dK += dS^T Q
                T.copy(dsT_cast, dsT_shared)
                T.clear(dq)
                T.gemm(dsT_shared, K_shared, dq, transpose_A=True)  # dS K
                T.atomic_add(dQ[bz, by, j * block_N:(j + 1) * block_N, :], dq)
            T.copy(dv, dV[bz, by, bx * block_M:(bx + 1) * block_M, :])
            T.copy(dk, dK[bz, by, bx * block_M:(bx + 1) * block_M, :])

    return main


def tile_config(device_type: str, dim: int) -> dict:
    """Small tiles for the CPU interpreter.  On CUDA the backward runs two warpgroups on 128-key
    blocks: 128-query steps at head dim <= 64, 64 at head dim 128 (dK and dV, 128 x 128 float32
    each, fill the registers) - the best of seven configurations on an H100 (bench/NOTES.md,
    session 16: 76 and 78 TFLOP/s, against 43 and 74 for one warpgroup on 64x64 / 128x32)."""
    if device_type != "cuda":
        return dict(fwd=dict(block_M=32, block_N=32), bwd=dict(block_M=32, block_N=32))
    if dim <= 64:
        return dict(fwd=dict(block_M=64, block_N=64, num_stages=2),
                    bwd=dict(block_M=128, block_N=128, num_stages=2, threads=256))
    return dict(fwd=dict(block_M=128, block_N=128, num_stages=2, threads=256),
                bwd=dict(block_M=128, block_N=64, num_stages=2, threads=256))


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal):
        batch, heads, seq, dim = q.shape
        config = tile_config(q.device.type, dim)
        o, lse = flashattn_fwd(batch, heads, seq, dim, is_causal, **config["fwd"])(q, k, v)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        batch, heads, seq, dim = q.shape
        do = do.contiguous()
        delta = flashattn_bwd_preprocess(batch, heads, seq, dim)(o, do)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        config = tile_config(q.device.type, dim)
        flashattn_bwd(batch, heads, seq, dim, ctx.is_causal, **config["bwd"])(q, k, v, do, lse, delta, dq, dk, dv)
        return dq.to(q.dtype), dk, dv, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v with a tritile forward and backward (fp16, [batch, heads, seq, dim])."""
    return _Attention.apply(q, k, v, is_causal)


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch, heads, seq, dim = (2, 4, 1024, 64) if device == "cuda" else (1, 2, 96, 32)
    for is_causal in (False, True):
        q, k, v = (torch.randn(batch, heads, seq, dim, dtype=torch.float16, device=device, requires_grad=True)
                   for _ in range(3))
        do = torch.randn(batch, heads, seq, dim, dtype=torch.float16, device=device)
        out = attention(q, k, v, is_causal)
        out.backward(do)
        ours = [out, q.grad, k.grad, v.grad]
        q2, k2, v2 = (t.detach().float().requires_grad_() for t in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(q2, k2, v2, is_causal=is_causal)
        ref.backward(do.float())
        for name, got, want in zip(("out", "dq", "dk", "dv"), ours, [ref, q2.grad, k2.grad, v2.grad]):
            error = (got.float() - want).abs().max().item()
            print(f"flash attention bwd b={batch} h={heads} s={seq} d={dim} causal={is_causal} on {device}: "
                  f"{name} max |tritile - torch| = {error:.3e}")
            torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    print("All checks passed.")


if __name__ == "__main__":
    main()
