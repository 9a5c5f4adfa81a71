"""Fragments read and written at a runtime index along some dims (TileLang's flash-decoding combines).

* `fragment_rows`: rows of a fragment read and written at indices read from memory - by `T.copy`
  of `a[k, :]` into a fragment and of a fragment into `b[r, :]`, by `a[k, j]` / `c[r, j]` inside
  `T.Parallel(j)` -, a column (`a[:, k]` inside `T.Parallel(i)`, `T.fill(d[:, k], -1)`) and single
  elements outside `T.Parallel`; other rows hold inf, -inf, NaN and -0.0, and the result must be bit-exact (but for NaN payloads);
* `mha_combine`: the combine kernel of TileLang's example_mha_inference.py (`T.copy(lse_local[k, :],
  lse_local_split)` and `lse_local[k, i]` inside `T.Parallel` in pipelined loops over the splits),
  taking the splits' log-sum-exps and partial outputs as inputs;
* `gqa_decode_combine`: the combine kernel of TileLang's example_gqa_decode.py (`lse_local[k, j]`
  read inside `T.Parallel(128)` in a serial loop over the splits).
On the `device` fixture's tensors (CPU: the reference interpreter, or Triton's interpreter with
TRITILE_BACKEND=triton; CUDA: the compiled kernel), against torch on the same device.
"""
import pytest
import torch

import tritile
import tritile.language as T
from tritile.runtime.target import Target


@tritile.jit(out_idx=[-4, -3, -2, -1])
def fragment_rows(R, N, dtype):
    """B[r] = A[rows[r]] through T.copy of rows; C[r] = A[rows[r]] and D[:, r] = A[:, cols[r]]
    inside T.Parallel, then D[:, rows[0]] = -1 (T.fill of a column); E[r] = A[rows[r], cols[r]]
    as single elements."""

    @T.prim_func
    def main(A: T.Tensor((R, N), dtype), Rows: T.Tensor((R,), "int32"), Cols: T.Tensor((R,), "int32"),
             B: T.Tensor((R, N), dtype), C: T.Tensor((R, N), dtype), D: T.Tensor((R, R), dtype),
             E: T.Tensor((R,), dtype)):
        with T.Kernel(1, threads=128) as _:
            a = T.alloc_fragment((R, N), dtype)
            b = T.alloc_fragment((R, N), dtype)
            c = T.alloc_fragment((R, N), dtype)
            d = T.alloc_fragment((R, R), dtype)
            e = T.alloc_fragment((R,), dtype)
            row = T.alloc_fragment((N,), dtype)
            T.copy(A, a)
            T.clear(b)
            T.clear(c)
            T.clear(d)
            T.clear(e)
            for r in T.serial(R):
                k = Rows[r]
                T.copy(a[k, :], row)
                T.copy(row, b[r, :])
                for j in T.Parallel(N):
                    c[r, j] = a[k, j]
                for i in T.Parallel(R):
                    d[i, r] = a[i, Cols[r]]
                e[r] = a[k, Cols[r]]
            T.fill(d[:, Rows[0]], -1)
            T.copy(b, B)
            T.copy(c, C)
            T.copy(d, D)
            T.copy(e, E)

    return main


def special_values(shape, dtype, device):
    """Random values with inf, -inf, NaN and -0.0 scattered in."""
    x = torch.randn(shape, device=device).to(dtype) if dtype.is_floating_point else \
        torch.randint(-1000, 1000, shape, dtype=dtype, device=device)
    if dtype.is_floating_point:
        flat = x.view(-1)
        for n, value in enumerate([float("inf"), float("-inf"), float("nan"), -0.0]):
            flat[n::7] = value
    return x


