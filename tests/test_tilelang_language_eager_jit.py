"""TileLang's eager-JIT tutorial (examples/eager_jit/eagerjit.en.ipynb) on tritile: the forms of
`@tilelang.jit` it teaches, each a small kernel run through the CPU interpreter against torch."""
import pytest
import torch

import tritile
import tritile.language as T
from tritile.runtime.jit import EagerJIT, LazyJIT


@T.macro
def _add_rows(A, B, C, M, N, block_M):
    with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
        for i, j in T.Parallel(block_M, N):
            C[bx * block_M + i, j] = A[bx * block_M + i, j] * 2 + B[bx * block_M + i, j]


def test_eager_body_whose_kernel_is_in_a_macro():
    """The body annotates its tensors and calls a macro holding the `with T.Kernel`: eager (TileLang
    decides by running it; tritile by the T.const / T.empty / tensor annotations of the body)."""

    @tritile.jit
    def dyn(A, B):
        M, N = T.dynamic("M, N")
        A: T.Tensor[[M, N], T.float32]
        B: T.Tensor[[M, N], T.float32]
        C = T.empty((M, N), T.float32)
        _add_rows(A, B, C, M, N, 16)
        return C

    @tritile.jit
    def consts(A, B):
        M, N = T.const("M, N")
        A: T.Tensor[[M, N], T.float32]
        B: T.Tensor[[M, N], T.float32]
        C = T.empty((M, N), T.float32)
        _add_rows(A, B, C, M, N, 16)
        return C

    @tritile.jit
    def params_as_dims(A, B, M, N):  # the parameters in the annotations: compile-time constants
        A: T.Tensor[[M, N], T.float32]
        B: T.Tensor[[M, N], T.float32]
        C = T.empty((M, N), T.float32)
        _add_rows(A, B, C, M, N, block_M=16)
        return C

    @tritile.jit
    def runtime_dims(A, B, M, N):  # ... or runtime scalars, annotated in the body
        M: T.int32
        N: T.int32
        A: T.Tensor[[M, N], T.float32]
        B: T.Tensor[[M, N], T.float32]
        C = T.empty((M, N), T.float32)
        _add_rows(A, B, C, M, N, block_M=16)
        return C

    for f in (dyn, consts, params_as_dims, runtime_dims):
        assert isinstance(f, EagerJIT), f.__name__
    for m in (48, 40):
        a, b = torch.randn(m, 24), torch.randn(m, 24)
        ref = a * 2 + b
        torch.testing.assert_close(dyn(a, b), ref)
        torch.testing.assert_close(consts(a, b), ref)
        torch.testing.assert_close(params_as_dims(a, b, m, 24), ref)
        torch.testing.assert_close(runtime_dims(a, b, m, 24), ref)
    assert runtime_dims.cache_info().misses == 1
    assert ".target sm_90" in dyn.compile(a, b).get_source("ptx")


def test_lazy_functions_stay_lazy():
    @tritile.jit
    def lazy(M, N):
        K = T.dynamic("K")

        @T.prim_func
        def main(A: T.Tensor((M, K), T.float32), B: T.Tensor((M, K), T.float32)):
            with T.Kernel(1) as _:
                T.copy(A, B)

        return main

    @tritile.jit(out_idx=[1])
    def lazy_of_a_factory(M):
        return _copy_factory(M)

    assert isinstance(lazy, LazyJIT) and isinstance(lazy_of_a_factory, LazyJIT)
    a = torch.randn(8)
    torch.testing.assert_close(lazy_of_a_factory(8)(a), a)


def _copy_factory(M):
    @T.prim_func
    def main(A: T.Tensor((M,), T.float32), B: T.Tensor((M,), T.float32)):
        with T.Kernel(1) as _:
            for i in T.Parallel(M):
                B[i] = A[i]

    return main


def test_runtime_scalar_parameter_with_a_default():
    """`data: T.float32 = 1`: a runtime scalar argument whose default is passed when it is left out."""

    @tritile.jit
    def add(X, data: T.float32 = 1, scale: T.int32 = 3):
        M, N = T.const("M, N")
        X: T.Tensor[[M, N], T.float32]
        Y = T.empty((M, N), T.float32)
        with T.Kernel(T.ceildiv(M, 16), threads=128) as bx:
            for i, j in T.Parallel(16, N):
                Y[bx * 16 + i, j] = X[bx * 16 + i, j] * scale + data
        return Y

    x = torch.randn(32, 8)
    torch.testing.assert_close(add(x), x * 3 + 1)
    torch.testing.assert_close(add(x), x * 3 + 1)  # the remembered call
    torch.testing.assert_close(add(x, 2.5), x * 3 + 2.5)
    torch.testing.assert_close(add(x, scale=-2), x * -2 + 1)
    torch.testing.assert_close(add(x, data=0.25, scale=5), x * 5 + 0.25)
    assert add.cache_info().misses == 1
