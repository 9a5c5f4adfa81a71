"""FlashAttention forward and backward (layout [batch, heads, seq, dim]) as T-language kernels
and the torch operator `torch.ops.tritile.attention`.

Contract:
* `attention_rows(...)` is the forward's main loop (a `@T.macro` factory): the online softmax
  over the key tiles of one block of query rows.  examples/flash_attention.py builds its forward
  on it, `flashattn_fwd` here too.
* `flashattn_fwd` writes O and the log-sum-exp of each query row, `LSE = max * scale + log2(sum)`
  in base 2 (scores scaled by `sm_scale * log2(e)`), all the backward needs to rebuild P;
  `flashattn_bwd_preprocess` computes `Delta[i] = sum_d O[i, d] * dO[i, d]`; `flashattn_bwd` runs
  one program per block of `block_M` keys: K and V stay in shared memory, the loop walks the
  query blocks (from the diagonal when causal), rebuilds P^T = exp2(K Q^T * scale - LSE), and
  accumulates dV += P^T dO, dK += dS^T Q (dS = P * (dP - Delta) * sm_scale, dP^T = V dO^T) in
  registers; dQ += dS K is added to a float32 dQ with tile atomics (FlashAttention-2).
  Grouped-query attention (`groups` query heads per K/V head): the forward reads K and V of head
  `head // groups`; a backward program takes a key block of one K/V head through the query
  blocks of its whole group in one pipelined loop, dK / dV summing them in registers and stored
  once.  A key length that is not a multiple of the key tile is masked to -inf.
* `attention(q, k, v, is_causal, scale)` (registered as `torch.ops.tritile.attention`) is
  `F.scaled_dot_product_attention(q, k, v, is_causal=..., scale=..., enable_gqa=True)` without
  mask or dropout; it returns `(out, lse)`, so the forward's log-sum-exp is there for the
  backward (`torch.ops.tritile.attention_backward`, its registered autograd formula).  Both have
  fake implementations for tracing.  `check_attention_arguments` raises TypeError / ValueError
  naming the argument for what the kernels do not take: q, k, v 4-D of one dtype (fp16 / bf16;
  fp32 too on the CPU interpreter) on one device, K and V of one shape, query heads a multiple of
  K/V heads, head dim 64 or 128 on CUDA (16 and 32 too on the CPU), causal only with as many
  queries as keys (SDPA's causal mask is top-left aligned, the kernels' bottom-right one agrees
  only then).
"""
from __future__ import annotations

from typing import Optional

import torch

import tritile
import tritile.language as T
from tritile import switches
from tritile.ops import registration
from tritile.ops.signatures import MISSES, Remembered, signature

LOG2E = 1.44269504
# torch dtype -> T dtype name; float32 is the CPU interpreter's (the tests' models)
DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
GPU_DTYPES = (torch.float16, torch.bfloat16)
HEAD_DIMS = {"cuda": (64, 128), "cpu": (16, 32, 64, 128)}


# The schedule switches the backward is built under, measured on the H100 (bench/NOTES.md):
# * the tiles of views (q / k / v of a fused projection, a transposed dO) by cp.async rather than
#   4-D TMA descriptors: 0.688 against 0.745 ms at 8x16x2048x64 causal, where the forward gains
#   from them (0.182 against 0.201; session 20);
# * a producer warp: `auto` refuses it on 128 x 128 / 128 x 64 tiles by its register bound (the
#   fragments, 256 registers a thread at head dim 128, 288 at 64, over the 240 setmaxnreg leaves
#   the consumers), but ptxas fits head dim 128 in 240 without a spill, and it ran 3.18 against
#   3.56 ms at 4x32x4096x128 causal (1.01x cuDNN against 0.87), 5.98 against 6.41 non-causal (0.93x
#   against 0.86; session 21).  At head dim 64 non-causal (56 bytes of spills) it lost while dQ
#   went by atomics from the registers (0.662 against 0.616 ms at 16x16x1024), and wins since dQ
#   is a TMA reduce (0.515-0.527 against 0.578-0.580 ms, cuDNN 0.532; session 22).  GQA's loop
#   over the group's steps ran 1.01-1.10x SDPA with it, 0.82-1.05x without (session 23).
BACKWARD_SWITCHES = {"TRITILE_FULL_RANK_TMA": "off", "TRITILE_WARP_SPECIALIZE": "on"}