def same_values(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit-equal but for NaN payloads (NaN where the other has NaN): -0.0 is not 0.0."""
    if got.dtype.is_floating_point:
        nan = want.isnan()
        if not torch.equal(got.isnan(), nan):
            return False
        got, want = got.masked_fill(nan, 0), want.masked_fill(nan, 0)
    view = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[got.element_size()]
    return torch.equal(got.view(view), want.view(view))


def fragment_rows_reference(a, rows, cols) -> list:
    rows, cols = rows.long(), cols.long()
    d = a[:, cols].clone()
    d[:, rows[0]] = -1
    return [a[rows], a[rows], d, a[rows, cols]]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "int32"])
@pytest.mark.parametrize("R, N", [(4, 32), (6, 24)])  # (6, 24): tiles padded to (8, 32)
def test_fragment_rows_are_exact(R, N, dtype, device):
    torch_dtype = getattr(torch, dtype)
    a = special_values((R, N), torch_dtype, device)
    rows = torch.randperm(R, device=device).to(torch.int32)
    cols = torch.randint(0, min(R, N), (R,), device=device, dtype=torch.int32)
    b, c, d, e = fragment_rows(R, N, dtype)(a, rows, cols)
    for name, got, want in zip("BCDE", (b, c, d, e), fragment_rows_reference(a, rows, cols)):
        assert same_values(got, want), f"{name}: {got} != {want}"


@tritile.jit(out_idx=[-1])
def mha_combine(batch, heads, seqlen_q, num_split, dim, block_M):
    """example_mha_inference.py's combine kernel, as one kernel over the splits' outputs."""
    dtype, accum_dtype = "float16", "float32"

    @T.prim_func
    def main(glse: T.Tensor([batch, heads, num_split, seqlen_q], dtype),
             Output_partial: T.Tensor([batch, seqlen_q, heads, num_split, dim], dtype),
             Output: T.Tensor([batch, seqlen_q, heads, dim], dtype)):
        with T.Kernel(T.ceildiv(seqlen_q, block_M), heads, batch, threads=128) as (bx, by, bz):
            po_local = T.alloc_fragment([block_M, dim], dtype)
            o_accum_local = T.alloc_fragment([block_M, dim], accum_dtype)
            o_shared = T.alloc_shared([block_M, dim], dtype)
            lse_local = T.alloc_fragment([num_split, block_M], dtype)
            lse_local_split = T.alloc_fragment([block_M], accum_dtype)
            lse_logsum_local = T.alloc_fragment([block_M], accum_dtype)
            lse_max_local = T.alloc_fragment([block_M], accum_dtype)
            scale_local = T.alloc_fragment([block_M], accum_dtype)

            T.clear(lse_logsum_local)
            T.clear(o_accum_local)
            T.copy(glse[bz, by, :, bx * block_M:(bx + 1) * block_M], lse_local)
            T.reduce_max(lse_local, lse_max_local, dim=0, clear=True)
            for k in T.Pipelined(num_split):
                T.copy(lse_local[k, :], lse_local_split)
                for i in T.Parallel(block_M):
                    lse_logsum_local[i] += T.exp2(lse_local_split[i] - lse_max_local[i])
            for i in T.Parallel(block_M):
                lse_logsum_local[i] = T.log2(lse_logsum_local[i]) + lse_max_local[i]
            for k in T.Pipelined(num_split, num_stages=2):
                T.copy(Output_partial[bz, bx * block_M:(bx + 1) * block_M, by, k, :], po_local)
                for i in T.Parallel(block_M):
                    lse_local_split[i] = lse_local[k, i]
                for i in T.Parallel(block_M):
                    scale_local[i] = T.exp2(lse_local_split[i] - lse_logsum_local[i])
                for i, j in T.Parallel(block_M, dim):
                    o_accum_local[i, j] += po_local[i, j] * scale_local[i]
            T.copy(o_accum_local, o_shared)
            T.copy(o_shared, Output[bz, bx * block_M:(bx + 1) * block_M, by, :], disable_tma=True)

    return main


def combine_reference(lse: torch.Tensor, partial: torch.Tensor) -> torch.Tensor:
    """sum_k partial[k] * 2^(lse[k] - log2(sum_k 2^lse[k])), splits along dim 0 of both."""
    lse = lse.float()
    lse_max = lse.max(dim=0).values
    logsum = torch.log2(torch.exp2(lse - lse_max).sum(dim=0)) + lse_max
    scale = torch.exp2(lse - logsum)
    return (partial.float() * scale.reshape(*scale.shape, *[1] * (partial.dim() - scale.dim()))).sum(dim=0)


def split_lse(shape, device):
    """Log-sum-exps of the splits, an empty split (-inf) among them."""
    lse = torch.randn(shape, device=device) * 4
    lse.view(-1)[::5] = float("-inf")
    return lse.half()


@pytest.mark.parametrize("seqlen_q, block_M", [(64, 32), (48, 64)])  # (48, 64): a partial query block
def test_mha_inference_combine(seqlen_q, block_M, device, assert_close):
    batch, heads, num_split, dim = 2, 2, 4, 32
    glse = split_lse((batch, heads, num_split, seqlen_q), device)
    partial = torch.randn(batch, seqlen_q, heads, num_split, dim, device=device).half()
    out = mha_combine(batch, heads, seqlen_q, num_split, dim, block_M)(glse, partial)
    expected = combine_reference(glse.permute(2, 0, 3, 1), partial.permute(3, 0, 1, 2, 4))
    assert_close(out, expected.half())


@tritile.jit(out_idx=[-1])
def gqa_decode_combine(batch, heads, num_split, dim):
    """example_gqa_decode.py's combine kernel, taking the splits' log-sum-exps and outputs."""
    dtype, accum_dtype = "float16", "float32"

    @T.prim_func
    def main(glse: T.Tensor([batch, heads, num_split], dtype),
             Output_partial: T.Tensor([batch, heads, num_split, dim], dtype),
             Output: T.Tensor([batch, heads, dim], dtype)):
        with T.Kernel(heads, batch, threads=128) as (by, bz):
            po_local = T.alloc_fragment([dim], dtype)
            o_accum_local = T.alloc_fragment([dim], accum_dtype)
            lse_local = T.alloc_fragment([num_split, 128], dtype)
            lse_logsum_local = T.alloc_fragment([128], accum_dtype)
            lse_max_local = T.alloc_fragment([128], accum_dtype)
            scale_local = T.alloc_fragment([128], accum_dtype)

            T.clear(lse_logsum_local)
            T.clear(o_accum_local)
            for k, j in T.Parallel(num_split, 128):
                lse_local[k, j] = glse[bz, by, k]
            T.reduce_max(lse_local, lse_max_local, dim=0, clear=True)
            for k in T.serial(num_split):
                for j in T.Parallel(128):
                    lse_logsum_local[j] += T.exp2(lse_local[k, j] - lse_max_local[j])
            for j in T.Parallel(128):
                lse_logsum_local[j] = T.log2(lse_logsum_local[j]) + lse_max_local[j]
            for k in T.serial(num_split):
                for i in T.Parallel(dim):
                    po_local[i] = Output_partial[bz, by, k, i]
                for j in T.Parallel(128):
                    scale_local[j] = T.exp2(lse_local[k, j] - lse_logsum_local[j])
                for i in T.Parallel(dim):
                    o_accum_local[i] += po_local[i] * scale_local[i]
            for i in T.Parallel(dim):
                Output[bz, by, i] = o_accum_local[i]

    return main


def test_gqa_decode_combine(device, assert_close):
    batch, heads, num_split, dim = 2, 4, 4, 128
    glse = split_lse((batch, heads, num_split), device)
    partial = torch.randn(batch, heads, num_split, dim, device=device).half()
    out = gqa_decode_combine(batch, heads, num_split, dim)(glse, partial)
    expected = combine_reference(glse.permute(2, 0, 1), partial.permute(2, 0, 1, 3))
    assert_close(out, expected.half())


@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_fragment_indexed_by_a_lane_is_a_compile_error(backend):
    """A row chosen per lane (a register gather) stays refused on both backends."""

    @T.prim_func
    def gather(A: T.Tensor((4, 32), "float32"), C: T.Tensor((32,), "float32")):
        with T.Kernel(1, threads=128) as _:
            a = T.alloc_fragment((4, 32), "float32")
            T.copy(A, a)
            for j in T.Parallel(32):
                C[j] = a[j % 4, j]

    with pytest.raises(tritile.CompileError, match="indexing of fragment buffer a inside T.Parallel") as err:
        tritile.compile(gather, target=Target("cuda", 90), backend=backend).get_source("ptx")
    assert "C[j] = a[j % 4, j]" in str(err.value)


@tritile.jit(out_idx=[-1])
def accumulator_row_and_column(M, N, K):
    """C = A @ B.T, then row 3 and column 5 of the gemm accumulator added once more through
    `T.Parallel(1, N)` / `T.Parallel(M, 1)` at static offsets (FP8 seed 3333 mutant #255's
    promotion step over one row of a wgmma accumulator)."""

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((N, K), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(1, threads=128) as _:
            a = T.alloc_shared((M, K), "float16")
            b = T.alloc_shared((N, K), "float16")
            acc = T.alloc_fragment((M, N), "float32")
            total = T.alloc_fragment((M, N), "float32")
            T.copy(A, a)
            T.copy(B, b)
            T.clear(acc)
            T.gemm(a, b, acc, transpose_B=True)
            T.copy(acc, total)
            for i, j in T.Parallel(1, N):
                total[i + 3, j] += acc[i + 3, j]
            for i, j in T.Parallel(M, 1):
                total[i, j + 5] += acc[i, j + 5]
            T.copy(total, C)

    return main


def test_accumulator_row_and_column(device):
    """Exact: small integers, so every sum is exact whatever its order."""
    a = torch.randint(-3, 4, (64, 32), device=device).half()
    b = torch.randint(-3, 4, (64, 32), device=device).half()
    want = a.float() @ b.float().T
    want[3, :] += want[3, :].clone()
    want[:, 5] += (a.float() @ b.float().T)[:, 5]
    assert same_values(accumulator_row_and_column(64, 64, 32)(a, b), want)


def test_accumulator_row_is_expanded_not_reshaped():
    """A row (column) selected from the accumulator goes back into its 2-D tile by indexing with
    None, which keeps the accumulator's layout: `tl.reshape(row, [1, N])` made Triton 3.6 take
    ~35 s (CPU) to compile mutant #255's conversion back to the wgmma layout (0.6 s expanded)."""
    kernel = tritile.compile(accumulator_row_and_column(64, 64, 32).stages[0][1], target=Target("cuda", 90),
                             backend="triton")
    src = kernel.get_source("triton")
    assert "tl.reshape(tl.sum(" not in src
    assert ".to(tl.float32, bitcast=True)[None, :]" in src
    assert ".to(tl.float32, bitcast=True)[:, None]" in src


# The specialisations tests/test_kernels_compile.py compiles for sm_90 and sm_80.
COMPILE_CASES = {
    "fragment_rows_f16": lambda: fragment_rows(6, 24, "float16"),
    "fragment_rows_i32": lambda: fragment_rows(4, 32, "int32"),
    "mha_combine": lambda: mha_combine(2, 2, 128, 4, 64, 64),
    "gqa_decode_combine": lambda: gqa_decode_combine(2, 4, 8, 128),
    "accumulator_row_and_column": lambda: accumulator_row_and_column(64, 64, 32),
}
