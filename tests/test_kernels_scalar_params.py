"""Runtime scalar kernel parameters (`valid_len: T.int32`, `alpha: T.float32`, `T.int64`, `T.bool`).

A parameter annotated with a dtype is an argument of the kernel, passed at each call as a Python
number or a 0-d tensor (one compiled kernel for every value): in the lazy style's
`@T.prim_func` signature, and in the eager style in the signature or as a bare `x: T.int32` in
the body.  The kernels use the scalars in expressions, loop extents, conditions, grid extents
and `T.Parallel` extents known only at run time (TileLang's `T.Parallel(T.min(valid_len, n))`,
its test_tilelang_language_parallel.py); `out_idx` counts the scalars among the parameters.
On the `device` fixture's tensors (CPU: the reference interpreter, or Triton's interpreter of
the generated kernel with TRITILE_BACKEND=triton; CUDA: the GPU kernel) against torch; the
compile checks look at the Gluon and triton.language kernels' signatures on the CPU.
"""
import pytest
import torch

import tritile
import tritile.language as T


@tritile.jit(out_idx=[1])
def parallel_dynamic(max_len=512, threads=256, dtype=T.float32):
    @T.prim_func
    def main(A: T.Tensor((max_len,), dtype), B: T.Tensor((max_len,), dtype), valid_len: T.int32):
        with T.Kernel(1, threads=threads) as _:
            for i in T.Parallel(max_len):
                B[i] = 0.0
            span = T.min(valid_len, max_len)
            for i in T.Parallel(span):
                B[i] = A[i] - 1.0

    return main


@pytest.mark.parametrize("valid_len", [0, 13, 200, 600, -5])
def test_parallel_extent_from_a_scalar(device, assert_close, valid_len):
    """TileLang's test_parallel_dynamic_extent: T.Parallel over min(valid_len, 512)."""
    a = torch.randn(512, device=device)
    expected = torch.zeros_like(a)
    clip = max(min(valid_len, 512), 0)
    expected[:clip] = a[:clip] - 1.0
    assert_close(parallel_dynamic()(a, valid_len), expected)


@tritile.jit(out_idx=[2])
def scale_prefix(N, block, dtype=T.float32):
    """C[i] = alpha * A[i] + shift for i < n (C's other elements: -1), grid from n."""

    @T.prim_func
    def main(A: T.Tensor((N,), dtype), n: T.int32, C: T.Tensor((N,), dtype), alpha: T.float32,
             shift: T.int64, negate: T.bool):
        with T.Kernel(T.ceildiv(n, block), threads=128) as bx:
            for i in T.Parallel(block):
                row = bx * block + i
                if row < n:
                    value = alpha * A[row] + T.cast(shift, dtype)
                    if negate:
                        C[row] = -value
                    else:
                        C[row] = value

    return main


@pytest.mark.parametrize("n, alpha, shift, negate", [(100, 0.5, 3, False), (256, -2.25, -(2 ** 33), True),
                                                      (1, 3, 0, 1)])
def test_float_int64_bool_scalars(device, assert_close, n, alpha, shift, negate):
    """Scalars in a grid extent, a condition, arithmetic (float32, int64 past 2**32), a branch."""
    N = 256
    a = torch.randn(N, device=device)
    kernel = scale_prefix(N, 64)
    c = kernel(a, n, alpha, shift, negate)
    expected = torch.empty(N, device=device)
    value = (float(alpha) * a[:n] + float(shift))
    expected[:n] = -value if negate else value
    assert_close(c[:n], expected[:n])


def test_scalars_as_zero_dim_tensors(device, assert_close):
    a = torch.randn(256, device=device)
    kernel = scale_prefix(256, 64)
    c = kernel(a, torch.tensor(200), torch.tensor(1.5), torch.tensor(2, dtype=torch.int64), torch.tensor(False))
    assert_close(c[:200], 1.5 * a[:200] + 2.0)


@tritile.jit(out_idx=[-1])
def row_prefix_sum(M, N, threads=128):
    """Out[r] = sum of A[r, :k]: a serial loop whose extent is the scalar k."""

    @T.prim_func
    def main(A: T.Tensor((M, N), T.float32), k: T.int32, Out: T.Tensor((M,), T.float32)):
        with T.Kernel(M, threads=threads) as r:
            acc = T.alloc_var(T.float32, init=0.0)
            for j in T.serial(k):
                acc += A[r, j]
            Out[r] = acc

    return main


