"""Tile reductions (`T.reduce_max/min/sum/abssum/absmax`) and scans (`T.cumsum`), TileLang style.

Reductions run over both dimensions, with `clear=True` (overwrite the output) and `clear=False`
(combine with the output's old value, as FlashAttention's running max does), into an output of
the reduced shape or with the reduced dimension kept as 1.  `T.cumsum` runs over both dimensions,
forwards and in `reverse`, in place (`dst=None`) and out of place, on shared and fragment tiles.
On the `device` fixture's tensors (CPU: the reference interpreter; CUDA: the Gluon kernel),
against torch on the same device.
"""
import pytest
import torch

import tritile
import tritile.language as T

TORCH_REDUCE = {
    "max": lambda x, dim: x.amax(dim),
    "min": lambda x, dim: x.amin(dim),
    "sum": lambda x, dim: x.sum(dim),
    "abssum": lambda x, dim: x.abs().sum(dim),
    "absmax": lambda x, dim: x.abs().amax(dim),
}
# how clear=False folds the old output value into the reduction
TORCH_COMBINE = {"max": torch.maximum, "min": torch.minimum, "sum": torch.add}


@tritile.jit(out_idx=[-1])
def reduce_rows_or_cols(M, N, kind, dim, clear, keep_dim=False, dtype="float32"):
    out_shape = ((M,) if dim == 1 else (N,)) if not keep_dim else ((M, 1) if dim == 1 else (1, N))

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), Init: T.Tensor(out_shape, dtype), B: T.Tensor(out_shape, dtype)):
        with T.Kernel(1, threads=128) as _:
            A_local = T.alloc_fragment((M, N), dtype)
            B_local = T.alloc_fragment(out_shape, dtype)
            T.copy(A, A_local)
            T.copy(Init, B_local)
            if kind == "max":
                T.reduce_max(A_local, B_local, dim=dim, clear=clear)
            elif kind == "min":
                T.reduce_min(A_local, B_local, dim=dim, clear=clear)
            elif kind == "sum":
                T.reduce_sum(A_local, B_local, dim=dim, clear=clear)
            elif kind == "abssum":
                T.reduce_abssum(A_local, B_local, dim=dim)
            else:
                T.reduce_absmax(A_local, B_local, dim=dim)
            T.copy(B_local, B)

    return main


def reduce_reference(a, init, kind, dim, clear):
    result = TORCH_REDUCE[kind](a, dim).reshape(init.shape)
    return result if clear else TORCH_COMBINE[kind](result, init)


def check_reduce(kind, dim, clear, keep_dim, device, assert_close):
    """Runs `reduce_rows_or_cols` on a random 64 x 128 tile and a random initial output."""
    M, N = 64, 128
    kernel = reduce_rows_or_cols(M, N, kind, dim, clear, keep_dim=keep_dim)
    a = torch.randn(M, N, device=device)
    init_shape = ((M, 1) if dim == 1 else (1, N)) if keep_dim else (M if dim == 1 else N,)
    init = torch.randn(init_shape, device=device)
    assert_close(kernel(a, init), reduce_reference(a, init, kind, dim, clear))


@pytest.mark.parametrize("clear", [True, False])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("kind", ["max", "min", "sum"])
def test_reduce(kind, dim, clear, device, assert_close):
    check_reduce(kind, dim, clear, False, device, assert_close)


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("kind", ["abssum", "absmax"])
def test_reduce_abs(kind, dim, device, assert_close):
    check_reduce(kind, dim, True, False, device, assert_close)


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("kind", ["max", "sum"])
def test_reduce_keeps_reduced_dim_as_one(kind, dim, device, assert_close):
    check_reduce(kind, dim, False, True, device, assert_close)


@tritile.jit(out_idx=[-1])
def row_sum_from_shared(M, N, block_M, dtype="float32"):
    """Shared-memory source, many blocks: each block reduces its own rows."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M,), dtype)):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            A_shared = T.alloc_shared((block_M, N), dtype)
            B_shared = T.alloc_shared((block_M,), dtype)
            T.copy(A[bx * block_M, 0], A_shared)
            T.reduce_sum(A_shared, B_shared, dim=1)
            T.copy(B_shared, B[bx * block_M])

    return main


def test_reduce_shared_many_blocks(device, assert_close):
    M, N = 256, 64
    a = torch.randn(M, N, device=device)
    assert_close(row_sum_from_shared(M, N, 64)(a), a.sum(1))


@tritile.jit(out_idx=[-1])
def cumsum_tiles(M, N, block_M, block_N, dim, reverse, in_place, scope, dtype="float32"):
    """Blockwise inclusive scan of each (block_M, block_N) tile of A."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_N), dtype)
            Out_shared = T.alloc_shared((block_M, block_N), dtype)
            A_fragment = T.alloc_fragment((block_M, block_N), dtype)
            Out_fragment = T.alloc_fragment((block_M, block_N), dtype)
            T.copy(A[by * block_M, bx * block_N], A_shared)
            if scope == "shared":
                if in_place:
                    T.cumsum(src=A_shared, dim=dim, reverse=reverse)
                    T.copy(A_shared, B[by * block_M, bx * block_N])
                else:
                    T.cumsum(src=A_shared, dst=Out_shared, dim=dim, reverse=reverse)
                    T.copy(Out_shared, B[by * block_M, bx * block_N])
            else:
                T.copy(A_shared, A_fragment)
                if in_place:
                    T.cumsum(src=A_fragment, dim=dim, reverse=reverse)
                    T.copy(A_fragment, B[by * block_M, bx * block_N])
                else:
                    T.cumsum(A_fragment, Out_fragment, dim=dim, reverse=reverse)
                    T.copy(Out_fragment, B[by * block_M, bx * block_N])

    return main


