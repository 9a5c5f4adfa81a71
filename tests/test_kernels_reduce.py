"""Tile reductions (`T.reduce_max/min/sum/abssum/absmax`, the bitwise `T.reduce_bitand/bitor/bitxor`
and reducers of those ops) and scans (`T.cumsum`), TileLang style.

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
            reduce = getattr(T, f"reduce_{kind}")  # max, min, sum, abssum, absmax, bitand, bitor, bitxor
            if kind in ("abssum", "absmax"):  # TileLang's take no `clear`
                reduce(A_local, B_local, dim=dim)
            else:
                reduce(A_local, B_local, dim=dim, clear=clear)
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


@pytest.mark.parametrize("block_M", [1, 4])
def test_rms_norm_rows_of_one(block_M, device, assert_close):
    a = torch.randn(16, 256, device=device)
    assert_close(rms_norm_rows(16, 256, block_M)(a), a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-12))
    kernel = tritile.compile(rms_norm_rows.fn(1024, 1024, block_M), out_idx=[-1], target="cuda:90")
    assert ".target sm_90" in kernel.get_source("ptx")


@tritile.jit
def online_softmax(X, BLOCK_M=1, BLOCK_N=8192, dtype: T.dtype = T.float16, max_dtype: T.dtype = T.float16):
    """TileLang's online_softmax example (eager style): per block of BLOCK_M rows, a first
    pipelined pass keeps the log-sum-exp of the row tiles, whose running max `max_x` (a
    [BLOCK_M] fragment, [1] with BLOCK_M=1) is a reduction's result carried through the loop; a
    second pass writes exp2(x * log2(e) - lse)."""
    M, N = T.const("M, N")
    X: T.Tensor([M, N], dtype)
    Y = T.empty([M, N], dtype)
    accum_dtype = T.float32
    scale = 1.44269504  # log2(e)
    with T.Kernel(T.ceildiv(M, BLOCK_M), threads=128) as (i_m):
        x = T.alloc_fragment([BLOCK_M, BLOCK_N], dtype)
        y = T.alloc_fragment([BLOCK_M, BLOCK_N], dtype)
        lse = T.alloc_fragment([BLOCK_M], accum_dtype)
        max_x = T.alloc_fragment([BLOCK_M], max_dtype)
        exp_x = T.alloc_fragment([BLOCK_M, BLOCK_N], accum_dtype)
        sum_exp_x = T.alloc_fragment([BLOCK_M], accum_dtype)
        T.fill(lse, -T.infinity(accum_dtype))
        for i_n in T.Pipelined(T.ceildiv(N, BLOCK_N)):
            T.copy(X[i_m * BLOCK_M, i_n * BLOCK_N], x)
            T.reduce_max(x, max_x, dim=1, clear=True)
            for i, j in T.Parallel(BLOCK_M, BLOCK_N):
                exp_x[i, j] = T.exp2(x[i, j] * scale - max_x[i] * scale)
            T.reduce_sum(exp_x, sum_exp_x, dim=1, clear=True)
            for i in T.Parallel(BLOCK_M):
                lse[i] = max_x[i] * scale + T.log2(T.exp2(lse[i] - max_x[i] * scale) + sum_exp_x[i])
        for i_n in T.Pipelined(T.ceildiv(N, BLOCK_N)):
            T.copy(X[i_m * BLOCK_M, i_n * BLOCK_N], x)
            for i, j in T.Parallel(BLOCK_M, BLOCK_N):
                y[i, j] = T.exp2(x[i, j] * scale - lse[i])
            T.copy(y, Y[i_m * BLOCK_M, i_n * BLOCK_N])
    return Y


@tritile.jit
def online_softmax_columns(X, BLOCK_N=64, BLOCK_M=4, dtype: T.dtype = T.float16):
    """`online_softmax` transposed: softmax over dim 0, the running max a reduction of [BLOCK_N,
    BLOCK_M] tiles over their dim 0 carried through the loop."""
    N, M = T.const("N, M")
    X: T.Tensor([N, M], dtype)
    Y = T.empty([N, M], dtype)
    scale = 1.44269504
    with T.Kernel(T.ceildiv(M, BLOCK_M), threads=128) as i_m:
        x = T.alloc_fragment([BLOCK_N, BLOCK_M], dtype)
        lse = T.alloc_fragment([BLOCK_M], T.float32)
        max_x = T.alloc_fragment([BLOCK_M], dtype)
        exp_x = T.alloc_fragment([BLOCK_N, BLOCK_M], T.float32)
        sum_exp_x = T.alloc_fragment([BLOCK_M], T.float32)
        T.fill(lse, -T.infinity(T.float32))
        for i_n in T.Pipelined(T.ceildiv(N, BLOCK_N)):
            T.copy(X[i_n * BLOCK_N, i_m * BLOCK_M], x)
            T.reduce_max(x, max_x, dim=0, clear=True)
            for i, j in T.Parallel(BLOCK_N, BLOCK_M):
                exp_x[i, j] = T.exp2(x[i, j] * scale - max_x[j] * scale)
            T.reduce_sum(exp_x, sum_exp_x, dim=0, clear=True)
            for j in T.Parallel(BLOCK_M):
                lse[j] = max_x[j] * scale + T.log2(T.exp2(lse[j] - max_x[j] * scale) + sum_exp_x[j])
        for i_n in T.Pipelined(T.ceildiv(N, BLOCK_N)):
            T.copy(X[i_n * BLOCK_N, i_m * BLOCK_M], x)
            for i, j in T.Parallel(BLOCK_N, BLOCK_M):
                x[i, j] = T.exp2(x[i, j] * scale - lse[j])
            T.copy(x, Y[i_n * BLOCK_N, i_m * BLOCK_M])
    return Y


ONLINE_SOFTMAX_VARIANTS = [(1, "float16"), (2, "float16"), (4, "float16"), (1, "float32"), (4, "float32")]


@pytest.mark.parametrize("block_M, max_dtype", ONLINE_SOFTMAX_VARIANTS)
def test_online_softmax(block_M, max_dtype, device, assert_close):
    """A fp16 running max written by a reduction inside a loop keeps its dtype (Gluon rejected the
    fp32 that gl.max returns as a loop-carried fp16 variable)."""
    x = torch.randn(8, 256, dtype=torch.float16, device=device)
    y = online_softmax(x, BLOCK_M=block_M, BLOCK_N=64, max_dtype=getattr(T, max_dtype))
    assert_close(y, x.float().softmax(dim=1).half())
    kernel = online_softmax.compile(M=64, N=1024, BLOCK_M=block_M, BLOCK_N=256, max_dtype=getattr(T, max_dtype))
    assert ".target sm_90" in kernel.get_source("ptx")


@pytest.mark.usefixtures("gluon_backend")
def test_online_softmax_columns(device, assert_close):
    x = torch.randn(256, 16, dtype=torch.float16, device=device)
    assert_close(online_softmax_columns(x), x.float().softmax(dim=0).half())
    assert ".target sm_90" in online_softmax_columns.compile(N=1024, M=64).get_source("ptx")


@pytest.mark.gpu
@pytest.mark.usefixtures("gluon_backend")
def test_online_softmax_example_sizes(assert_close):
    """TileLang's example as it runs: M = N = 8192 fp16, one 8192-wide row tile per block."""
    x = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    assert_close(online_softmax(x), x.softmax(dim=1))


