"""A name bound to `T.alloc_var(...)` is the variable itself (TileLang's one-element buffer):
`T.clear(v)` / `T.fill(v, x)` write it, `v += ...` updates it, and `y = v` is a snapshot of its
value.  The pattern is the split-KV combine of TileLang's examples/deepseek_mla
(example_mla_decode.py: `lse_logsum_local = T.alloc_var(...)`, `T.clear(lse_logsum_local)`),
checked against torch on fresh random inputs.  On the `device` fixture's tensors (CPU: the
tile-IR interpreter), and compiled for sm_90 by both backends on CPU.
"""
import torch

import tritile
import tritile.language as T


def combine(heads, batch, num_split, dim):
    """The MLA decode's combine kernel: the splits' partial outputs weighted by their log-sum-exps."""
    accum_dtype = T.float32

    @T.prim_func
    def main(glse: T.Tensor([batch, heads, num_split], accum_dtype),
             Output_partial: T.Tensor([batch, heads, num_split, dim], accum_dtype),
             Output: T.Tensor([batch, heads, dim], accum_dtype)):
        with T.Kernel(heads, batch, threads=128) as (hid, bz):
            po_local = T.alloc_fragment([dim], accum_dtype)
            o_accum_local = T.alloc_fragment([dim], accum_dtype)
            lse_local_split = T.alloc_var(accum_dtype)
            lse_logsum_local = T.alloc_var(accum_dtype)
            lse_max_local = T.alloc_var(accum_dtype)
            scale_local = T.alloc_var(accum_dtype)

            T.fill(lse_logsum_local, 123.0)  # overwritten by the clear below
            T.clear(lse_logsum_local)
            T.clear(o_accum_local)
            lse_max_local = -T.infinity(accum_dtype)
            for k in T.serial(num_split):
                lse_max_local = T.max(lse_max_local, glse[bz, hid, k])
            for k in T.Pipelined(num_split, num_stages=1):
                lse_local_split = glse[bz, hid, k]
                lse_logsum_local += T.exp2(lse_local_split - lse_max_local)
            lse_logsum_local = T.log2(lse_logsum_local) + lse_max_local
            for k in T.serial(num_split):
                for i in T.Parallel(dim):
                    po_local[i] = Output_partial[bz, hid, k, i]
                lse_local_split = glse[bz, hid, k]
                scale_local = T.exp2(lse_local_split - lse_logsum_local)
                for i in T.Parallel(dim):
                    o_accum_local[i] += po_local[i] * scale_local
            for i in T.Parallel(dim):
                Output[bz, hid, i] = o_accum_local[i]

    return main


def test_clear_of_an_alloc_var_in_the_mla_combine(device):
    batch, heads, num_split, dim = 2, 3, 4, 32
    lse = torch.randn(batch, heads, num_split, device=device)
    partial = torch.randn(batch, heads, num_split, dim, device=device)
    out = tritile.compile(combine(heads, batch, num_split, dim), out_idx=[2])(lse, partial)
    weights = torch.softmax(lse * torch.log(torch.tensor(2.0)), dim=-1)  # 2^lse normalised
    torch.testing.assert_close(out, (weights[..., None] * partial).sum(2), rtol=1e-4, atol=1e-5)


def fill_and_snapshot(N):
    @T.prim_func
    def main(A: T.Tensor((N,), T.float32), B: T.Tensor((3,), T.float32)):
        with T.Kernel(1, threads=32) as _:
            acc = T.alloc_var(T.float32, init=5.0)
            before = acc  # a snapshot: later writes to acc leave it
            T.fill(acc, A[0] * 2.0)
            middle = acc
            for i in T.serial(N):
                acc += A[i]
            B[0] = before
            B[1] = middle
            B[2] = acc

    return main


def test_fill_of_an_alloc_var_and_snapshots(device):
    a = torch.randn(8, device=device)
    b = tritile.compile(fill_and_snapshot(8), out_idx=[1])(a)
    torch.testing.assert_close(b, torch.stack([torch.tensor(5.0, device=device), a[0] * 2, a[0] * 2 + a.sum()]))


def test_alloc_var_kernels_compile_for_hopper():
    for func, out_idx in ((combine(3, 2, 4, 32), [2]), (fill_and_snapshot(8), [1])):
        for backend in ("gluon", "triton"):
            kernel = tritile.compile(func, out_idx=out_idx, target="cuda:90", backend=backend)
            assert ".target sm_90" in kernel.get_source("ptx")
