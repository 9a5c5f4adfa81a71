"""User mistakes -> CompileError quoting this file and the offending line; bad call
arguments -> TypeError / ValueError naming the argument, before anything runs."""
import pytest
import torch

import tritile
import tritile.language as T
from kernels import compile_error




def test_unknown_name():
    def build():
        @T.prim_func
        def f(A: T.Tensor((64,), "float32")):
            with T.Kernel(1):
                A_s = T.alloc_shared((64,), "float32")
                T.copy(A, A_shared_typo)  # noqa: F821

    message = compile_error(build)
    assert "unknown name 'A_shared_typo'" in message and "T.copy(A, A_shared_typo)" in message


def test_copy_shape_mismatch():
    def build():
        @T.prim_func
        def f(A: T.Tensor((128, 64), "float16")):
            with T.Kernel(1):
                A_shared = T.alloc_shared((64, 32), "float16")
                T.copy(A[0:64, 0:64], A_shared)

    message = compile_error(build)
    assert "T.copy shape mismatch" in message and "T.copy(A[0:64, 0:64], A_shared)" in message


def test_gemm_shape_mismatch():
    def build():
        @T.prim_func
        def f(A: T.Tensor((64, 64), "float16")):
            with T.Kernel(1):
                a = T.alloc_shared((64, 32), "float16")
                b = T.alloc_shared((64, 64), "float16")
                c = T.alloc_fragment((64, 64), "float32")
                T.gemm(a, b, c)

    message = compile_error(build)
    assert "T.gemm shape mismatch" in message and "T.gemm(a, b, c)" in message


def test_bad_arity_or_keyword():
    def missing_argument():
        @T.prim_func
        def f(A: T.Tensor((64,), "float32")):
            with T.Kernel(1):
                buf = T.alloc_fragment((64,), "float32")
                T.fill(buf)

    def unknown_keyword():
        @T.prim_func
        def f(A: T.Tensor((64,), "float32")):
            with T.Kernel(1):
                buf = T.alloc_fragment((64,), "float32")
                T.copy(A, buf, bogus=1)

    message = compile_error(missing_argument)
    assert "T.fill: missing a required argument: 'value'" in message and "T.fill(buf)" in message
    message = compile_error(unknown_keyword)
    assert "unexpected keyword argument 'bogus'" in message and "T.copy(A, buf, bogus=1)" in message


def test_constant_index_out_of_range():
    def build():
        @T.prim_func
        def f(A: T.Tensor((64,), "float32")):
            with T.Kernel(1):
                buf = T.alloc_fragment((16,), "float32")
                buf[16] = A[0]

    message = compile_error(build)
    assert "out of range" in message and "buf[16] = A[0]" in message


def test_unsupported_syntax():
    def build():
        @T.prim_func
        def f(A: T.Tensor((64,), "float32")):
            with T.Kernel(1):
                for i in T.serial(64):
                    try:
                        A[i] = 1.0
                    except Exception:
                        pass

    message = compile_error(build)
    assert "unsupported Python syntax" in message and "try:" in message


def test_reduce_output_shape():
    def build():
        @T.prim_func
        def f(A: T.Tensor((64, 32), "float32")):
            with T.Kernel(1):
                x = T.alloc_fragment((64, 32), "float32")
                out = T.alloc_fragment((32,), "float32")
                T.reduce_sum(x, out, dim=1)

    message = compile_error(build)
    assert "expected [64]" in message and "T.reduce_sum(x, out, dim=1)" in message


def test_gemm_accumulator_must_be_fragment():
    def build():
        @T.prim_func
        def f(A: T.Tensor((64, 64), "float16")):
            with T.Kernel(1):
                a = T.alloc_shared((64, 64), "float16")
                c = T.alloc_shared((64, 64), "float32")
                T.gemm(a, a, c)

    assert "must be a fragment" in compile_error(build)


def test_t_function_outside_a_kernel_is_a_clear_error():
    with pytest.raises(RuntimeError, match="only be used inside a kernel"):
        T.copy(None, None)
    assert T.ceildiv(10, 4) == 3  # pure arithmetic still folds on Python numbers


# --------------------------------------------------------------------------------------
# call-time argument checks
# --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def add_kernel():
    m = T.dynamic("m")

    @T.prim_func
    def add(A: T.Tensor((m, 32), "float16"), B: T.Tensor((m, 32), "float16"), C: T.Tensor((m, 32), "float16")):
        with T.Kernel(T.ceildiv(m, 16)) as bx:
            for i, j in T.Parallel(16, 32):
                C[bx * 16 + i, j] = A[bx * 16 + i, j] + B[bx * 16 + i, j]

    return tritile.compile(add, out_idx=[-1], target="cpu")


def _half(*shape):
    return torch.randn(*shape, dtype=torch.float16)


def test_wrong_dtype_names_the_argument(add_kernel):
    with pytest.raises(TypeError, match=r"argument 'B' \(param 1\): expected dtype float16, got float32"):
        add_kernel(_half(48, 32), torch.randn(48, 32))


def test_not_a_tensor(add_kernel):
    with pytest.raises(TypeError, match="argument 'A' .*expected a torch.Tensor, got list"):
        add_kernel([1.0], _half(48, 32))


def test_wrong_count(add_kernel):
    with pytest.raises(TypeError, match="expected 2"):
        add_kernel(_half(48, 32))


def test_wrong_rank_and_static_dim(add_kernel):
    with pytest.raises(ValueError, match="argument 'A' .*2-D"):
        add_kernel(_half(48), _half(48, 32))
    with pytest.raises(ValueError, match="argument 'B' .*dimension 1 must be 32"):
        add_kernel(_half(48, 32), _half(48, 16))


def test_inconsistent_dynamic_dim(add_kernel):
    with pytest.raises(ValueError, match="argument 'B' .*dynamic size 'm' = 48"):
        add_kernel(_half(48, 32), _half(64, 32))


def test_non_contiguous_inputs_are_copied_outputs_rejected(add_kernel, assert_close):
    a = _half(32, 48).t()[:, :32]  # non-contiguous view of shape (48, 32)
    b = _half(48, 32)
    assert_close(add_kernel(a, b), a + b)
    with pytest.raises(ValueError, match="argument 'C' .*contiguous"):
        add_kernel(a, b, _half(32, 48).t()[:, :32])
