"""Static partial ranges of fragments (`T.copy(acc_o[:valid_block_H, :], O_shared)`, TileLang's
example_gqa_decode.py): a range whose start and extent are known at compile time, along one or
more dims, copied out of a fragment into a shared buffer or a fragment, and into a fragment's
range from a shared buffer or a fragment.

* `fragment_ranges`: rows, columns and a block of a fragment with inf, -inf, NaN and -0.0 among
  its values, bit-exact; shapes padded to powers of two among them;
* `gqa_decode_split`: the split kernel of example_gqa_decode.py at small sizes, its partial
  outputs and log-sum-exps checked against torch;
* a range that does not start at a multiple of its padded extent is a CompileError on both
  backends.
On the `device` fixture's tensors (CPU: the reference interpreter, or Triton's interpreter with
TRITILE_BACKEND=triton; CUDA: the compiled kernel), against torch on the same device.
"""
import pytest
import torch

import tritile
import tritile.language as T
from tritile.runtime.target import Target
from test_kernels_fragment_rows import same_values, special_values


@tritile.jit(out_idx=[-5, -4, -3, -2, -1])
def fragment_ranges(R, N, rs, re, cs, ce, dtype):
    """B = A[rs:rs+re, :] (fragment -> shared); C = A[:, cs:cs+ce] (fragment -> fragment);
    D = A[rs:rs+re, cs:cs+ce] written into zeros at the same place (fragment -> fragment range);
    E = A's rows rs:rs+re written into zeros at the same rows (shared -> fragment range);
    F = A[rs:rs+re, cs:cs+ce] (fragment -> global)."""

    @T.prim_func
    def main(A: T.Tensor((R, N), dtype), B: T.Tensor((re, N), dtype), C: T.Tensor((R, ce), dtype),
             D: T.Tensor((R, N), dtype), E: T.Tensor((R, N), dtype), F: T.Tensor((re, ce), dtype)):
        with T.Kernel(1, threads=128) as _:
            a = T.alloc_fragment((R, N), dtype)
            b_shared = T.alloc_shared((re, N), dtype)
            c = T.alloc_fragment((R, ce), dtype)
            block = T.alloc_fragment((re, ce), dtype)
            d = T.alloc_fragment((R, N), dtype)
            e = T.alloc_fragment((R, N), dtype)
            T.copy(A, a)
            T.copy(a[rs:rs + re, :], b_shared)
            T.copy(b_shared, B)
            T.copy(a[:, cs:cs + ce], c)
            T.copy(c, C)
            T.copy(a[rs:rs + re, cs:cs + ce], block)
            T.clear(d)
            T.copy(block, d[rs:rs + re, cs:cs + ce])
            T.copy(d, D)
            T.clear(e)
            T.copy(b_shared, e[rs:rs + re, :])
            T.copy(e, E)
            T.copy(a[rs:rs + re, cs:cs + ce], F)

    return main


def fragment_ranges_reference(a, rs, re, cs, ce) -> list:
    d, e = torch.zeros_like(a), torch.zeros_like(a)
    d[rs:rs + re, cs:cs + ce] = a[rs:rs + re, cs:cs + ce]
    e[rs:rs + re] = a[rs:rs + re]
    return [a[rs:rs + re], a[:, cs:cs + ce], d, e, a[rs:rs + re, cs:cs + ce]]


@pytest.mark.parametrize("dtype", ["float16", "float32", "int32"])
@pytest.mark.parametrize("R, N, rs, re, cs, ce", [
    (8, 32, 4, 4, 16, 16),
    (64, 64, 0, 8, 32, 32),   # gqa_decode's acc_o[:valid_block_H, :]
    (6, 24, 4, 2, 16, 5),     # tiles padded to (8, 32); extent 5 padded to 8
])
def test_fragment_ranges_are_exact(R, N, rs, re, cs, ce, dtype, device):
    a = special_values((R, N), getattr(torch, dtype), device)
    got = fragment_ranges(R, N, rs, re, cs, ce, dtype)(a)
    for name, g, want in zip("BCDEF", got, fragment_ranges_reference(a, rs, re, cs, ce)):
        assert same_values(g, want), f"{name}: {g} != {want}"


@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_misaligned_fragment_range_is_a_compile_error(backend):
    """acc[2:6, :]: extent 4 starting at 2 is no group of 4 lanes."""

    @T.prim_func
    def misaligned(A: T.Tensor((8, 32), "float32"), B: T.Tensor((4, 32), "float32")):
        with T.Kernel(1, threads=128) as _:
            acc = T.alloc_fragment((8, 32), "float32")
            out = T.alloc_shared((4, 32), "float32")
            T.copy(A, acc)
            T.copy(acc[2:6, :], out)
            T.copy(out, B)

    with pytest.raises(tritile.CompileError, match="static range of dim 0 starts at a multiple") as err:
        tritile.compile(misaligned, target=Target("cuda", 90), backend=backend).get_source("ptx")
    assert "T.copy(acc[2:6, :], out)" in str(err.value)