@pytest.mark.parametrize("k", [0, 1, 17, 32])
def test_loop_extent_from_a_scalar(device, assert_close, k):
    a = torch.randn(8, 32, device=device)
    assert_close(row_prefix_sum(8, 32)(a, k), a[:, :k].sum(dim=1))


@tritile.jit(out_idx=[-1])
def unbounded_parallel(N, threads=64):
    """T.Parallel(n) with nothing bounding n at compile time: chunks of the kernel's threads."""

    @T.prim_func
    def main(A: T.Tensor((N,), T.float32), n: T.int32, B: T.Tensor((N,), T.float32)):
        with T.Kernel(1, threads=threads) as _:
            for i in T.Parallel(N):
                B[i] = 0.0
            for i in T.Parallel(n):
                B[i] = A[i] * 2.0

    return main


@pytest.mark.parametrize("n", [0, 5, 64, 150, 300])
def test_parallel_extent_without_a_bound(device, assert_close, n):
    a = torch.randn(300, device=device)
    expected = torch.zeros_like(a)
    expected[:n] = a[:n] * 2.0
    assert_close(unbounded_parallel(300)(a, n), expected)


def test_unbounded_parallel_is_a_chunk_loop():
    text = unbounded_parallel(300).get_source("tile")
    assert "for i_chunk in T.serial(0, (n + 63) // 64):" in text
    assert "if i_chunk * 64 + i < n:" in text


@tritile.jit
def eager_axpy(X, Y, alpha: T.float32, count, block: int = 64):
    N = T.const("N")
    X: T.Tensor[[N], T.float32]
    Y: T.Tensor[[N], T.float32]
    count: T.int32
    Z = T.empty((N,), T.float32)
    with T.Kernel(T.ceildiv(N, block), threads=64) as bx:
        for i in T.Parallel(block):
            if bx * block + i < count:
                Z[bx * block + i] = alpha * X[bx * block + i] + Y[bx * block + i]
            else:
                Z[bx * block + i] = 0.0
    return Z


def test_eager_style_scalars(device, assert_close):
    """`alpha: T.float32` in the signature, `count: T.int32` in the body: one kernel for all values."""
    x, y = torch.randn(128, device=device), torch.randn(128, device=device)
    eager_axpy.cache_clear()
    for alpha, count in ((2.0, 128), (-0.5, 70), (3, 0)):
        expected = alpha * x + y
        expected[count:] = 0.0
        assert_close(eager_axpy(x, y, alpha, count), expected)
    assert eager_axpy(x, y, alpha=1.0, count=5)[5:].abs().sum() == 0
    assert eager_axpy.cache_info().misses == 1


def test_eager_style_scalar_type_errors():
    x, y = torch.randn(128), torch.randn(128)
    with pytest.raises(TypeError, match=r"argument 'count' \(param 3\).*takes an int, got float"):
        eager_axpy(x, y, 1.0, 2.5)
    with pytest.raises(TypeError, match=r"argument 'alpha' \(param 2\).*takes a float or int, got str"):
        eager_axpy(x, y, "1", 2)


def test_signature_and_out_idx_count_scalars():
    kernel = scale_prefix(256, 64)
    text = kernel.get_source("tile")
    assert ("def main(A: T.Tensor([256], float32), n: T.int32, C: T.Tensor([256], float32), alpha: T.float32, "
            "shift: T.int64, negate: T.bool):") in text
    assert kernel.out_idx == [1]  # out_idx=[2] of the call's parameters is the second tensor
    a = torch.randn(256)
    c = torch.full((256,), 7.0)
    assert kernel(a, 256, c, 1.0, 0, False) is c  # every parameter passed, the output included
    torch.testing.assert_close(c, a)


def test_out_idx_naming_a_scalar_is_a_value_error():
    with pytest.raises(ValueError, match="out_idx entry 1 names the scalar parameter 'n'"):
        tritile.compile(scale_prefix.fn(256, 64), out_idx=[1])


