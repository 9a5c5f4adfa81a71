"""Element-wise `T.Parallel` kernels, row softmax and scalar control flow, TileLang style.

* bias add with a 1-D broadcast, written directly on global tensors and on tiles (row and
  column vectors);
* row softmax over fragments (`T.reduce_max`, `T.exp`, `T.reduce_sum`), fp16 in and out;
* `T.alloc_var` scalars as counters and accumulators in a serial loop;
* Python `while` and `if` on runtime values (a per-row length read from a tensor);
* `T.float16.max` / `.min` (the type's finite extremes) as clamp bounds;
* a `T.alloc_local` array read inside `T.Parallel` at a runtime index.
On the `device` fixture's tensors (CPU: the reference interpreter; CUDA: the Gluon kernel),
against torch on the same device.
"""
import pytest
import torch

import tritile
import tritile.language as T


@tritile.jit(out_idx=[-1])
def bias_add_global(M, N, block_M, block_N, dtype="float16"):
    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), Bias: T.Tensor((N,), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                C[by * block_M + i, bx * block_N + j] = (
                    A[by * block_M + i, bx * block_N + j] + Bias[bx * block_N + j])

    return main


def test_bias_add_global(device, assert_close):
    M, N = 128, 256
    a = torch.randn(M, N, dtype=torch.float16, device=device)
    bias = torch.randn(N, dtype=torch.float16, device=device)
    assert_close(bias_add_global(M, N, 64, 64)(a, bias), a + bias)


@tritile.jit(out_idx=[-1])
def bias_add_tiles(M, N, block_M, block_N, along, dtype="float16", accum_dtype="float32"):
    """`along` "row": one bias per column (shape N); "col": one bias per row (shape M)."""
    bias_len = N if along == "row" else M

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), Bias: T.Tensor((bias_len,), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            bias_row = T.alloc_shared((block_N,), dtype)
            bias_col = T.alloc_shared((block_M,), dtype)
            T.copy(A[by * block_M, bx * block_N], A_local)
            if along == "row":
                T.copy(Bias[bx * block_N], bias_row)
                for i, j in T.Parallel(block_M, block_N):
                    A_local[i, j] += bias_row[j]
            else:
                T.copy(Bias[by * block_M], bias_col)
                for i, j in T.Parallel(block_M, block_N):
                    A_local[i, j] = A_local[i, j] + bias_col[i]
            T.copy(A_local, C[by * block_M, bx * block_N])

    return main


@pytest.mark.parametrize("along", ["row", "col"])
def test_bias_add_tiles_broadcast(along, device, assert_close):
    M, N = 128, 192
    a = torch.randn(M, N, dtype=torch.float16, device=device)
    bias = torch.randn(N if along == "row" else M, dtype=torch.float16, device=device)
    expected = a.float() + (bias.float() if along == "row" else bias.float()[:, None])
    assert_close(bias_add_tiles(M, N, 64, 64, along)(a, bias), expected.to(torch.float16))


@tritile.jit(out_idx=[-1])
def softmax_rows(M, N, block_M, dtype="float16", accum_dtype="float32"):
    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            x = T.alloc_fragment((block_M, N), accum_dtype)
            row_max = T.alloc_fragment((block_M,), accum_dtype)
            row_sum = T.alloc_fragment((block_M,), accum_dtype)
            T.copy(X[bx * block_M, 0], x)
            T.reduce_max(x, row_max, dim=1)
            for i, j in T.Parallel(block_M, N):
                x[i, j] = T.exp(x[i, j] - row_max[i])
            T.reduce_sum(x, row_sum, dim=1)
            for i, j in T.Parallel(block_M, N):
                x[i, j] = x[i, j] / row_sum[i]
            T.copy(x, Y[bx * block_M, 0])

    return main


def test_row_softmax(device, assert_close):
    M, N = 128, 256
    x = torch.randn(M, N, dtype=torch.float16, device=device) * 4
    expected = torch.softmax(x.float(), dim=1).to(torch.float16)
    assert_close(softmax_rows(M, N, 32)(x), expected)


@tritile.jit(out_idx=[-2, -1])
def count_and_sum_positives(M, N, dtype="float32"):
    """One block per row; a serial loop keeps a counter and a running sum in `T.alloc_var`s."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), Count: T.Tensor((M,), "int32"), Total: T.Tensor((M,), dtype)):
        with T.Kernel(M, threads=128) as bx:
            count = T.alloc_var("int32", init=0)
            total = T.alloc_var(dtype, 0)
            for j in T.serial(N):
                if A[bx, j] > 0:
                    count = count + 1
                    total = total + A[bx, j]
            Count[bx] = count
            Total[bx] = total

    return main


def test_alloc_var_counter(device, assert_close):
    M, N = 16, 64
    a = torch.randn(M, N, device=device)
    count, total = count_and_sum_positives(M, N)(a)
    assert torch.equal(count, (a > 0).sum(1).to(torch.int32))
    assert_close(total, torch.where(a > 0, a, torch.zeros_like(a)).sum(1))


@tritile.jit(out_idx=[-1])
def prefix_sums_by_sign(M, N, dtype="float32"):
    """Row r sums its first Lengths[r] elements, positives and negatives separately: a `while`
    whose trip count and an `if` whose branch are only known at run time."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), Lengths: T.Tensor((M,), "int32"), Out: T.Tensor((M, 2), dtype)):
        with T.Kernel(M, threads=128) as bx:
            i = T.alloc_var("int32", init=0)
            positive = T.alloc_var(dtype, init=0)
            negative = T.alloc_var(dtype, init=0)
            while i < Lengths[bx]:
                if A[bx, i] >= 0:
                    positive = positive + A[bx, i]
                else:
                    negative = negative + A[bx, i]
                i = i + 1
            Out[bx, 0] = positive
            Out[bx, 1] = negative

    return main


def test_while_and_if_on_runtime_values(device, assert_close):
    M, N = 16, 64
    a = torch.randn(M, N, device=device)
    lengths = torch.randint(1, N + 1, (M,), dtype=torch.int32, device=device)
    prefix = torch.arange(N, device=device)[None, :] < lengths[:, None].long()
    expected = torch.stack([torch.where(prefix & (a >= 0), a, 0.0).sum(1),
                            torch.where(prefix & (a < 0), a, 0.0).sum(1)], dim=1)
    assert_close(prefix_sums_by_sign(M, N)(a, lengths), expected)


@tritile.jit(out_idx=[-1])
def saturate_to_half(M, N, block_M, dtype="float32"):
    """Clamps float32 values into float16's finite range, then casts: no infinities."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            for i, j in T.Parallel(block_M, N):
                B[bx * block_M + i, j] = T.cast(
                    T.min(T.max(A[bx * block_M + i, j], T.float16.min), T.float16.max), "float16")

    return main


def test_dtype_extremes_as_clamp_bounds(device, assert_close):
    M, N = 64, 64
    a = torch.randn(M, N, device=device) * 1e5  # many values beyond float16's 65504
    expected = a.clamp(torch.finfo(torch.float16).min, torch.finfo(torch.float16).max).half()
    out = saturate_to_half(M, N, 32)(a)
    assert torch.isfinite(out).all()
    assert_close(out, expected)


@tritile.jit(out_idx=[-1])
def affine_per_row_block(M, N, block_M):
    """`T.alloc_local` arrays (registers, read and written at runtime indices): a (2, 3) table
    of coefficients filled, then written in a serial loop from global memory, and one row of
    it read inside `T.Parallel` at the block's own index: C = A * coef[r, 0] + coef[r, 1] + coef[r, 2]."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), Coef: T.Tensor((6,), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            coef = T.alloc_local((2, 3), "float32")
            T.fill(coef, 1.0)
            for t in T.serial(5):  # the last element keeps the fill
                coef[t // 3, t % 3] = Coef[t] * 2.0
            r = bx % 2
            for i, j in T.Parallel(block_M, N):
                C[bx * block_M + i, j] = A[bx * block_M + i, j] * coef[r, 0] + coef[r, 1] + coef[r, 2]

    return main


def test_local_array_read_inside_parallel(device, assert_close):
    a, c = torch.randn(64, 32, device=device), torch.randn(6, device=device)
    coef = (c * 2).reshape(2, 3)
    coef[1, 2] = 1.0
    rows = coef[torch.arange(64, device=device) // 16 % 2]
    assert_close(affine_per_row_block(64, 32, 16)(a, c), a * rows[:, :1] + rows[:, 1:2] + rows[:, 2:])


@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_local_array_indexed_by_a_lane_is_a_compile_error(backend):
    from tritile.runtime.target import Target

    @T.prim_func
    def gather(A: T.Tensor((32,), "float32"), C: T.Tensor((32,), "float32")):
        with T.Kernel(1, threads=128) as _:
            table = T.alloc_local((4,), "float32")
            for i in T.Parallel(32):
                C[i] = A[i] * table[i % 4]

    with pytest.raises(tritile.CompileError, match=r"local array table by a T\.Parallel variable") as err:
        tritile.compile(gather, target=Target("cuda", 90), backend=backend).get_source("ptx")
    assert "C[i] = A[i] * table[i % 4]" in str(err.value)


# The specialisations tests/test_kernels_compile.py compiles for sm_90 and sm_80.
@tritile.jit(out_idx=[1])
def scale_rows_in_band(M, N, block_M, block_N, lo, hi):
    """TileLang's if_range test shape: indices named inside T.Parallel, an if/else on a chained
    comparison of them (the Gluon code once stored both branches unconditionally)."""
    @T.prim_func
    def main(A: T.Tensor((M, N), "float16"), B: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                row = by * block_M + i
                col = bx * block_N + j
                if lo < row < hi:
                    B[row, col] = A[row, col] * 2.0
                else:
                    B[row, col] = A[row, col] * 0.5

    return main


def test_named_indices_under_a_branch_inside_parallel(device, assert_close):
    a = torch.randn(128, 96, dtype=torch.float16, device=device)
    rows = torch.arange(128, device=device)[:, None]
    expected = torch.where((rows > 16) & (rows < 96), a * 2.0, a * 0.5)
    assert_close(scale_rows_in_band(128, 96, 32, 32, 16, 96)(a), expected)


COMPILE_CASES = {
    "scale_rows_in_band": lambda: scale_rows_in_band(128, 96, 32, 32, 16, 96),
    "bias_add_global": lambda: bias_add_global(128, 256, 64, 64),
    "bias_add_tiles-row": lambda: bias_add_tiles(128, 192, 64, 64, "row"),
    "bias_add_tiles-col": lambda: bias_add_tiles(128, 192, 64, 64, "col"),
    "softmax_rows": lambda: softmax_rows(128, 256, 32),
    "count_and_sum_positives": lambda: count_and_sum_positives(16, 64),
    "prefix_sums_by_sign": lambda: prefix_sums_by_sign(16, 64),
    "saturate_to_half": lambda: saturate_to_half(64, 64, 32),
    "affine_per_row_block": lambda: affine_per_row_block(64, 32, 16),
}


@tritile.jit(out_idx=[0])
def fill_int8(M, N, value):
    @T.prim_func
    def main(out: T.Tensor((M, N), "int8")):
        with T.Kernel(1, threads=128):
            tile = T.alloc_shared((M, N), "int8")
            T.fill(tile, value)
            T.copy(tile, out)

    return main


@pytest.mark.parametrize("value", [-128, -7, 5])
def test_a_kernel_without_inputs_allocates_on_the_gpu_when_there_is_one(value):
    out = fill_int8(8, 128, value)()
    assert out.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert torch.equal(out.cpu(), torch.full((8, 128), value, dtype=torch.int8))
