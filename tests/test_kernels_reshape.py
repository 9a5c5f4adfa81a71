"""Views (`T.reshape`, `T.view`, `T.Tensor(shape, dtype, A.data)`): TileLang's
testing/python/language/test_tilelang_language_reshape.py / _view.py and the `.data` use of its
convolution example, written the TileLang way.

* a global tensor reshaped (`T.copy(T.reshape(A, ...), B)`), viewed as another dtype of the
  same bits (float32 <-> float16, bitwise), flattened through `.data` inside a GEMM
  (TileLang's im2col-free convolution shape: `T.Tensor((K * K * C, F), dtype, kernel.data)`),
  and written through a view;
* a shared buffer reshaped 1-D -> 2-D and 2-D -> 1-D, a fragment reshaped 2-D -> 1-D, a
  fragment reshaped 1-D -> 2-D then reduced over its new dim, a 3-D reshape reduced
  (`reduce_absmax` of int64), and a buffer written through its view and read through its
  storage;
* a view whose bits differ from its source's is a CompileError at the user's line; an on-chip
  view of another dtype is a CompileError on the backends (the interpreter runs it).
On the `device` fixture's tensors (CPU: the reference interpreter, or Triton's interpreter with
TRITILE_BACKEND=triton; CUDA: the compiled kernel), against torch on the same device; the
programs are also compiled for sm_90 and sm_80 through both backends on the CPU.
"""
import pytest
import torch

import tritile
import tritile.language as T
from tritile.runtime.target import Target


