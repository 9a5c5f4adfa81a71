"""A slice whose bounds are names bound to runtime expressions, `KV[b, kv_start:kv_end, :]` with
``kv_start = base + k * block_N`` and ``kv_end = base + (k + 1) * block_N`` (TileLang's
examples/deepseek_mla split-KV decode): its extent is the difference of the bound values
(block_N), as if written inline.  A bound that reads memory (an element of a buffer may change
between the two names) is not looked through: still the CompileError of a runtime extent.
Against torch on fresh random inputs; on the `device` fixture's tensors (CPU: the tile-IR
interpreter), and compiled for sm_90 by both backends on CPU.
"""
import pytest
import torch

import tritile
import tritile.language as T


def split_row_sums(seqlen, num_split, dim, block_N):
    """Each split `bz` sums its rows of X block by block, with named bounds of each block."""

    @T.prim_func
    def main(X: T.Tensor((seqlen, dim), T.float32), Out: T.Tensor((num_split, dim), T.float32)):
        with T.Kernel(num_split, threads=128) as bz:
            tile = T.alloc_shared((block_N, dim), T.float32)
            acc = T.alloc_fragment((block_N, dim), T.float32)
            total = T.alloc_fragment((dim,), T.float32)
            T.clear(acc)
            for k in T.serial(T.ceildiv(seqlen // num_split, block_N)):
                kv_start = (seqlen // num_split) * bz + k * block_N
                kv_end = (seqlen // num_split) * bz + (k + 1) * block_N
                T.copy(X[kv_start:kv_end, :], tile)
                for i, j in T.Parallel(block_N, dim):
                    acc[i, j] += tile[i, j]
            T.reduce_sum(acc, total, dim=0)
            T.copy(total, Out[bz, :])

    return main


def test_slice_between_let_bound_names(device):
    seqlen, num_split, dim, block_N = 256, 4, 32, 16
    x = torch.randn(seqlen, dim, device=device)
    out = tritile.compile(split_row_sums(seqlen, num_split, dim, block_N), out_idx=[1])(x)
    torch.testing.assert_close(out, x.view(num_split, -1, dim).sum(1), rtol=1e-4, atol=1e-4)


def test_slice_between_let_bound_names_compiles_for_hopper():
    for backend in ("gluon", "triton"):
        kernel = tritile.compile(split_row_sums(256, 4, 32, 16), out_idx=[1], target="cuda:90", backend=backend)
        assert ".target sm_90" in kernel.get_source("ptx")


def test_bounds_that_read_memory_are_not_looked_through():
    with pytest.raises(tritile.CompileError, match=r"the extent of slice 0 of X is not a compile-time constant"):
        @T.prim_func
        def reads(X: T.Tensor((64, 8), T.float32), Starts: T.Tensor((2,), T.int32), Out: T.Tensor((16, 8), T.float32)):
            with T.Kernel(1, threads=128) as _:
                tile = T.alloc_shared((16, 8), T.float32)
                start = Starts[0]
                stop = Starts[0] + 16  # the same element, read again: it may have changed
                T.copy(X[start:stop, :], tile)
                T.copy(tile, Out)
