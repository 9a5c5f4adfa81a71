"""TileLang's dtypes in tritile: a `T` dtype is a string (`str`, comparisons, hashing,
`getattr(torch, dtype)`), has `.as_torch()`, and TileLang's extra names exist; kernels take
the string and `T` spellings alike.  Also `tritile.language.fp8` and `T.reduce_*` over a
`[1, N]` fragment (TileLang counts the unit dimension)."""
import pytest
import torch

import tritile
import tritile.language as T
from tritile.ir.dtypes import truncate_to_tf32
from tritile.language.fp8 import determine_fp8_type, determine_torch_fp8_type


@pytest.mark.parametrize("dtype,name,torch_dtype", [
    (T.float16, "float16", torch.float16), (T.bfloat16, "bfloat16", torch.bfloat16),
    (T.float, "float32", torch.float32), (T.float32, "float32", torch.float32),
    (T.float8_e4m3fn, "float8_e4m3fn", torch.float8_e4m3fn), (T.float8_e5m2, "float8_e5m2", torch.float8_e5m2),
    (T.float8_e8m0fnu, "float8_e8m0fnu", torch.float8_e8m0fnu), (T.int8, "int8", torch.int8),
    (T.bool, "bool", torch.bool),
])
def test_dtype_is_its_string(dtype, name, torch_dtype):
    assert str(dtype) == name and dtype == name and name == dtype
    assert hash(dtype) == hash(name) and {dtype: 1}[name] == 1 and {name: 2}[dtype] == 2
    assert getattr(torch, dtype) is torch_dtype
    assert dtype.as_torch() is torch_dtype
    assert T.dtype(name) is dtype and T.dtype(torch_dtype) is dtype


def test_dtype_names_of_tilelang():
    assert T.tfloat32 == "tfloat32" and T.tfloat32.bits == 32
    assert T.float32x2 == "float32x2" and T.float32x2.lanes == 2 and T.float16x8.bytes == 16
    assert T.float32 in T.dtypes and T.float16 in T.dtypes
    assert T.dtype(float) is T.float32 and T.dtype(int) is T.int32
    assert T.float16 != T.bfloat16 and T.float16 != "float32"



def test_tvm_c_style_and_sub_byte_dtype_names():
    """TVM's `T.int` / `T.uint` / `T.half` / ... (TileLang's dtypes.py), and the sub-byte names its
    programs put in annotations and tables (`Literal[T.float16, T.int8, T.int4]`), which no buffer
    stores yet."""
    assert (T.int, T.uint, T.short, T.long, T.ulong, T.half, T.double) == (
        T.int32, T.uint32, T.int16, T.int64, T.uint64, T.float16, T.float64)
    assert T.dtype("uint") is T.uint32 and T.dtype("short") is T.int16
    assert T.int4.bits == 4 and T.uint4 == "uint4" and T.dtype("int4") is T.int4
    assert T.max(2, 3) == 3  # folding checks isinstance(v, int): the builtin is not shadowed in T
    with pytest.raises(tritile.CompileError, match="int4 \\(two values a byte\\) is not supported"):
        @T.prim_func
        def packed(A: T.Tensor((16,), T.int8)):
            with T.Kernel(1, threads=32) as bx:
                v = T.alloc_fragment((16,), T.int4)


def test_fp8_choice():
    assert determine_fp8_type() == "float8_e4m3fn" and determine_fp8_type("e5m2") == "float8_e5m2"
    assert determine_torch_fp8_type() is torch.float8_e4m3fn
    with pytest.raises(ValueError):
        determine_fp8_type("e3m4")


@tritile.jit(out_idx=[-1])
def _scale_rows(M, N, dtype):
    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype)):
        with T.Kernel(M, threads=128) as bx:
            row = T.alloc_fragment((1, N), T.float)
            total = T.alloc_fragment((1,), T.float)
            T.copy(A[bx, 0], row)
            T.reduce_sum(row, total, dim=1)
            for i, j in T.Parallel(1, N):
                row[i, j] = row[i, j] / total[0]
            T.copy(row, B[bx, 0])

    return main


@pytest.mark.parametrize("dtype", ["float32", T.float, T.float16])
def test_string_and_T_dtypes_in_a_kernel_and_unit_dim_reduce(dtype):
    a = torch.rand(8, 64, dtype=getattr(torch, dtype)) + 0.5
    b = _scale_rows(8, 64, dtype)(a)
    ref = (a.float() / a.float().sum(dim=1, keepdim=True)).to(a.dtype)
    torch.testing.assert_close(b, ref, rtol=1e-2 if dtype == T.float16 else 1e-5, atol=1e-3)


