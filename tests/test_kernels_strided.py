"""`T.StridedTensor(shape, strides, dtype)`: global tensors of declared strides (issue #18 item 4).

A strided parameter's tensor - a column slice, a permuted slice of a fused qkv projection, a
transposed weight - is passed as it is (no copy: writes land in the caller's buffer) and every
backend addresses it through the declared strides: the reference interpreter (torch indexing),
Triton's interpreter running the triton.language kernel on CPU tensors, and on the GPU both
backends.  Strides are ints, expressions of runtime dims, or `T.dynamic` symbols bound from the
tensor's strides.  Checked here on random inputs against torch, with the buffers around each
view filled with NaN / sentinels so that a lane read or written off the view shows; the stride
mismatch (a ValueError naming the argument, before the launch); the CompileErrors at the user's
line; which copies take TMA on sm_90 (TMA needs the last stride 1 and the others multiples of 16
bytes; Gluon takes the 2-D rows view where the leading dims flatten into rows, else a descriptor of
the tensor's full rank, as the triton.language backend does).
"""
import re

import pytest
import torch

import tritile
import tritile.language as T
from kernels import compile_error
from tritile.ir.printer import format_func

BACKENDS = ["gluon", "triton"]  # on CPU tensors: tritile's interpreter, Triton's interpreter


def padded_view(rows, cols, pitch, dtype=torch.float16, fill=float("nan"), device="cpu"):
    """(a random rows x cols view with row pitch `pitch`, the buffer it is a view of, filled
    with `fill` elsewhere)."""
    buffer = torch.full((rows + 1, pitch), fill, dtype=dtype, device=device)
    view = buffer[:rows, :cols]
    view.copy_(torch.randn(rows, cols).to(dtype))
    return view, buffer


# ---------------------------------------------------------------------------- copies