@tritile.jit(out_idx=[-1])
def running_reduce(M, N, block_N, kind, dtype):
    """A reduction result of a narrow dtype (the source's) combined across a loop (clear=False):
    the generated reduction widens (Triton's max / sum of fp16, bf16, int8 give fp32 / int32),
    the fragment carried through the loop keeps `dtype`."""
    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M,), dtype)):
        with T.Kernel(1, threads=128) as _:
            tile = T.alloc_fragment((M, block_N), dtype)
            acc = T.alloc_fragment((M,), dtype)
            T.fill(acc, 0)
            for k in T.Pipelined(N // block_N):
                T.copy(A[0, k * block_N], tile)
                if kind == "max":
                    T.reduce_max(tile, acc, dim=1, clear=False)
                else:
                    T.reduce_sum(tile, acc, dim=1, clear=False)
            T.copy(acc, B)

    return main


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8"])
@pytest.mark.parametrize("kind", ["max", "sum"])
def test_running_reduce_of_narrow_dtype(kind, dtype, device, assert_close):
    torch_dtype = getattr(torch, dtype)
    if dtype == "int8":  # sums of 4 x 16 values in [-4, 4): no wrap-around
        a = torch.randint(-4, 4, (16, 64), dtype=torch_dtype, device=device)
    else:
        a = torch.randn(16, 64, device=device).to(torch_dtype)
    expected = torch.zeros(16, dtype=torch_dtype, device=device)
    for tile in a.split(16, dim=1):  # the fragment holds `dtype`: rounded after every tile
        step = tile.float().amax(1) if kind == "max" else tile.float().sum(1)
        expected = (torch.maximum(expected.float(), step) if kind == "max" else expected.float() + step).to(torch_dtype)
    assert_close(running_reduce(16, 64, 16, kind, dtype)(a), expected)
    assert ".target sm_90" in running_reduce(64, 256, 64, kind, dtype).get_source("ptx")


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
    **{f"running_reduce-{kind}-{dtype}": (lambda kind=kind, dtype=dtype: running_reduce(64, 256, 64, kind, dtype))
       for kind in ("max", "sum") for dtype in ("float16", "bfloat16", "int8")},
}


