"""Mistakes that used to be accepted without a word: each is a `CompileError` quoting this
file and the offending line, or, for call arguments, a `TypeError` / `ValueError` naming the
argument before anything runs.  An empty runtime grid (a T.dynamic batch of 0) runs nothing."""
import inspect
import sys

import pytest
import torch

import tritile
import tritile.language as T
from kernels import compile_error
from tritile.frontend.parser import MACRO_DEPTH




def test_negative_num_stages():
    def build():
        @T.prim_func
        def f(A: T.Tensor((64, 32), T.float16)):
            with T.Kernel(1):
                s = T.alloc_shared((16, 32), T.float16)
                for k in T.Pipelined(4, num_stages=-3):
                    T.copy(A[k * 16, 0], s)

    message = compile_error(build)
    assert "num_stages=-3" in message and "T.Pipelined(4, num_stages=-3)" in message


@pytest.mark.parametrize("threads, why", [(0, "1 to 1024"), (-32, "1 to 1024"), (2048, "1 to 1024"),
                                          (33, "not a multiple of 32"), (100, "use 96 or 128")])
def test_bad_thread_counts(threads, why):
    def build():
        @T.prim_func
        def f(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1, threads=threads):
                T.fill(A[0:64], 0.0)

    message = compile_error(build)
    assert why in message and "with T.Kernel(1, threads=threads):" in message


def test_fewer_than_one_warp_runs_as_one_warp(assert_close):
    @T.prim_func
    def f(A: T.Tensor((64,), T.float32), B: T.Tensor((64,), T.float32)):
        with T.Kernel(1, threads=1):
            for i in T.serial(64):
                B[i] = A[i] + 1.0

    a = torch.randn(64)
    assert_close(tritile.compile(f, out_idx=-1, target="cpu")(a), a + 1.0)


def test_empty_compile_time_grid():
    def build():
        @T.prim_func
        def f(A: T.Tensor((64,), T.float32)):
            with T.Kernel(T.ceildiv(0, 16), 2):
                T.fill(A[0:64], 0.0)

    message = compile_error(build)
    assert "grid extent 0 is 0" in message and "with T.Kernel(T.ceildiv(0, 16), 2):" in message


@pytest.fixture(scope="module")
def shifted_rows():
    """Grid extent m - 16: negative for m < 16, zero for m == 16."""
    m = T.dynamic("m")

    @T.prim_func
    def f(A: T.Tensor((m, 8), T.float32), B: T.Tensor((m, 8), T.float32)):
        with T.Kernel(m - 16) as bx:
            for j in T.Parallel(8):
                B[bx + 16, j] = A[bx + 16, j] * 3.0

    return tritile.compile(f, target="cpu")


def test_negative_runtime_grid_names_the_argument(shifted_rows):
    with pytest.raises(ValueError, match=r"grid extent 0 of T.Kernel, m - 16, is -6 with m = 10 \(argument 'A' "
                                         r"\(param 0\), dim 0\)"):
        shifted_rows(torch.randn(10, 8), torch.zeros(10, 8))


def test_empty_runtime_grid_runs_nothing(shifted_rows):
    b = torch.randn(16, 8)
    before = b.clone()
    shifted_rows(torch.randn(16, 8), b)
    assert torch.equal(b, before)  # no block ran
    a, b = torch.randn(20, 8), torch.zeros(20, 8)
    shifted_rows(a, b)  # the same kernel still runs a non-empty grid
    assert torch.equal(b[16:], a[16:] * 3.0) and not b[:16].any()


def test_python_print_in_a_kernel():
    def build():
        @T.prim_func
        def f(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1):
                print(A[0])

    message = compile_error(build)
    assert "use T.print" in message and "print(A[0])" in message


@T.macro
def forever(buf, i):
    forever(buf, i + 1)


@T.macro
def unroll_to(buf, n):
    if n > 0:
        buf[n - 1] = buf[n - 1] + 1.0
        unroll_to(buf, n - 1)


def test_recursive_macro_is_a_compile_error():
    def build():
        @T.prim_func
        def f(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1):
                forever(A, 0)

    message = compile_error(build)
    assert f"macro forever is inlined {MACRO_DEPTH} levels deep" in message
    assert "forever(buf, i + 1)" in message


def test_macro_nesting_past_pythons_stack_is_a_compile_error():
    limit = sys.getrecursionlimit()

    def build():
        @T.prim_func
        def f(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1):
                unroll_to(A, 30)

    sys.setrecursionlimit(len(inspect.stack()) + 250)  # room for fewer than 30 nested macros
    try:
        message = compile_error(build)
    finally:
        sys.setrecursionlimit(limit)
    assert "macro unroll_to: inlining nests deeper than Python's recursion limit" in message
    assert "unroll_to(buf, n - 1)" in message


def test_recursion_with_a_compile_time_end_still_works(assert_close):
    @T.prim_func
    def f(A: T.Tensor((8,), T.float32)):
        with T.Kernel(1):
            unroll_to(A, 8)

    a = torch.randn(8)
    expected = a + 1.0
    tritile.compile(f, target="cpu")(a)
    assert_close(a, expected)


@pytest.fixture(scope="module")
def cuda_add():
    n = T.dynamic("n")

    @T.prim_func
    def add(A: T.Tensor((n,), T.float32), B: T.Tensor((n,), T.float32)):
        with T.Kernel(T.ceildiv(n, 128)) as bx:
            for i in T.Parallel(128):
                B[bx * 128 + i] = A[bx * 128 + i] + 1.0

    return tritile.compile(add, out_idx=[-1], target="cuda:90")


def test_meta_tensors_name_the_argument(cuda_add):
    with pytest.raises(TypeError, match=r"argument 'A' \(param 0\): a tensor on device 'meta'"):
        cuda_add(torch.empty(256, device="meta"))


def test_tensor_too_large_for_int32_offsets(cuda_add, assert_close):
    huge = torch.zeros((), dtype=torch.float32).expand(2 ** 31 + 1)  # one element of storage
    with pytest.raises(ValueError, match=r"argument 'A' \(param 0\): 2147483649 elements .* int32"):
        cuda_add(huge)
    a = torch.randn(300)
    assert_close(cuda_add(a), a + 1.0)  # CPU tensors of a CUDA-target kernel: the interpreter