def attention_rows(seq_kv, past_len, dim, is_causal, block_M, block_N, num_stages, dtype="float16",
                   accum_dtype="float", sm_scale=None, groups=1):
    """The forward's main loop as a `@T.macro`: over the key tiles of query rows
    [bx * block_M, (bx + 1) * block_M) of head (bz, by) (K/V head by // groups), it leaves the
    unnormalised output in `acc_o`, the softmax denominators in `logsum` and the running row
    maxima in `scores_max` (scores in base 2: scaled by sm_scale * log2(e), sm_scale 1/sqrt(dim)
    unless given), and returns those three fragments.  Causal: query i sees keys up to
    i + past_len."""
    scale = ((1.0 / dim) ** 0.5 if sm_scale is None else sm_scale) * LOG2E
    ragged_keys = not is_causal and seq_kv % block_N != 0  # the last key tile reads past the keys

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
            # S = Q K^T, with future keys (and keys past the end) masked to -inf
            if groups > 1:
                T.copy(K[bz, by // groups, k * block_N:(k + 1) * block_N, :], K_shared)
            else:
                T.copy(K[bz, by, k * block_N:(k + 1) * block_N, :], K_shared)
            if is_causal:
                for i, j in T.Parallel(block_M, block_N):
                    q_idx = bx * block_M + i + past_len
                    k_idx = k * block_N + j
                    acc_s[i, j] = T.if_then_else(q_idx >= k_idx, 0, -T.infinity(acc_s.dtype))
            elif ragged_keys:
                for i, j in T.Parallel(block_M, block_N):
                    acc_s[i, j] = T.if_then_else(k * block_N + j < seq_kv, 0, -T.infinity(acc_s.dtype))
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
            if groups > 1:
                T.copy(V[bz, by // groups, k * block_N:(k + 1) * block_N, :], V_shared)
            else:
                T.copy(V[bz, by, k * block_N:(k + 1) * block_N, :], V_shared)
            T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
        return acc_o, logsum, scores_max

    return rows


def global_tensor(shape, dtype, strides=None):
    """`T.Tensor(shape, dtype)`, or with `strides` (a view the caller passes as it is: q / k / v
    sliced out of a fused projection, an output laid out [batch, seq, heads, dim])
    `T.StridedTensor(shape, strides, dtype)`."""
    return T.Tensor(shape, dtype) if strides is None else T.StridedTensor(shape, strides, dtype)


@tritile.jit(out_idx=[3, 4])
def flashattn_fwd(batch, heads, seq, dim, is_causal, block_M=64, block_N=64, num_stages=1, threads=128,
                  seq_kv=None, groups=1, sm_scale=None, dtype="float16", strides=None):
    """O and the log-sum-exp; `strides` (None: all contiguous) maps "Q", "K", "V", "O" to the
    strides of a view (`views_of`)."""
    seq_kv = seq if seq_kv is None else seq_kv
    scale = ((1.0 / dim) ** 0.5 if sm_scale is None else sm_scale) * LOG2E
    q_shape, kv_shape = [batch, heads, seq, dim], [batch, heads // groups, seq_kv, dim]
    accum_dtype = "float"
    strides = dict(strides or ())
    rows = attention_rows(seq_kv, 0, dim, is_causal, block_M, block_N, num_stages, dtype, accum_dtype,
                          sm_scale, groups)
    q_type, o_type = global_tensor(q_shape, dtype, strides.get("Q")), global_tensor(q_shape, dtype, strides.get("O"))
    k_type, v_type = (global_tensor(kv_shape, dtype, strides.get(name)) for name in ("K", "V"))

    @T.prim_func
    def main(Q: q_type, K: k_type, V: v_type, Output: o_type, LSE: T.Tensor([batch, heads, seq], accum_dtype)):
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
def flashattn_bwd_preprocess(batch, heads, seq, dim, block=32, dtype="float16", strides=None):
    shape = [batch, heads, seq, dim]
    strides = dict(strides or ())
    o_type, do_type = (global_tensor(shape, dtype, strides.get(name)) for name in ("O", "dO"))

    @T.prim_func
    def main(O: o_type, dO: do_type, Delta: T.Tensor([batch, heads, seq], "float")):
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
def flashattn_bwd(batch, heads, seq, dim, is_causal, block_M=64, block_N=32, num_stages=1, threads=128,
                  seq_kv=None, groups=1, sm_scale=None, dtype="float16", strides=None):
    """dQ (float32, added atomically), dK and dV.  A program takes a block of keys of one K/V
    head; with `groups` > 1 it walks the query blocks of the group's query heads in one
    pipelined loop over (head, query block) steps - one pipeline, and a producer warp, for the
    whole group - its dK / dV summing their contributions in registers.  `strides` maps "Q",
    "K", "V", "dO" to the strides of a view."""
    seq_kv = seq if seq_kv is None else seq_kv
    sm_scale = (1.0 / dim) ** 0.5 if sm_scale is None else sm_scale
    scale = sm_scale * LOG2E
    q_shape, kv_shape = [batch, heads, seq, dim], [batch, heads // groups, seq_kv, dim]
    accum_dtype = "float"
    strides = dict(strides or ())
    q_type, do_type = (global_tensor(q_shape, dtype, strides.get(name)) for name in ("Q", "dO"))
    k_type, v_type = (global_tensor(kv_shape, dtype, strides.get(name)) for name in ("K", "V"))

    @T.macro
    def query_block(Q, dO, LSE, Delta, dQ, K_shared, V_shared, q, do, lse, delta, dsT_shared, qkT, dpT, pT_cast,
                    dsT_cast, dv, dk, dq, bx, bz, head, j):
        """Query block j of query head `head` against key block bx: dV, dK accumulate, dQ is added.
        Keys past the end (a ragged last block) read as zero rows: their dK / dV rows are not
        stored, and their zero K rows add nothing to dQ."""
        T.copy(Q[bz, head, j * block_N:(j + 1) * block_N, :], q)
        T.clear(qkT)
        T.gemm(K_shared, q, qkT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)  # (K Q^T)[key, query]
        T.copy(LSE[bz, head, j * block_N:(j + 1) * block_N], lse)
        for i, jj in T.Parallel(block_M, block_N):
            qkT[i, jj] = T.exp2(qkT[i, jj] * scale - lse[jj])  # P^T
        if is_causal:
            for i, jj in T.Parallel(block_M, block_N):
                qkT[i, jj] = T.if_then_else(bx * block_M + i <= j * block_N + jj, qkT[i, jj], 0)
        T.copy(dO[bz, head, j * block_N:(j + 1) * block_N, :], do)
        T.clear(dpT)
        T.gemm(V_shared, do, dpT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)  # (V dO^T) = dP^T
        T.copy(qkT, pT_cast)
        T.gemm(pT_cast, do, dv, policy=T.GemmWarpPolicy.FullRow)  # dV += P^T dO
        T.copy(Delta[bz, head, j * block_N:(j + 1) * block_N], delta)
        for i, jj in T.Parallel(block_M, block_N):
            dsT_cast[i, jj] = qkT[i, jj] * (dpT[i, jj] - delta[jj]) * sm_scale  # dS^T
        T.copy(dsT_cast, dsT_shared)
        T.clear(dq)
        # dQ's product first: dK's then runs on the tensor cores while dQ is staged and added
        # (+1-3 %, bench/NOTES.md session 23)
        T.gemm(dsT_shared, K_shared, dq, transpose_A=True)  # dS K
        T.gemm(dsT_cast, q, dk, policy=T.GemmWarpPolicy.FullRow)  # dK += dS^T Q
        T.atomic_add(dQ[bz, head, j * block_N:(j + 1) * block_N, :], dq)

    @T.prim_func
    def main(Q: q_type, K: k_type, V: v_type, dO: do_type, LSE: T.Tensor([batch, heads, seq], accum_dtype),
             Delta: T.Tensor([batch, heads, seq], accum_dtype), dQ: T.Tensor(q_shape, accum_dtype),
             dK: T.Tensor(kv_shape, dtype), dV: T.Tensor(kv_shape, dtype)):
        with T.Kernel(T.ceildiv(seq_kv, block_M), heads // groups, batch, threads=threads) as (bx, by, bz):
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
            buffers = (K_shared, V_shared, q, do, lse, delta, dsT_shared, qkT, dpT, pT_cast, dsT_cast, dv, dk, dq)
            # causal: query blocks before this key block see none of its keys
            first = T.floordiv(bx * block_M, block_N) if is_causal else 0
            if groups == 1:
                for j in T.Pipelined(first, T.ceildiv(seq, block_N), num_stages=num_stages):
                    query_block(Q, dO, LSE, Delta, dQ, *buffers, bx, bz, by, j)
            else:
                # one loop over the group's (query head, query block) steps: a loop per head around
                # the pipelined one measured 0.79-0.89x SDPA (no producer warp for a nested loop,
                # and a pipeline filled and drained per head), this one 1.01-1.10x (session 23)
                blocks = T.ceildiv(seq, block_N) - first
                for step in T.Pipelined(groups * blocks, num_stages=num_stages):
                    # the mins change nothing (step < groups * blocks); they bound the head and the
                    # query block for the range analysis when `blocks` is not a constant (causal),
                    # so that dQ's tile atomic stays one TMA reduce
                    query_block(Q, dO, LSE, Delta, dQ, *buffers, bx, bz,
                                by * groups + T.min(step // blocks, groups - 1),
                                T.min(first + step % blocks, T.ceildiv(seq, block_N) - 1))
            T.copy(dv, dV[bz, by, bx * block_M:(bx + 1) * block_M, :])
            T.copy(dk, dK[bz, by, bx * block_M:(bx + 1) * block_M, :])

    return main


def tile_config(device_type: str, dim: int, is_causal: bool = False) -> dict:
    """Small tiles for the CPU interpreter.  On CUDA the backward runs two warpgroups on 128-key
    blocks: 128-query steps at head dim <= 64 (64 when causal), 64 at head dim 128 (dK and dV,
    128 x 128 float32 each, fill the registers) - the best of seven configurations on an H100
    (bench/NOTES.md, session 16: 76 and 78 TFLOP/s, against 43 and 74 for one warpgroup on 64x64
    / 128x32); causal at head dim 64, 64-query steps ran 0.89-0.91x the time of 128 (session 21:
    0.598 against 0.673 ms at 8x16x2048, 1.015 against 1.140 at 4x16x4096), non-causal 1.36x."""
    if device_type != "cuda":
        return dict(fwd=dict(block_M=32, block_N=32), bwd=dict(block_M=32, block_N=32))
    if dim <= 64:
        return dict(fwd=dict(block_M=64, block_N=64, num_stages=2),
                    bwd=dict(block_M=128, block_N=64 if is_causal else 128, num_stages=2, threads=256))
    return dict(fwd=dict(block_M=128, block_N=128, num_stages=2, threads=256),
                bwd=dict(block_M=128, block_N=64, num_stages=2, threads=256))


def attention_refusal(q, k, v, is_causal: bool) -> tuple:
    """(None, '') when the kernels take these tensors (or fake tensors), else (TypeError or
    ValueError, why not, naming the argument)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            return TypeError, f"argument '{name}' is not a tensor"
        if t.dim() != 4:
            return ValueError, f"argument '{name}' has shape {list(t.shape)}, not [batch, heads, seq, dim]"
        device_type = "cuda" if t.device.type == "cuda" else "cpu"
        dtypes = GPU_DTYPES if device_type == "cuda" else tuple(DTYPES)
        if t.dtype not in dtypes:
            return TypeError, f"argument '{name}' has dtype {t.dtype} (taken on {device_type}: " \
                              f"{', '.join(map(str, dtypes))})"
        if t.dtype != q.dtype or t.device != q.device:
            return TypeError, f"argument '{name}' is {t.dtype} on {t.device}, but 'q' is {q.dtype} on {q.device}"
    if k.shape != v.shape:
        return ValueError, f"argument 'v' has shape {list(v.shape)}, but 'k' has {list(k.shape)}"
    (batch, heads, seq, dim), (kv_batch, kv_heads, seq_kv, kv_dim) = q.shape, k.shape
    if kv_batch != batch or kv_dim != dim:
        return ValueError, f"argument 'k' has shape {list(k.shape)}, which does not match 'q' of shape {list(q.shape)}"
    if heads % kv_heads != 0:
        return ValueError, f"argument 'k' has {kv_heads} heads, which do not divide the {heads} query heads"
    dims = HEAD_DIMS["cuda" if q.device.type == "cuda" else "cpu"]
    if dim not in dims:
        return ValueError, f"argument 'q' has head dim {dim} (taken on {q.device.type}: {', '.join(map(str, dims))})"
    if is_causal and seq != seq_kv:
        return ValueError, f"causal attention with {seq} queries and {seq_kv} keys (taken with as many queries as keys)"
    return None, ""


def check_attention_arguments(q, k, v, is_causal: bool) -> None:
    """Raise TypeError (type / dtype / device) or ValueError (shape) unless the kernels take these."""
    error, refusal = attention_refusal(q, k, v, is_causal)
    if error is not None:
        raise error(f"tritile.attention: {refusal}")


def as_passed(t: torch.Tensor) -> torch.Tensor:
    """`t` as the kernels take it: as it is when its rows are contiguous (a view whose head dim
    has stride 1: q / k / v sliced out of a fused projection, a transposed [batch, seq, heads,
    dim] tensor) - a copy with the same strides where its address is not 16-byte aligned, as
    kernels are compiled to assume -, else a contiguous copy.  The strides alone decide which,
    so every call of one signature passes what its remembered kernel declares."""
    if t.stride(-1) != 1:
        return t.contiguous()
    if t.is_contiguous() or t.data_ptr() % 16 == 0:
        return t
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)


def views_of(**tensors) -> tuple:
    """(name, strides) of each of `tensors` (as `as_passed` gives them) that is a view: the
    kernels declare those `T.StridedTensor`s and read them in place."""
    return tuple((name, tuple(t.stride())) for name, t in tensors.items() if not t.is_contiguous())


def output_strides(q: torch.Tensor) -> Optional[tuple]:
    """The output's strides: None (contiguous) for a contiguous q, else those of a [batch, seq,
    heads, dim] layout (FlashAttention's and SDPA's for a query view), whose `transpose(1, 2)
    .reshape(batch, seq, heads * dim)` is free."""
    if q.is_contiguous() or q.stride(-1) != 1:
        return None
    batch, heads, seq, dim = q.shape
    return (seq * heads * dim, dim, heads * dim, 1)


def _kernel_args(q, k, is_causal: bool, scale: Optional[float]) -> dict:
    batch, heads, seq, dim = q.shape
    return dict(batch=batch, heads=heads, seq=seq, dim=dim, is_causal=is_causal, seq_kv=k.shape[2],
                groups=heads // k.shape[1], sm_scale=scale, dtype=DTYPES[q.dtype])


# (signature(q, k, v), is_causal, scale) -> (the forward's JITKernel prepared for the signature's
# tensors, whether q, k, v are all contiguous: passed as they are)
_forwards = Remembered()


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
               scale: Optional[float] = None) -> tuple:
    """softmax(q k^T * scale) v (scale 1/sqrt(dim) unless given; K/V heads may divide the query
    heads), and the base-2 log-sum-exp of each query row (float32 [batch, heads, seq]).  A
    repeated signature runs the kernel its first call chose."""
    try:
        kernel, contiguous = _forwards[signature(q, k, v), is_causal, scale]
    except MISSES:
        kernel, contiguous = _first_attention(q, k, v, is_causal, scale)
    out, lse = kernel(q, k, v) if contiguous else kernel(as_passed(q), as_passed(k), as_passed(v))
    return out, lse


def _first_attention(q, k, v, is_causal: bool, scale: Optional[float]):
    """The checks (TypeError / ValueError naming the argument) and the forward kernel of a call
    `_attention` has not seen, remembered."""
    check_attention_arguments(q, k, v, is_causal)
    args = _kernel_args(q, k, is_causal, scale)
    key = signature(q, k, v), is_causal, scale
    contiguous = all(t.is_contiguous() for t in (q, k, v))  # `as_passed` keeps each as it is
    q, k, v = (as_passed(t) for t in (q, k, v))
    out_strides = output_strides(q)
    strides = views_of(Q=q, K=k, V=v) + ((("O", out_strides),) if out_strides else ())
    kernel = flashattn_fwd(**args, strides=strides or None, **tile_config(q.device.type, args["dim"])["fwd"])
    # the kernel's own checks, once per signature
    return _forwards.remember(key, (kernel.prepare(q, k, v), contiguous))


def _attention_fake(q, k, v, is_causal=False, scale=None):
    check_attention_arguments(q, k, v, is_causal)
    strides = output_strides(q)
    out = q.new_empty(q.shape) if strides is None else q.new_empty_strided(q.shape, strides)
    return out, q.new_empty(q.shape[:3], dtype=torch.float32)


def _attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        out: torch.Tensor, lse: torch.Tensor, is_causal: bool, scale: Optional[float]) -> tuple:
    """dq, dk, dv of `tritile.attention` from its output, log-sum-exp and the output's gradient."""
    args = _kernel_args(q, k, is_causal, scale)
    batch, heads, seq, dim = q.shape
    q, k, v, out, grad_out = (as_passed(t) for t in (q, k, v, out, grad_out))
    delta = flashattn_bwd_preprocess(batch, heads, seq, dim, dtype=args["dtype"],
                                     strides=views_of(O=out, dO=grad_out) or None)(out, grad_out)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk, dv = (torch.empty(k.shape, dtype=q.dtype, device=q.device) for _ in range(2))
    config = tile_config(q.device.type, dim, is_causal)["bwd"]
    with switches.overridden(BACKWARD_SWITCHES):  # read when the kernel is planned and generated
        flashattn_bwd(**args, **config, strides=views_of(Q=q, K=k, V=v, dO=grad_out) or None)(
            q, k, v, grad_out, lse, delta, dq, dk, dv)
    return dq.to(q.dtype), dk, dv


def _attention_backward_fake(grad_out, q, k, v, out, lse, is_causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _attention_setup_context(ctx, inputs, output) -> None:
    q, k, v, is_causal, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.is_causal, ctx.scale = is_causal, scale


def _attention_autograd(ctx, grad_out, grad_lse):
    """The log-sum-exp is a residual for this backward, not a differentiable output."""
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward(grad_out, q, k, v, out, lse, ctx.is_causal, ctx.scale)
    return dq, dk, dv, None, None


attention_backward = registration.define(
    "attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool is_causal, "
    "float? scale) -> (Tensor, Tensor, Tensor)", _attention_backward, _attention_backward_fake)
attention_with_lse = registration.define(
    "attention(Tensor q, Tensor k, Tensor v, bool is_causal=False, float? scale=None) -> (Tensor, Tensor)",
    _attention, _attention_fake, _attention_autograd, _attention_setup_context)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
              scale: Optional[float] = None) -> torch.Tensor:
    """`F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=True)`
    by tritile's kernels, differentiable."""
    return torch.ops.tritile.attention(q, k, v, is_causal, scale)[0]