def blockwise_cumsum(a, block_M, block_N, dim, reverse):
    M, N = a.shape
    tiles = a.reshape(M // block_M, block_M, N // block_N, block_N)
    tile_dim = 1 if dim == 0 else 3
    if reverse:
        tiles = tiles.flip(tile_dim).cumsum(tile_dim).flip(tile_dim)
    else:
        tiles = tiles.cumsum(tile_dim)
    return tiles.reshape(M, N)


@pytest.mark.parametrize("scope", ["shared", "fragment"])
@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "out_of_place"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("dim", [0, 1])
def test_cumsum(dim, reverse, in_place, scope, device, assert_close):
    M, N, block_M, block_N = 128, 128, 64, 32
    kernel = cumsum_tiles(M, N, block_M, block_N, dim, reverse, in_place, scope)
    a = torch.randn(M, N, device=device)
    assert_close(kernel(a), blockwise_cumsum(a, block_M, block_N, dim, reverse))


@tritile.jit(out_idx=[-1])
def cumsum_1d(N, block, reverse, dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, block), threads=128) as bx:
            A_shared = T.alloc_shared((block,), dtype)
            T.copy(A[bx * block:(bx + 1) * block], A_shared)
            T.cumsum(A_shared, reverse=reverse)
            T.copy(A_shared, B[bx * block:(bx + 1) * block])

    return main


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_cumsum_1d(reverse, device, assert_close):
    N, block = 256, 64
    a = torch.randn(N, device=device)
    expected = blockwise_cumsum(a.reshape(1, N), 1, block, 1, reverse).reshape(N)
    assert_close(cumsum_1d(N, block, reverse)(a), expected)


@tritile.jit(out_idx=[-1])
def rms_norm_rows(M, N, block_M):
    """TileLang's norm/rms_norm.py shape: with block_M=1 the row tile is a [1, N] fragment whose
    reduction over dim=1 (TileLang counts the unit dim) gives one value."""
    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            rows = T.alloc_fragment((block_M, N), "float32")
            squares = T.alloc_fragment((block_M, N), "float32")
            norm = T.alloc_fragment((block_M,), "float32")
            T.copy(A[bx * block_M:(bx + 1) * block_M, :], rows)
            for i, j in T.Parallel(block_M, N):
                squares[i, j] = rows[i, j] * rows[i, j]
            T.reduce_sum(squares, norm, dim=1)
            for i in T.Parallel(block_M):
                norm[i] = T.rsqrt(norm[i] / N + 1e-12)
            for i, j in T.Parallel(block_M, N):
                rows[i, j] *= norm[i]
            T.copy(rows, B[bx * block_M:(bx + 1) * block_M, :])

    return main


@pytest.mark.usefixtures("gluon_backend")  # the triton.language backend takes no [1, N] lane-by-lane write yet
@pytest.mark.parametrize("block_M", [1, 4])
def test_rms_norm_rows_of_one(block_M, device, assert_close):
    a = torch.randn(16, 256, device=device)
    assert_close(rms_norm_rows(16, 256, block_M)(a), a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-12))
    kernel = tritile.compile(rms_norm_rows.fn(1024, 1024, block_M), out_idx=[-1], target="cuda:90")
    assert ".target sm_90" in kernel.get_source("ptx")


# The specialisations tests/test_kernels_compile.py compiles for sm_90 and sm_80: every kernel of
# this module with every reduction kind, dimension, clear/keep_dim and scan variant tested above.
COMPILE_CASES = {
    **{f"reduce-{kind}-dim{dim}-clear{clear}": (lambda kind=kind, dim=dim, clear=clear: reduce_rows_or_cols(
        64, 128, kind, dim, clear)) for kind in ("max", "min", "sum") for dim in (0, 1) for clear in (True, False)},
    **{f"reduce-{kind}-dim{dim}": (lambda kind=kind, dim=dim: reduce_rows_or_cols(64, 128, kind, dim, True))
       for kind in ("abssum", "absmax") for dim in (0, 1)},
    **{f"reduce-{kind}-dim{dim}-keep_dim": (lambda kind=kind, dim=dim: reduce_rows_or_cols(
        64, 128, kind, dim, False, keep_dim=True)) for kind in ("max", "sum") for dim in (0, 1)},
    "row_sum_from_shared": lambda: row_sum_from_shared(256, 64, 64),
    **{f"cumsum-{scope}-dim{dim}-{'reverse' if rev else 'forward'}-{'in_place' if inp else 'out_of_place'}": (
        lambda dim=dim, rev=rev, inp=inp, scope=scope: cumsum_tiles(128, 128, 64, 32, dim, rev, inp, scope))
       for scope in ("shared", "fragment") for dim in (0, 1) for rev in (False, True) for inp in (True, False)},
    **{f"cumsum_1d-{'reverse' if rev else 'forward'}": (lambda rev=rev: cumsum_1d(256, 64, rev))
       for rev in (False, True)},
    "rms_norm_rows-block_M4": lambda: rms_norm_rows(1024, 1024, 4),  # block_M=1: in its own (Gluon) test
}