@tritile.jit(out_idx=[-2, -1])
def gqa_decode_split(batch, heads, groups, seqlen_kv, dim, block_N, block_H, num_split, num_stages):
    """example_gqa_decode.py's split kernel (flashattn_gqa_decode_split's first T.Kernel), its
    partial outputs and log-sum-exps as outputs."""
    scale = (1.0 / dim) ** 0.5 * 1.44269504  # log2(e)
    dtype, accum_dtype = "float16", "float32"
    kv_group_num = heads // groups
    valid_block_H = min(block_H, kv_group_num)
    valid_block_N = min(block_N, seqlen_kv // num_split)

    @T.prim_func
    def main(Q: T.Tensor([batch, heads, dim], dtype), K: T.Tensor([batch, seqlen_kv, groups, dim], dtype),
             V: T.Tensor([batch, seqlen_kv, groups, dim], dtype), mask: T.Tensor([batch, seqlen_kv, groups], "uint8"),
             glse: T.Tensor([batch, heads, num_split], dtype),
             Output_partial: T.Tensor([batch, heads, num_split, dim], dtype)):
        with T.Kernel(batch, heads // valid_block_H, num_split, threads=128) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_H, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            O_shared = T.alloc_shared([valid_block_H, dim], dtype)
            acc_s = T.alloc_fragment([block_H, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_H, block_N], dtype)
            mask_local = T.alloc_fragment([block_N], "uint8")
            acc_o = T.alloc_fragment([block_H, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_H], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_H], accum_dtype)
            scores_scale = T.alloc_fragment([block_H], accum_dtype)
            scores_sum = T.alloc_fragment([block_H], accum_dtype)
            logsum = T.alloc_fragment([block_H], accum_dtype)

            bid, hid, sid = bx, by, bz
            cur_kv_head = hid // (kv_group_num // valid_block_H)
            span = seqlen_kv // num_split

            T.copy(Q[bid, hid * valid_block_H:hid * valid_block_H + block_H, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))
            for k in T.Pipelined(T.ceildiv(span, block_N), num_stages=num_stages):
                T.copy(K[bid, span * sid + k * valid_block_N:span * sid + (k + 1) * valid_block_N, cur_kv_head, :],
                       K_shared)
                T.copy(mask[bid, span * sid + k * valid_block_N:span * sid + (k + 1) * valid_block_N, cur_kv_head],
                       mask_local)
                T.clear(acc_s)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(block_H, block_N):
                    acc_s[i, j] = T.if_then_else((mask_local[j] != 0) & (j < span), acc_s[i, j],
                                                 -T.infinity(accum_dtype))
                T.copy(scores_max, scores_max_prev)
                T.fill(scores_max, -T.infinity(accum_dtype))
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_H):
                    scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
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
                T.copy(V[bid, span * sid + k * valid_block_N:span * sid + (k + 1) * valid_block_N, cur_kv_head, :],
                       V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_H, dim):
                acc_o[i, j] /= logsum[i]
            for i in T.Parallel(block_H):
                logsum[i] = T.log2(logsum[i]) + scores_max[i] * scale
            for i in T.Parallel(block_H):
                if i < valid_block_H:
                    glse[bid, hid * valid_block_H + i, sid] = logsum[i]
            T.copy(acc_o[:valid_block_H, :], O_shared)
            T.copy(O_shared, Output_partial[bid, hid * valid_block_H:(hid + 1) * valid_block_H, sid, :])

    return main


def gqa_decode_split_reference(q, k, v, mask, num_split):
    """Per split: softmax(q k^T / sqrt(dim)) v over the split's unmasked keys, and its log2-sum-exp
    (of the scores in log2 units)."""
    batch, heads, dim = q.shape
    groups = k.shape[2]
    k = k.float().repeat_interleave(heads // groups, dim=2)
    v = v.float().repeat_interleave(heads // groups, dim=2)
    keep = mask.bool().repeat_interleave(heads // groups, dim=2)
    scores = torch.einsum("bhd,bshd->bhs", q.float(), k) * (1.0 / dim) ** 0.5 * 1.44269504
    scores = scores.masked_fill(~keep.permute(0, 2, 1), float("-inf"))
    outs, lses = [], []
    span = scores.shape[-1] // num_split
    for i in range(num_split):
        part = scores[..., i * span:(i + 1) * span]
        lse = torch.logsumexp(part * 0.6931471805599453, dim=-1) / 0.6931471805599453
        p = torch.exp2(part - lse[..., None])
        outs.append(torch.einsum("bhs,bshd->bhd", p, v[:, i * span:(i + 1) * span]))
        lses.append(lse)
    return torch.stack(lses, dim=-1), torch.stack(outs, dim=2)


@pytest.mark.parametrize("heads, groups", [(8, 2), (16, 2)])  # valid_block_H 4 and 8 of block_H 64
def test_gqa_decode_split(heads, groups, device, assert_close):
    batch, seqlen_kv, dim, num_split = 2, 256, 64, 2
    q = torch.randn(batch, heads, dim, device=device).half()
    k = torch.randn(batch, seqlen_kv, groups, dim, device=device).half()
    v = torch.randn(batch, seqlen_kv, groups, dim, device=device).half()
    mask = torch.randint(0, 2, (batch, seqlen_kv, groups), device=device, dtype=torch.uint8)
    glse, partial = gqa_decode_split(batch, heads, groups, seqlen_kv, dim, 64, 64, num_split, 2)(q, k, v, mask)
    lse_ref, partial_ref = gqa_decode_split_reference(q, k, v, mask, num_split)
    assert_close(glse, lse_ref.half())
    assert_close(partial, partial_ref.half())


# The specialisations tests/test_kernels_compile.py compiles for sm_90 and sm_80.
COMPILE_CASES = {
    "fragment_ranges_f16": lambda: fragment_ranges(64, 64, 0, 8, 32, 32, "float16"),
    "fragment_ranges_padded_i32": lambda: fragment_ranges(6, 24, 4, 2, 16, 5, "int32"),
    "gqa_decode_split": lambda: gqa_decode_split(1, 32, 8, 1024, 128, 128, 64, 8, 2),
}