def test_reduce_over_a_unit_dim_is_an_error():
    with pytest.raises(tritile.CompileError, match="extent 1"):
        @T.prim_func
        def bad(A: T.Tensor((4, 8), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                row = T.alloc_fragment((1, 8), T.float32)
                out = T.alloc_fragment((8,), T.float32)
                T.copy(A[0, 0], row)
                T.reduce_max(row, out, dim=0)


def test_tfloat32_buffers_store_float32_and_vector_dtypes_are_rejected():
    @T.prim_func
    def main(A: T.Tensor((16, 16), T.tfloat32), B: T.Tensor((16, 16), T.tfloat32), C: T.Tensor((16, 16), T.float)):
        with T.Kernel(1, threads=128) as bx:
            a = T.alloc_shared((16, 16), T.tfloat32)
            b = T.alloc_shared((16, 16), T.tfloat32)
            c = T.alloc_fragment((16, 16), T.float)
            T.copy(A[0, 0], a)
            T.copy(B[0, 0], b)
            T.gemm(a, b, c, clear_accum=True)
            T.copy(c, C[0, 0])

    kernel = tritile.compile(main, out_idx=[2])
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    tf32 = truncate_to_tf32  # the gemm reads its tfloat32 operands as the tensor cores do
    torch.testing.assert_close(kernel(a, b), tf32(a) @ tf32(b), rtol=1e-4, atol=1e-4)
    with pytest.raises(tritile.CompileError, match="vector dtype float32x2"):
        @T.prim_func
        def vec(A: T.Tensor((16,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                v = T.alloc_fragment((8,), T.float32x2)


@pytest.mark.parametrize("dtype,value,side", [(T.float32, 1e300, "maximum"), (T.float16, -70000.0, "minimum"),
                                              (T.bfloat16, 1e39, "maximum")])
def test_float_literal_beyond_the_type_is_a_ValueError(dtype, value, side):
    with pytest.raises(ValueError, match=f"exceeds {side} of {dtype}") as err:
        @T.prim_func
        def kernel(A: T.Tensor((1,), dtype)):
            with T.Kernel(1):
                v = T.alloc_var(dtype, init=value)
                A[0] = v
    assert isinstance(err.value, tritile.CompileError)


def test_float_literals_in_range_and_infinities_are_kept():
    @T.prim_func
    def kernel(A: T.Tensor((3,), T.float32), B: T.Tensor((3,), T.float64)):
        with T.Kernel(1):
            big = T.alloc_var(T.float64, init=1e300)
            A[0] = 3.0e38
            A[1] = -T.infinity(T.float32)
            A[2] = float("inf")
            B[0] = big
            B[1] = B[0] * 0.5
            B[2] = -1e300

    a, b = torch.randn(3), torch.randn(3, dtype=torch.float64)
    tritile.compile(kernel)(a, b)
    torch.testing.assert_close(a, torch.tensor([3.0e38, -float("inf"), float("inf")]))
    torch.testing.assert_close(b, torch.tensor([1e300, 5e299, -1e300], dtype=torch.float64))


@tritile.jit(out_idx=-1)
def _fill_with_infinity(dtype):
    @T.prim_func
    def main(A: T.Tensor((32,), dtype)):
        with T.Kernel(1, threads=32):
            T.fill(A, T.infinity(dtype))

    return main


@pytest.mark.parametrize("dtype", [T.float16, T.bfloat16, T.float32, T.float64, T.float8_e5m2])
def test_fill_of_a_global_output_with_infinity(dtype):
    """TileLang's test_tilelang_language_infinity: fp8 has no literal, its infinity is its byte."""
    out = _fill_with_infinity(dtype)()
    assert out.dtype == dtype.as_torch() and out.shape == (32,)
    assert torch.all(out.float() == float("inf"))
    assert "tl.float8e5" in _fill_with_infinity(dtype).get_source("triton") or dtype.bits > 8


@pytest.mark.parametrize("dtype", [T.float16, T.float8_e5m2])
def test_infinity_stays_infinite_in_the_generated_code(dtype):
    """The folded constant of `T.infinity(T.float8_e5m2)` was saturated to 57344 as a cast's
    result would be (only the GPU saw it); Triton's interpreter runs the triton backend's code."""
    out = tritile.compile(_fill_with_infinity(dtype).func, backend="triton")()
    assert torch.all(out.float() == float("inf"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [T.float16, T.float32, T.float8_e5m2])
def test_fill_of_a_global_output_with_infinity_on_the_gpu(dtype):
    out = _fill_with_infinity(dtype)()
    assert out.is_cuda and torch.all(out.float() == float("inf"))