def copy_with_stride(M, N, NN, block_M, block_N, dtype="float16"):
    """TileLang's test_tilelang_copy_with_stride: B = A, A a (M, N) view of rows NN apart."""
    @T.prim_func
    def main(A: T.StridedTensor((M, N), (NN, 1), dtype), B: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                B[by * block_M + i, bx * block_N + j] = A[by * block_M + i, bx * block_N + j]

    return main


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("NN", [96, "dynamic"])
def test_copy_from_a_column_slice(backend, NN):
    func = copy_with_stride(64, 40, T.dynamic("NN") if NN == "dynamic" else NN, 32, 16)
    assert "A: T.StridedTensor([64, 40], [" in format_func(func)
    kernel = tritile.compile(func, out_idx=[1], backend=backend)
    a, _ = padded_view(64, 40, 96)
    assert torch.equal(kernel(a), a)


def tile_copy_strided(M, N, lda, ldb, block_M, block_N, dtype="float16"):
    """B's tiles = A's tiles through a shared tile; both views of wider buffers."""
    @T.prim_func
    def main(A: T.StridedTensor((M, N), (lda, 1), dtype), B: T.StridedTensor((M, N), (ldb, 1), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            tile = T.alloc_shared((block_M, block_N), dtype)
            T.copy(A[by * block_M, bx * block_N], tile)
            T.copy(tile, B[by * block_M, bx * block_N])

    return main


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lda, ldb", [(96, 128), (72, 50), ("int64 symbol", 128)])  # 16-byte pitches (TMA on
# sm_90: the triton backend's CPU run reads through descriptors); 100-byte ones; a T.dynamic(..., "int64") stride
def test_tile_copy_writes_into_a_strided_view(backend, lda, ldb):
    M, N = 40, 48  # edge tiles past M
    declared = T.dynamic("lda", "int64") if lda == "int64 symbol" else lda
    lda = 96 if lda == "int64 symbol" else lda
    kernel = tritile.compile(tile_copy_strided(M, N, declared, ldb, 32, 16), backend=backend)
    a, _ = padded_view(M, N, lda)
    b, b_buffer = padded_view(M, N, ldb, fill=-3.0)
    expected = b_buffer.clone()
    expected[:M, :N] = a
    kernel(a, b)
    assert torch.equal(b_buffer, expected)  # written in place, nothing off the view touched


# ---------------------------------------------------------------------------- permuted slices


def qkv_combine(b, H, t, D, block, ts, dtype="float16"):
    """O = Q * 2 + K, Q and K the `qkv.view(b, t, 3, H, D).permute(2, 0, 3, 1, 4)` slices of a fused
    projection and O a (b, H, t, D) view of a (b, t, H, D) buffer; `ts` the sequence's length as
    the strides name it (an int, or the dim `t` itself when that is T.dynamic)."""
    qkv_strides = (ts * 3 * H * D, D, 3 * H * D, 1)

    @T.prim_func
    def main(Q: T.StridedTensor((b, H, t, D), qkv_strides, dtype),
             K: T.StridedTensor((b, H, t, D), qkv_strides, dtype),
             O: T.StridedTensor((b, H, t, D), (ts * H * D, D, H * D, 1), dtype)):
        with T.Kernel(T.ceildiv(t, block), H, b, threads=128) as (bx, by, bz):
            q = T.alloc_fragment((block, D), dtype)
            k = T.alloc_shared((block, D), dtype)
            T.copy(Q[bz, by, bx * block:(bx + 1) * block, :], q)
            T.copy(K[bz, by, bx * block:(bx + 1) * block, :], k)
            for i, j in T.Parallel(block, D):
                q[i, j] = q[i, j] * 2.0 + k[i, j]
            T.copy(q, O[bz, by, bx * block:(bx + 1) * block, :])

    return main


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seq", ["static", "dynamic"])
def test_permuted_qkv_slices_in_and_a_permuted_view_out(backend, seq, assert_close):
    b, H, t, D = 2, 3, 40, 32
    length = T.dynamic("t") if seq == "dynamic" else t
    kernel = tritile.compile(qkv_combine(b, H, length, D, 16, length), backend=backend)
    x = torch.randn(b, t, 3 * H * D).to(torch.float16)
    q, k, _ = x.view(b, t, 3, H, D).permute(2, 0, 3, 1, 4)
    out = torch.full((b, t, H, D), float("nan"), dtype=torch.float16)
    o = out.permute(0, 2, 1, 3)
    kernel(q, k, o)
    assert_close(out, (q.float() * 2 + k.float()).to(torch.float16).permute(0, 2, 1, 3))


# ---------------------------------------------------------------------------- a GEMM


def gemm_strided(M, N, K, lda, ldc, block_M=32, block_N=32, block_K=32, dtype="float16"):
    """C = A @ B with A a (M, K) slice of rows lda apart, B (K, N) the transpose of a contiguous
    (N, K) weight (strides (1, K): its last stride is not 1) and C a (M, N) slice of rows ldc
    apart."""
    @T.prim_func
    def main(A: T.StridedTensor((M, K), (lda, 1), dtype), B: T.StridedTensor((K, N), (1, K), dtype),
             C: T.StridedTensor((M, N), (ldc, 1), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), "float32")
            T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.copy(A[by * block_M, ko * block_K], A_shared)
                T.copy(B[ko * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return main


def gemm_operands(M, N, K, lda, ldc, device="cpu"):
    a, _ = padded_view(M, K, lda, device=device)
    w = torch.randn(N, K).to(torch.float16).to(device)
    c, c_buffer = padded_view(M, N, ldc, fill=-5.0, device=device)
    return a, w, c, c_buffer


@pytest.mark.parametrize("backend", BACKENDS)
def test_gemm_of_a_row_slice_and_a_transposed_weight_into_a_slice(backend, assert_close):
    M, N, K, lda, ldc = 48, 40, 64, 80, 56
    kernel = tritile.compile(gemm_strided(M, N, K, lda, ldc), backend=backend)
    a, w, c, c_buffer = gemm_operands(M, N, K, lda, ldc)
    kernel(a, w.t(), c)
    assert_close(c, (a.float() @ w.float().t()).to(torch.float16))
    assert torch.equal(c_buffer[:, N:], torch.full((M + 1, ldc - N), -5.0, dtype=torch.float16)[:, :ldc - N])
    assert torch.equal(c_buffer[M], torch.full((ldc,), -5.0, dtype=torch.float16))


# ---------------------------------------------------------------------------- atomics, several kernels


@pytest.mark.parametrize("backend", BACKENDS)
def test_atomic_adds_into_a_transposed_view(backend, assert_close):
    """Out (M, N) is the transpose of a contiguous (N, M) buffer: strides (1, M)."""
    M, N = 32, 24

    @T.prim_func
    def main(A: T.Tensor((4, M, N), T.float32), Out: T.StridedTensor((M, N), (1, M), T.float32)):
        with T.Kernel(4, threads=128) as bx:
            for i, j in T.Parallel(M, N):
                T.atomic_add(Out[i, j], A[bx, i, j])

    a = torch.randn(4, M, N)
    base = torch.randn(N, M)
    expected = base.t() + a.sum(0)
    tritile.compile(main, backend=backend)(a, base.t())
    assert_close(base.t(), expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_split_and_combine_reads_a_strided_input(backend, assert_close):
    """Two kernels (a workspace between them) share the strided parameter and its stride symbol."""
    M, N, ld = 32, 64, T.dynamic("ld")

    @T.prim_func
    def main(A: T.StridedTensor((M, N), (ld, 1), T.float32), Out: T.Tensor((M,), T.float32)):
        partial = T.alloc_global((M, 2), T.float32)
        with T.Kernel(2, threads=128) as bx:
            row = T.alloc_fragment((M, N // 2), T.float32)
            sums = T.alloc_fragment((M,), T.float32)
            T.copy(A[0:M, bx * (N // 2):(bx + 1) * (N // 2)], row)
            T.reduce_sum(row, sums, dim=1)
            for i in T.Parallel(M):
                partial[i, bx] = sums[i]
        with T.Kernel(1, threads=128):
            for i in T.Parallel(M):
                Out[i] = partial[i, 0] + partial[i, 1]

    a, _ = padded_view(M, N, 80, dtype=torch.float32)
    assert_close(tritile.compile(main, out_idx=[1], backend=backend)(a), a.sum(1))


def test_the_profiler_supplies_inputs_of_the_declared_strides():
    kernel = tritile.compile(copy_with_stride(64, 40, 96, 32, 16), out_idx=[1])
    profiler = kernel.get_profiler()
    profiler.assert_allclose(lambda a: a)
    assert profiler._inputs()[0].stride() == (96, 1)


# ---------------------------------------------------------------------------- the eager style


def test_eager_body_declaration_with_a_stride_symbol(assert_close):
    @tritile.jit
    def double_rows(X, block: int = 16):
        M, N = T.const("M, N")
        ld = T.dynamic("ld")
        X: T.StridedTensor((M, N), (ld, 1), T.float32)
        Y = T.empty((M, N), T.float32)
        with T.Kernel(T.ceildiv(M, block)) as bx:
            for i, j in T.Parallel(block, N):
                Y[bx * block + i, j] = X[bx * block + i, j] * 2.0
        return Y

    for pitch in (40, 64):  # one kernel: the pitch is a runtime value
        x, _ = padded_view(32, 24, pitch, dtype=torch.float32)
        assert_close(double_rows(x), x * 2.0)


# ---------------------------------------------------------------------------- call checks


def test_strides_that_differ_are_a_value_error_naming_the_argument():
    kernel = tritile.compile(copy_with_stride(64, 40, 96, 32, 16), out_idx=[1])
    a, _ = padded_view(64, 40, 96)
    kernel(a)  # remembered: the next calls of this kind take the binder's short path
    with pytest.raises(ValueError, match=r"argument 'A' \(param 0\): a T.StridedTensor of strides \[96, 1\]"):
        kernel(padded_view(64, 40, 80)[0])
    with pytest.raises(ValueError, match=r"argument 'A' .* got a tensor of strides \[40, 1\]"):
        kernel(torch.randn(64, 40).to(torch.float16))  # contiguous, so not the declared strides
    with pytest.raises(ValueError, match=r"argument 'A' .* got a tensor of strides \[1, 64\]"):
        kernel(torch.randn(40, 64).to(torch.float16).t())  # column-major


def test_a_size_one_dims_stride_is_free():
    """A dim of size 1 has one index, 0: its stride never addresses anything (torch gives such
    dims whatever stride the view came from)."""
    @T.prim_func
    def main(A: T.StridedTensor((1, 32), (64, 1), T.float32), B: T.Tensor((1, 32), T.float32)):
        with T.Kernel(1, threads=32):
            for j in T.Parallel(32):
                B[0, j] = A[0, j] + 1.0

    a = torch.randn(4, 32)[1:2]  # strides (32, 1)
    assert torch.equal(tritile.compile(main, out_idx=[1])(a), a + 1.0)


def test_a_runtime_allocated_strided_output_has_the_declared_strides(assert_close):
    @T.prim_func
    def main(A: T.Tensor((16, 8), T.float32), B: T.StridedTensor((16, 8), (1, 16), T.float32)):
        with T.Kernel(1, threads=32):
            for i, j in T.Parallel(16, 8):
                B[i, j] = A[i, j] * 3.0

    a = torch.randn(16, 8)
    b = tritile.compile(main, out_idx=[1])(a)
    assert b.stride() == (1, 16)
    assert_close(b, a * 3.0)


# ---------------------------------------------------------------------------- compile errors


@pytest.mark.parametrize("strides, why", [((64,), "2 dimensions (shape [32, 64]) but 1 strides"),
                                          ((64, 1.5), "stride 1 must be a non-negative int"),
                                          ((64, -1), "stride 1 must be a non-negative int"),
                                          (64, "strides must be a tuple or list")])
def test_bad_strides_are_compile_errors_at_the_annotation(strides, why):
    def build():
        @T.prim_func
        def main(A: T.StridedTensor((32, 64), strides, T.float32), B: T.Tensor((32, 64), T.float32)):
            with T.Kernel(1):
                T.copy(A[0:32, 0:64], B[0:32, 0:64])

    message = compile_error(build)
    assert why in message and "def main(A: T.StridedTensor((32, 64), strides, T.float32)" in message


def test_a_bad_eager_body_declaration_is_a_compile_error_at_its_line():
    def build():
        @T.prim_func
        def main(A, B: T.Tensor((32,), T.float32)):
            A: T.StridedTensor((32,), (2, 1), T.float32)
            with T.Kernel(1):
                T.copy(A[0:32], B[0:32])

    message = compile_error(build)
    assert "1 dimensions (shape [32]) but 2 strides" in message and "A: T.StridedTensor((32,), (2, 1)" in message


def test_views_of_a_strided_tensor_are_compile_errors():
    def reshaped():
        @T.prim_func
        def main(A: T.StridedTensor((32, 64), (128, 1), T.float32), B: T.Tensor((2048,), T.float32)):
            with T.Kernel(1):
                flat = T.reshape(A, (2048,))
                T.copy(flat[0:2048], B[0:2048])

    assert "A is a T.StridedTensor, which has no row-major view" in compile_error(reshaped)

    def over_data():
        @T.prim_func
        def main(A: T.Tensor((32, 64), T.float32), B: T.Tensor((32, 32), T.float32)):
            with T.Kernel(1):
                half = T.StridedTensor((32, 32), (64, 1), T.float32, data=A.data)
                T.copy(half[0:32, 0:32], B[0:32, 0:32])

    assert "T.StridedTensor(..., data=)" in compile_error(over_data)


# ---------------------------------------------------------------------------- TMA on sm_90


def test_gluon_tma_for_aligned_pitches_only():
    aligned = tritile.compile(tile_copy_strided(64, 64, 96, 128, 32, 32), target="cuda:90", backend="gluon")
    ptx = aligned.get_source("ptx")
    assert "cp.async.bulk.tensor.2d" in ptx
    source = aligned.get_source("gluon")
    # the declared strides (the constant shapes as literals)
    assert "(A, (64, 64), (96, 1, ))" in source and "(B, (64, 64), (128, 1, ))" in source
    ragged = tritile.compile(tile_copy_strided(64, 64, 100, 50, 32, 32), target="cuda:90", backend="gluon")
    assert "cp.async.bulk.tensor" not in ragged.get_source("ptx")  # 200 / 100-byte rows: pointer loads / stores
    assert "_desc" not in ragged.get_source("gluon")


def test_gluon_gemm_reads_a_transposed_operand_with_pointer_loads():
    kernel = tritile.compile(gemm_strided(64, 64, 64, 80, 72), target="cuda:90", backend="gluon")
    source = kernel.get_source("gluon")
    assert "tma.async_copy_global_to_shared(A_desc" in source and "tma.async_copy_shared_to_global(C_desc" in source
    assert "gl.load(B + _i0[:, None] + (_i1[None, :]) * 64" in source  # B's strides (1, K): not TMA, not cp.async
    assert "(A, (64, 64), (80, 1, ))" in source and "(C, (64, 64), (72, 1, ))" in source


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stride_symbol_takes_tma_in_the_variant_that_knows_it_a_multiple_of_16(backend):
    kernel = tritile.compile(tile_copy_strided(64, 64, T.dynamic("lda"), 128, 32, 32), target="cuda:90",
                             backend=backend)
    assert "A_desc" not in kernel.get_source(backend)  # a pitch of any value: pointer loads
    divisible = kernel.get_source(backend, dims={"lda": 96})
    assert "A_desc" in divisible and "(A, (64, 64), (lda, 1, ))" in divisible
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" in kernel.get_source("ptx", dims={"lda": 96})


def test_gluon_full_rank_descriptors_where_the_leading_dims_do_not_flatten():
    b, H, t, D = 2, 2, 64, 64
    permuted = tritile.compile(qkv_combine(b, H, t, D, 64, t), target="cuda:90", backend="gluon")
    source = permuted.get_source("gluon")  # (b, H) do not flatten into rows of t: 4-D descriptors, [1, 1, t, D] boxes
    assert "(K, (2, 2, 64, 64), (24576, 64, 384, 1, ))" in source
    assert "(O, (2, 2, 64, 64), (8192, 64, 128, 1, ))" in source
    assert "tma.async_copy_global_to_shared(K_desc, [bz, by, (bx * 64), 0]" in source
    assert "tma.async_copy_shared_to_global(O_desc, [bz, by, (bx * 64), 0]" in source
    assert source.count(".reshape([1, 1, 64, 64])") == 2  # the 2-D shared tiles, viewed in the boxes' shape
    ptx = permuted.get_source("ptx")
    assert "cp.async.bulk.tensor.4d.shared::cluster.global" in ptx and "cp.async.bulk.tensor.4d.global.shared" in ptx
    assert "cp.async.bulk.tensor.2d" not in ptx
    ragged = tritile.compile(qkv_combine(b, H, 40, D, 64, 40), target="cuda:90", backend="gluon")
    assert "cp.async.bulk.tensor.4d" in ragged.get_source("ptx")  # the box clipped at t = 40, as the masks do
    unknown = tritile.compile(qkv_combine(b, H, T.dynamic("t"), D, 64, T.dynamic("t")), target="cuda:90",
                              backend="gluon")
    assert "_desc" not in unknown.get_source("gluon")  # a runtime t may be 0: no descriptor can describe it
    assert "K_desc" in unknown.get_source("gluon", dims={"t": 256})

    @T.prim_func
    def heads(A: T.StridedTensor((b, H, t, D), (H * t * 128, t * 128, 128, 1), T.float16),
              B: T.Tensor((b, H, t, D), T.float16)):
        with T.Kernel(H, b, threads=128) as (by, bz):
            tile = T.alloc_shared((t, D), T.float16)
            T.copy(A[bz, by, 0:t, :], tile)
            T.copy(tile, B[bz, by, 0:t, :])

    rows = tritile.compile(heads, target="cuda:90", backend="gluon")  # leading dims that flatten: the rows view
    assert "(A, (256, 64), (128, 1))" in rows.get_source("gluon")  # b * H * t rows of D, pitch 128, not D
    assert "cp.async.bulk.tensor.2d" in rows.get_source("ptx")


def qkv_view_strides(S, H, D):
    """The attention kernels' strides for q / k / v sliced out of a fused [B, S, 3 * H * D] projection, and
    for the output / its gradient laid out [B, S, H, D] (tritile/ops/attention.py's views)."""
    qkv, rows = (S * 3 * H * D, D, 3 * H * D, 1), (S * H * D, D, H * D, 1)
    return qkv, rows


@pytest.mark.parametrize("kernel", ["fwd", "bwd"])
@pytest.mark.parametrize("D", [64, 128])
def test_gluon_attention_moves_qkv_view_tiles_with_4d_tma(kernel, D):
    from tritile.ops import attention as ops

    B, S, H = 2, 256, 4
    qkv, rows = qkv_view_strides(S, H, D)
    names = ("Q", "K", "V", "O") if kernel == "fwd" else ("Q", "K", "V", "dO")
    strides = tuple((name, rows if name in ("O", "dO") else qkv) for name in names)
    build = ops.flashattn_fwd if kernel == "fwd" else ops.flashattn_bwd
    func = build.fn(B, H, S, D, True, dtype="bfloat16", strides=strides, **ops.tile_config("cuda", D, True)[kernel])
    compiled = tritile.compile(func, out_idx=[3, 4] if kernel == "fwd" else [6, 7, 8], target="cuda:90",
                               backend="gluon")
    source, ptx = compiled.get_source("gluon"), compiled.get_source("ptx")
    params = ("Q", "K", "V", "Output") if kernel == "fwd" else names
    for param, (_, declared) in zip(params, strides):  # full-rank descriptors over the declared strides
        assert f"({param}, {(B, H, S, D)}, ({''.join(f'{s}, ' for s in declared)}))" in source, param
    loaded = ("Q", "K", "V") if kernel == "fwd" else ("Q", "K", "V", "dO")
    for name in loaded:
        assert f"tma.async_copy_global_to_shared({name}_desc, [bz, by, " in source, name
    if kernel == "fwd":
        assert "tma.async_copy_shared_to_global(Output_desc, [bz, by, " in source
    assert "cp.async_copy_global_to_shared" not in source and "gl.load(Q" not in source and "gl.load(K" not in source
    assert "cp.async.bulk.tensor.4d.shared::cluster.global" in ptx
    assert "cp.async.cg" not in ptx and "cp.async.ca" not in ptx  # no cp.async left for them
    if kernel == "fwd":
        assert "cp.async.bulk.tensor.4d.global.shared" in ptx


def test_the_attention_backward_reads_views_by_cp_async():
    """TRITILE_FULL_RANK_TMA=off (what the attention op's backward is built under, its measured
    choice) leaves the views' tiles to cp.async: no 4-D descriptor, in the generated code and its
    cache key alike."""
    from tritile import switches
    from tritile.ops import attention as ops

    B, S, H, D = 2, 256, 4, 64
    qkv, rows = qkv_view_strides(S, H, D)
    strides = (("Q", qkv), ("K", qkv), ("V", qkv), ("dO", rows))
    func = ops.flashattn_bwd.fn(B, H, S, D, True, dtype="bfloat16", strides=strides, **ops.tile_config("cuda", D, True)["bwd"])
    with switches.overridden(ops.BACKWARD_SWITCHES):
        compiled = tritile.compile(func, out_idx=[6, 7, 8], target="cuda:90", backend="gluon")
        source, ptx = compiled.get_source("gluon"), compiled.get_source("ptx")
    assert "cp.async_copy_global_to_shared" in source and not re.search(r"\b(Q|dO)_desc\b", source)
    assert "cp.async.bulk.tensor.4d" not in ptx


def test_triton_descriptors_take_the_declared_strides():
    kernel = tritile.compile(qkv_combine(2, 2, 64, 64, 64, 64), target="cuda:90", backend="triton")
    source = kernel.get_source("triton")
    assert "(Q, (2, 2, 64, 64), (24576, 64, 384, 1, ))" in source
    assert "(O, (2, 2, 64, 64), (8192, 64, 128, 1, ))" in source
    assert "Q_desc.load([" in source and "O_desc.store([" in source
    assert "cp.async.bulk.tensor.4d" in kernel.get_source("ptx")
    gemm = tritile.compile(gemm_strided(64, 64, 64, 80, 72), target="cuda:90", backend="triton")
    body = gemm.get_source("triton")
    assert "A_desc.load([" in body and "C_desc.store([" in body
    assert "B_desc" not in body  # its last stride is not 1: pointer loads


# ---------------------------------------------------------------------------- the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_kernels_on_the_gpu(backend, assert_close):
    a, _ = padded_view(40, 48, 96, device="cuda")
    b, b_buffer = padded_view(40, 48, 128, fill=-3.0, device="cuda")
    expected = b_buffer.clone()
    expected[:40, :48] = a
    tritile.compile(tile_copy_strided(40, 48, 96, 128, 32, 16), backend=backend)(a, b)
    assert torch.equal(b_buffer, expected)

    bs, H, D, t = 2, 3, 64, T.dynamic("t")
    kernel = tritile.compile(qkv_combine(bs, H, t, D, 64, t), backend=backend)
    for length in (200, 256):  # 256: the variant whose strides are known multiples of 16 (triton: TMA)
        x = torch.randn(bs, length, 3 * H * D, device="cuda").to(torch.float16)
        q, k, _ = x.view(bs, length, 3, H, D).permute(2, 0, 3, 1, 4)
        out = torch.full((bs, length, H, D), float("nan"), dtype=torch.float16, device="cuda")
        kernel(q, k, out.permute(0, 2, 1, 3))
        assert_close(out, (q.float() * 2 + k.float()).to(torch.float16).permute(0, 2, 1, 3))

    M, N, K, lda, ldc = 200, 136, 256, 320, 192
    a, w, c, c_buffer = gemm_operands(M, N, K, lda, ldc, device="cuda")
    tritile.compile(gemm_strided(M, N, K, lda, ldc, 64, 64, 32), backend=backend)(a, w.t(), c)
    assert_close(c, (a.float() @ w.float().t()).to(torch.float16))
    assert bool((c_buffer[:, N:] == -5.0).all()) and bool((c_buffer[M] == -5.0).all())


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t", [200, 256])
def test_full_rank_tma_tiles_of_qkv_slices_on_the_gpu(backend, t, assert_close):
    """Static lengths: the qkv slices and the permuted output take full-rank (4-D) descriptors on sm_90
    in both backends; 200 clips the last row block at t, where the next batch's rows lie."""
    bs, H, D = 2, 3, 64
    kernel = tritile.compile(qkv_combine(bs, H, t, D, 64, t), backend=backend)
    x = torch.randn(bs, t, 3 * H * D, device="cuda").to(torch.float16)
    q, k, _ = x.view(bs, t, 3, H, D).permute(2, 0, 3, 1, 4)
    out = torch.full((bs, t, H, D), float("nan"), dtype=torch.float16, device="cuda")
    kernel(q, k, out.permute(0, 2, 1, 3))
    assert_close(out, (q.float() * 2 + k.float()).to(torch.float16).permute(0, 2, 1, 3))