BITWISE = {"bitand": torch.bitwise_and, "bitor": torch.bitwise_or, "bitxor": torch.bitwise_xor}


def bitwise_reference(a, dim, kind):
    out = None
    for part in a.unbind(dim):
        out = part.clone() if out is None else BITWISE[kind](out, part)
    return out


@tritile.jit(out_idx=[-1])
def bitwise_reducer(M, K, op):
    """TileLang's test_tilelang_language_reducer_v2.py bitwise rows: a T.alloc_reducer of a bit op."""

    @T.prim_func
    def main(A: T.Tensor((M, K), T.int32), B: T.Tensor((M,), T.int32)):
        with T.Kernel(1, threads=128):
            src = T.alloc_fragment((M, K), T.int32)
            T.copy(A, src)
            acc = T.alloc_reducer((M,), T.int32, op=op)
            T.reducer_init(acc)
            for i, k in T.Parallel(M, K):
                T.reducer_update(acc[i], src[i, k])
            result = T.alloc_fragment((M,), T.int32)
            T.finalize_reducer(acc, result)
            T.copy(result, B)

    return main


@pytest.mark.parametrize("dtype", ["int32", "uint8", "int64", "int16"])
@pytest.mark.parametrize("kind", ["bitand", "bitor", "bitxor"])
@pytest.mark.parametrize("dim, clear, N", [(1, True, 64), (0, False, 64), (1, False, 24)])
def test_reduce_bitwise(kind, dim, clear, N, dtype, device):
    """Random bits (sign bits included) of each width; N = 24 is padded to 32 lanes, whose
    pad lanes take the reduction's identity."""
    td, M = getattr(torch, dtype), 16
    info = torch.iinfo(td)
    a = torch.randint(info.min, info.max, (M, N), dtype=td, device=device)
    init = torch.randint(info.min, info.max, (M if dim == 1 else N,), dtype=td, device=device)
    got = reduce_rows_or_cols(M, N, kind, dim, clear, dtype=dtype)(a, init)
    want = bitwise_reference(a, dim, kind)
    assert torch.equal(got, want if clear else BITWISE[kind](want, init))


@pytest.mark.parametrize("op", ["bitand", "bitor", "bitxor"])
def test_bitwise_reducer(op, device):
    a = torch.randint(0, 2 ** 31 - 1, (16, 64), dtype=torch.int32, device=device)
    assert torch.equal(bitwise_reducer(16, 64, op)(a), bitwise_reference(a, 1, op))


@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_bitwise_reductions_compile(backend):
    for kernel in (reduce_rows_or_cols.fn(16, 24, "bitand", 1, False, dtype="uint8"), bitwise_reducer.fn(16, 64, "bitxor")):
        assert ".entry" in tritile.compile(kernel, out_idx=[-1], target="cuda:90", backend=backend).get_source("ptx")


def test_bitwise_reduction_of_floats_is_a_compile_error():
    with pytest.raises(tritile.CompileError, match="a bitwise reduction takes integer tiles"):
        reduce_rows_or_cols.fn(16, 64, "bitor", 1, True, dtype="float32")
    with pytest.raises(tritile.CompileError, match="op 'bitand' needs an integer dtype"):
        @T.prim_func
        def main(A: T.Tensor((8,), T.float32)):
            with T.Kernel(1, threads=32):
                acc = T.alloc_reducer((1,), T.float32, op="bitand")