@tritile.jit(out_idx=-1)
def reshape_global(N, M, dtype):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N // M, M), dtype)):
        with T.Kernel(1) as _:
            A_reshaped = T.reshape(A, [N // M, M])
            T.copy(A_reshaped, B)

    return main


@tritile.jit(out_idx=-1)
def view_global(N, M, dtype, new_dtype):
    """TileLang's view_test: A (N,) viewed as (N // M, M * bits(dtype) / bits(new_dtype)) of new_dtype."""
    cols = M * T.dtype(dtype).bits // T.dtype(new_dtype).bits

    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N // M, cols), new_dtype)):
        with T.Kernel(1) as _:
            A_viewed = T.view(A, [N // M, cols], dtype=new_dtype)
            T.copy(A_viewed, B)

    return main


@tritile.jit(out_idx=-1)
def write_through_view(R, C, block_R):
    """B (R, C) written through a 1-D view of it, row tile by row tile: B = 2 * A."""

    @T.prim_func
    def main(A: T.Tensor((R, C), "float32"), B: T.Tensor((R, C), "float32")):
        with T.Kernel(T.ceildiv(R, block_R), threads=128) as bx:
            B_flat = T.Tensor((R * C,), "float32", B.data)
            for i, j in T.Parallel(block_R, C):
                B_flat[(bx * block_R + i) * C + j] = A[bx * block_R + i, j] * 2.0

    return main


@tritile.jit(out_idx=-1)
def flat_weight_gemm(M, KH, C, F, block_M, block_N, block_K):
    """TileLang's convolution shape: the weight (KH, KH, C, F) addressed as (KH * KH * C, F)
    through `.data`, the output (M, F) through a (M // 2, 2, F) view."""
    K = KH * KH * C

    @T.prim_func
    def main(X: T.Tensor((M, K), "float16"), W: T.Tensor((KH, KH, C, F), "float16"),
             Out: T.Tensor((M // 2, 2, F), "float16")):
        with T.Kernel(T.ceildiv(F, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            x_shared = T.alloc_shared((block_M, block_K), "float16")
            w_shared = T.alloc_shared((block_K, block_N), "float16")
            acc = T.alloc_fragment((block_M, block_N), "float32")
            w_flat = T.Tensor((K, F), "float16", W.data)
            out_flat = T.Tensor((M, F), "float16", Out.data)
            T.clear(acc)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.copy(X[by * block_M, k * block_K], x_shared)
                T.copy(w_flat[k * block_K, bx * block_N], w_shared)
                T.gemm(x_shared, w_shared, acc)
            T.copy(acc, out_flat[by * block_M, bx * block_N])

    return main


@tritile.jit
def reshape_dynamic(M, block_R):
    """A `T.dynamic` size in the view's shape: checked against the storage when the call comes."""
    N = T.dynamic("N")

    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N // M, M), "float32")):
        with T.Kernel(T.ceildiv(N // M, block_R)) as bx:
            rows = T.reshape(A, [N // M, M])
            T.copy(rows[bx * block_R:bx * block_R + block_R, :], B[bx * block_R:bx * block_R + block_R, :])

    return main


@tritile.jit
def eager_flat_sum(W, X, block_M: int = 32, block_N: int = 32):
    """The eager style of TileLang's convolution example: `.data` of a parameter and of the output."""
    R, C, F = T.const("R, C, F")
    W: T.Tensor((R, C, F), T.float32)
    X: T.Tensor((R * C, F), T.float32)
    out = T.empty((R, C, F), T.float32)
    with T.Kernel(T.ceildiv(F, block_N), T.ceildiv(R * C, block_M), threads=128) as (bx, by):
        w_flat = T.Tensor((R * C, F), T.float32, W.data)
        out_flat = T.Tensor((R * C, F), T.float32, out.data)
        tile = T.alloc_fragment((block_M, block_N), T.float32)
        x = T.alloc_fragment((block_M, block_N), T.float32)
        T.copy(w_flat[by * block_M, bx * block_N], tile)
        T.copy(X[by * block_M, bx * block_N], x)
        for i, j in T.Parallel(block_M, block_N):
            tile[i, j] = tile[i, j] + x[i, j]
        T.copy(tile, out_flat[by * block_M, bx * block_N])
    return out


@tritile.jit(out_idx=-1)
def reshape_shared_1d_to_2d(N, M, dtype):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N // M, M), dtype)):
        with T.Kernel(1) as _:
            A_shared = T.alloc_shared((N,), dtype)
            for i in T.Parallel(N):
                A_shared[i] = A[i]
            A_smem_reshaped = T.reshape(A_shared, [N // M, M])
            T.copy(A_smem_reshaped, B)

    return main


@tritile.jit(out_idx=-1)
def reshape_shared_2d_to_1d(N, M, dtype):
    @T.prim_func
    def main(A: T.Tensor((N // M, M), dtype), B: T.Tensor((N,), dtype)):
        with T.Kernel(1) as _:
            A_shared = T.alloc_shared((N // M, M), dtype)
            for i, j in T.Parallel(N // M, M):
                A_shared[i, j] = A[i, j]
            A_smem_reshaped = T.reshape(A_shared, [N])
            T.copy(A_smem_reshaped, B)

    return main


@tritile.jit(out_idx=-1)
def reshape_fragment(N, M, dtype):
    @T.prim_func
    def main(A: T.Tensor((N // M, M), dtype), B: T.Tensor((N,), dtype)):
        with T.Kernel(1, threads=32) as _:
            A_shared = T.alloc_shared((N // M, M), dtype, scope="shared")
            A_local = T.alloc_fragment((N // M, M), dtype)
            B_shared = T.alloc_shared((N,), dtype, scope="shared")
            T.copy(A, A_shared)
            T.copy(A_shared, A_local)
            A_local_reshape = T.reshape(A_local, [N])
            T.copy(A_local_reshape, B_shared)
            T.copy(B_shared, B)

    return main


@tritile.jit(out_idx=-1)
def reduce_after_reshape(N, M, dtype):
    @T.prim_func
    def main(A: T.Tensor((N,), dtype), B: T.Tensor((N // M,), dtype)):
        with T.Kernel(1, threads=32) as _:
            A_shared = T.alloc_shared((N,), dtype, scope="shared")
            A_local = T.alloc_fragment((N,), dtype)
            B_local = T.alloc_fragment((N // M,), dtype)
            T.copy(A, A_shared)
            T.copy(A_shared, A_local)
            A_local_reshape = T.reshape(A_local, [N // M, M])
            T.reduce_max(A_local_reshape, B_local, dim=1)
            T.copy(B_local, B)

    return main


@tritile.jit(out_idx=-1)
def reduce_absmax_after_reshape_3d(M, N, groups, dtype):
    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, groups), dtype)):
        with T.Kernel(1, threads=128) as _:
            A_local = T.alloc_fragment((M, N), dtype)
            A_reshaped = T.reshape(A_local, [M, groups, N // groups])
            B_local = T.alloc_fragment((M, groups), dtype)
            T.copy(A, A_local)
            T.reduce_absmax(A_reshaped, B_local, dim=2)
            T.copy(B_local, B)

    return main


@tritile.jit(out_idx=-1)
def write_view_read_storage(R, C):
    """A fragment written through its 1-D view (x * 3, then + 1 on the same view), read as
    the 2-D storage: B = 3 * A + 1, A's rows scaled by their sums' sign afterwards read back
    through the view again."""

    @T.prim_func
    def main(A: T.Tensor((R, C), "float32"), B: T.Tensor((R * C,), "float32")):
        with T.Kernel(1, threads=128) as _:
            tile = T.alloc_fragment((R, C), "float32")
            flat = T.reshape(tile, [R * C])
            a_flat = T.alloc_fragment((R * C,), "float32")
            T.copy(A, tile)
            T.copy(flat, a_flat)
            for i in T.Parallel(R * C):
                flat[i] = a_flat[i] * 3.0
            for i in T.Parallel(R * C):
                flat[i] = flat[i] + 1.0
            for i, j in T.Parallel(R, C):
                tile[i, j] = tile[i, j] - 0.5
            T.copy(flat, B)

    return main


def test_reshape_global(device):
    for N, M, dtype in ((1024, 32, "float32"), (2048, 64, "float16")):
        a = torch.randn(N, device=device).to(getattr(torch, dtype))
        torch.testing.assert_close(reshape_global(N, M, dtype)(a), a.reshape(N // M, M), rtol=0, atol=0)


@pytest.mark.parametrize("dtype, new_dtype", [("float32", "float32"), ("float16", "float16"),
                                               ("float32", "float16"), ("float16", "float32"),
                                               ("float32", "int32")])
def test_view_global(dtype, new_dtype, device):
    """The input's bits are those of random values of the view's dtype (a NaN's payload need
    not survive a copy)."""
    N, M = 1024, 32
    new = getattr(torch, new_dtype)
    cols = M * T.dtype(dtype).bits // T.dtype(new_dtype).bits
    want = (torch.randint(-2 ** 31, 2 ** 31 - 1, (N // M, cols), dtype=new, device=device) if new == torch.int32
            else torch.randn(N // M, cols, device=device).to(new))
    a = want.reshape(-1).view(getattr(torch, dtype))
    got = view_global(N, M, dtype, new_dtype)(a)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)


def test_write_through_data_view(device):
    a = torch.randn(48, 32, device=device)
    torch.testing.assert_close(write_through_view(48, 32, 16)(a), a * 2.0)


def test_flat_weight_gemm_through_data(device, assert_close):
    M, KH, C, F = 128, 2, 16, 64
    x = torch.randn(M, KH * KH * C, device=device).half()
    w = torch.randn(KH, KH, C, F, device=device).half()
    got = flat_weight_gemm(M, KH, C, F, 64, 64, 32)(x, w)
    assert got.shape == (M // 2, 2, F)
    assert_close(got, (x.float() @ w.reshape(-1, F).float()).half().reshape(M // 2, 2, F))


def test_reshape_dynamic_size(device):
    kernel = reshape_dynamic(32, 16)
    a, b = torch.randn(32 * 40, device=device), torch.empty(40, 32, device=device)
    kernel(a, b)
    torch.testing.assert_close(b, a.reshape(40, 32), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"view 'rows' of 'A': shape \[40, 32\] of float32 is 40960 bits"):
        kernel(torch.randn(32 * 40 + 3, device=device), b)


def test_eager_data_views(device):
    w, x = torch.randn(4, 16, 64, device=device), torch.randn(64, 64, device=device)
    torch.testing.assert_close(eager_flat_sum(w, x), w + x.reshape(4, 16, 64))


@pytest.mark.parametrize("kernel, shape_in, ref", [
    (reshape_shared_1d_to_2d, lambda N, M: (N,), lambda a, N, M: a.reshape(N // M, M)),
    (reshape_shared_2d_to_1d, lambda N, M: (N // M, M), lambda a, N, M: a.reshape(N)),
    (reshape_fragment, lambda N, M: (N // M, M), lambda a, N, M: a.reshape(N)),
    (reduce_after_reshape, lambda N, M: (N,), lambda a, N, M: a.reshape(N // M, M).amax(dim=1)),
], ids=["shared_1d_2d", "shared_2d_1d", "fragment", "reduce_after_reshape"])
def test_reshape_on_chip(kernel, shape_in, ref, device):
    for N, M, dtype in ((1024, 32, "float32"), (2048, 64, "float16")):
        a = torch.randn(*shape_in(N, M), device=device).to(getattr(torch, dtype))
        torch.testing.assert_close(kernel(N, M, dtype)(a), ref(a, N, M), rtol=0, atol=0)


def test_reduce_absmax_after_reshape_3d(device):
    M, N, groups = 2, 512, 4
    a = torch.randint(-100, 100, (M, N), dtype=torch.int64, device=device)
    got = reduce_absmax_after_reshape_3d(M, N, groups, "int64")(a)
    torch.testing.assert_close(got, a.abs().reshape(M, groups, N // groups).amax(dim=2))


def test_write_view_read_storage(device):
    a = torch.randn(16, 32, device=device)
    torch.testing.assert_close(write_view_read_storage(16, 32)(a), (a * 3.0 + 1.0 - 0.5).reshape(-1))


_COMPILED = [
    (reshape_global, (1024, 32, "float16")), (view_global, (1024, 32, "float32", "float16")),
    (write_through_view, (48, 32, 16)), (flat_weight_gemm, (128, 2, 16, 64, 64, 64, 32)),
    (reshape_shared_1d_to_2d, (1024, 32, "float16")), (reshape_shared_2d_to_1d, (1024, 32, "float32")),
    (reshape_fragment, (1024, 32, "float16")), (reduce_after_reshape, (1024, 32, "float32")),
    (write_view_read_storage, (16, 32)), (reshape_dynamic, (32, 16)),
]


@pytest.mark.parametrize("backend", ["gluon", "triton"])
@pytest.mark.parametrize("arch", [90, 80])
@pytest.mark.parametrize("kernel, args", _COMPILED, ids=[k.__name__ if hasattr(k, "__name__") else str(i)
                                                         for i, (k, _) in enumerate(_COMPILED)])
def test_views_compile(kernel, args, arch, backend):
    compiled = tritile.compile(kernel.fn(*args), target=Target("cuda", arch), backend=backend)
    assert ".entry" in compiled.get_source("ptx")


@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_eager_data_views_compile(backend):
    kernel = eager_flat_sum.compile(R=4, C=16, F=64, target="cuda:90", backend=backend)
    assert ".entry" in kernel.get_source("ptx")


def test_3d_reshape_reduce_compiles_through_auto():
    """Gluon has no 3-D tile reduction (a CompileError naming it): backend="auto" takes triton."""
    func = reduce_absmax_after_reshape_3d.fn(2, 512, 4, "int64")
    with pytest.raises(tritile.CompileError, match="T.reduce_absmax over a 3-D tile"):
        tritile.compile(func, target=Target("cuda", 90), backend="gluon").get_source("ptx")
    kernel = tritile.compile(func, target=Target("cuda", 90), backend="auto")
    assert ".entry" in kernel.get_source("ptx")
    assert "tl.reshape" in kernel.get_kernel_source()


def test_view_bits_mismatch_is_a_compile_error():
    """TileLang's test_reshape_shape_mismatch / test_view_shape_mismatch (an AssertionError there)."""

    with pytest.raises(tritile.CompileError, match=r"test_kernels_reshape.py:\d+: T.reshape: shape check failed"):
        @T.prim_func
        def main(A: T.Tensor((1024,), "float32"), B: T.Tensor((32, 33), "float32")):
            with T.Kernel(1) as _:
                A_reshaped = T.reshape(A, [32, 33])
                T.copy(A_reshaped, B)

    with pytest.raises(tritile.CompileError, match="shape check failed"):
        @T.prim_func
        def main2(A: T.Tensor((1024,), "float32"), B: T.Tensor((32, 32), "float16")):
            with T.Kernel(1) as _:
                T.copy(T.view(A, [32, 32], dtype="float16"), B)


def test_bad_views_are_compile_errors():
    """Each a CompileError at the user's line naming the construct."""
    n = T.dynamic("n")
    with pytest.raises(tritile.CompileError, match=r"test_kernels_reshape.py:\d+: T.reshape: v is a scalar variable"):
        @T.prim_func
        def scalar(A: T.Tensor((64,), "float32")):
            with T.Kernel(1, threads=128) as _:
                v = T.alloc_var("float32")
                T.reshape(v, (1,))
    with pytest.raises(tritile.CompileError, match=r"T.view: .*float17"):
        @T.prim_func
        def bad_dtype(A: T.Tensor((64,), "float32")):
            with T.Kernel(1, threads=128) as _:
                T.view(A, (8, 8), dtype="float17")
    with pytest.raises(tritile.CompileError, match=r"T.Tensor\(shape, dtype, data\): data must be a buffer's storage"):
        @T.prim_func
        def not_storage(A: T.Tensor((64,), "float32")):
            with T.Kernel(1, threads=128) as _:
                T.Tensor((64,), "float32", A)
    with pytest.raises(tritile.CompileError, match=r"T.reshape: a view of on-chip buffer .* compile-time shape"):
        @T.prim_func
        def runtime_shape(A: T.Tensor((n,), "float32")):
            with T.Kernel(1, threads=128) as _:
                T.reshape(T.alloc_shared((8, 8), "float32"), (n,))
    with pytest.raises(tritile.CompileError, match=r"T.alloc_buffer\(strides=...\)"):
        @T.prim_func
        def strided(A: T.Tensor((64,), "float32")):
            with T.Kernel(1, threads=128) as _:
                T.alloc_buffer((64,), "float32", data=A.data, strides=(1,))


@T.prim_func
def shared_bits_view(A: T.Tensor((16, 32), "float32"), B: T.Tensor((16, 64), "float16")):
    with T.Kernel(1, threads=128) as _:
        A_shared = T.alloc_shared((16, 32), "float32")
        A_half = T.view(A_shared, (16, 64), dtype="float16")
        T.copy(A, A_shared)
        T.copy(A_half, B)


def test_on_chip_dtype_view_runs_on_the_interpreter_only():
    """TileLang's shared_reinterpret_view: the interpreter reinterprets the shared bytes; the
    backends cannot and say so at the view's line."""
    want = torch.randn(16, 64).half()  # the float32s hold the bits of two valid halves each
    b = torch.empty(16, 64, dtype=torch.float16)
    tritile.compile(shared_bits_view, target="cpu", backend="gluon")(want.view(torch.float32), b)
    assert torch.equal(b, want)
    for backend in ("gluon", "triton", "auto"):
        with pytest.raises(tritile.CompileError, match=r"T.view of shared buffer A_shared as float16"):
            tritile.compile(shared_bits_view, target=Target("cuda", 90), backend=backend).get_source("ptx")