@pytest.mark.parametrize("args, error, message", [
    ((1.5, 1.0, 0, False), TypeError, r"argument 'n' \(param 1\).*n: int32 takes an int, got float 1.5"),
    ((True, 1.0, 0, False), TypeError, r"argument 'n' \(param 1\).*takes an int, got bool"),
    ((8, "x", 0, False), TypeError, r"argument 'alpha' \(param 3\).*takes a float or int, got str"),
    ((8, 1.0, 0, 0.5), TypeError, r"argument 'negate' \(param 5\).*takes a bool, got float"),
    ((8, 1.0, torch.zeros(2), False), TypeError, r"argument 'shift' \(param 4\).*0-d tensor, got a tensor of "
                                                 r"shape \[2\]"),
    ((2 ** 31, 1.0, 0, False), ValueError, r"argument 'n' \(param 1\): 2147483648 is outside the range of int32"),
])
def test_scalar_argument_errors(args, error, message):
    kernel = scale_prefix(256, 64)
    with pytest.raises(error, match=message):
        kernel(torch.randn(256), *args)


def test_wrong_argument_count_names_scalars():
    with pytest.raises(TypeError, match=r"main\(\) expected 5 arguments \(A, n, alpha, shift, negate\), got 2"):
        scale_prefix(256, 64)(torch.randn(256), 3)


def test_tensor_errors_count_scalars_in_positions():
    with pytest.raises(TypeError, match=r"argument 'A' \(param 0\): expected dtype float32"):
        parallel_dynamic()(torch.randn(512, dtype=torch.float16), 3)
    with pytest.raises(TypeError, match=r"argument 'C' \(param 2\): expected dtype float32"):
        scale_prefix(256, 64)(torch.randn(256), 3, torch.zeros(256, dtype=torch.float16), 1.0, 0, False)


def test_unsupported_scalar_dtype_is_a_compile_error():
    def program():
        @T.prim_func
        def main(A: T.Tensor((16,), T.float32), s: T.float8_e4m3fn):
            with T.Kernel(1, threads=32) as _:
                for i in T.Parallel(16):
                    A[i] = 0.0

        return main

    with pytest.raises(tritile.CompileError, match="scalar parameter s: float8_e4m3fn is not a scalar parameter "
                                                   "type") as info:
        program()
    assert "test_kernels_scalar_params.py" in str(info.value)


def test_float_scalar_rounds_to_its_dtype():
    """A float16 parameter receives the float16 nearest the Python value, as on the GPU."""

    @tritile.jit(out_idx=[-1])
    def fill_value():
        @T.prim_func
        def main(x: T.float16, B: T.Tensor((32,), T.float32)):
            with T.Kernel(1, threads=32) as _:
                for i in T.Parallel(32):
                    B[i] = T.cast(x, T.float32)

        return main

    out = fill_value()(0.1)
    assert out.device.type in ("cpu", "cuda")
    assert out[0].item() == torch.tensor(0.1, dtype=torch.float16).float().item()


def test_generated_kernels_take_typed_scalars(gluon_backend):
    kernel = scale_prefix(256, 64)
    gluon = kernel.get_source("gluon")
    assert "def main(A, C, n, alpha, shift, negate):" in gluon
    assert "launch(((((n + 64) - 1) // 64), 1, 1)" in gluon
    ptx = kernel.get_source("ptx")
    assert ".param .f32 main_param_3" in ptx and ".param .u64 main_param_4" in ptx
    ttir = tritile.compile(scale_prefix.fn(256, 64), out_idx=[2], backend="triton").get_source("ttir")
    for arg in ("%n: i32", "%alpha: f32", "%shift: i64", "%negate: i1"):
        assert arg in ttir, arg


@pytest.mark.gpu
def test_scalar_params_on_the_gpu_with_both_backends(assert_close):
    a = torch.randn(256, device="cuda")
    for backend in ("gluon", "triton"):
        kernel = tritile.compile(scale_prefix.fn(256, 64), out_idx=[2], backend=backend)
        c = kernel(a, 100, 0.5, 3, True)
        assert_close(c[:100], -(0.5 * a[:100] + 3.0))
        out = tritile.compile(parallel_dynamic.fn(), out_idx=[1], backend=backend)(a.repeat(2), 13)
        expected = torch.zeros(512, device="cuda")
        expected[:13] = a[:13] - 1.0
        assert_close(out, expected)
