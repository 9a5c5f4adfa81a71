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

    @tritile.jit(out_idx=[1])
    def lazy_with_a_host_array(M):
        torch.empty(M)  # a host array, not T.empty
        return _copy_factory(M)

    assert all(isinstance(f, LazyJIT) for f in (lazy, lazy_of_a_factory, lazy_with_a_host_array))
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


@T.macro
def _set_to(x: T.Ref, value):
    x = value  # noqa: F841 - writes the caller's element


@T.macro
def _collatz(n, var: T.Ref):  # eagerjit.en.ipynb's n31: recursive, ends at compile time
    if n == 1:
        pass
    elif n % 2 == 0:
        var = var // 2
        _collatz(n // 2, var)
    else:
        var = var * 3 + 1
        _collatz(n * 3 + 1, var)


@T.macro
def _scale_into(dst: T.Ref, src, k):
    dst = src * k + dst  # noqa: F841 - reads, then writes, the caller's element


def _collatz_ref(n, v):
    while n != 1:
        n, v = (n // 2, v // 2) if n % 2 == 0 else (n * 3 + 1, v * 3 + 1)
    return v


def test_macro_ref_parameters():
    """`x: T.Ref` macro parameters: an element of a global or local buffer (constant, runtime or
    T.alloc_var index, the index read at the call), a T.alloc_var variable, in T.Parallel loops,
    through recursive macros."""

    @T.prim_func
    def main(A: T.Tensor((16,), T.float32), B: T.Tensor((16,), T.float32), C: T.Tensor((4,), T.int32),
             D: T.Tensor((4,), T.int32)):
        with T.Kernel(1, threads=128) as _:
            local = T.alloc_fragment((16,), T.float32)
            for i in T.Parallel(16):
                local[i] = A[i]
            for i in T.Parallel(16):
                _scale_into(local[i], A[15 - i], 2.0)
            T.copy(local, B)
            _set_to(B[1], -7.0)
            idx = T.alloc_var(T.int32, 3)
            _set_to(B[idx], 5.5)  # the element at idx's value now
            idx = 9
            n = T.alloc_var(T.int32, C[0])
            _collatz(5, n)
            D[0] = n
            D[1] = C[1]
            _collatz(6, D[1])
            D[2] = C[2]
            _set_to(D[2], D[2] + C[3])
            D[3] = idx

    a = torch.randn(16)
    c = torch.randint(1, 1000, (4,), dtype=torch.int32)
    kernel = tritile.compile(main, out_idx=[1, 3])
    b, d = kernel(a, c)
    ref = a + a.flip(0) * 2.0
    ref[1], ref[3] = -7.0, 5.5
    torch.testing.assert_close(b, ref)
    assert d.tolist() == [_collatz_ref(5, c[0].item()), _collatz_ref(6, c[1].item()),
                          c[2].item() + c[3].item(), 9]
    for backend in ("gluon", "triton"):
        compiled = tritile.compile(main, out_idx=[1, 3], target="cuda:90", backend=backend)
        assert ".target sm_90" in compiled.get_source("ptx")


def test_macro_ref_of_a_value_is_an_error():
    def main(A: T.Tensor((4,), T.float32)):
        with T.Kernel(1) as _:
            _set_to(A[0] + 1, 2.0)

    with pytest.raises(tritile.CompileError, match="T.Ref parameter 'x' takes a buffer element"):
        T.prim_func(main)


def _ptr_kernel(backend=None):
    @tritile.jit(backend=backend)
    def scale(A: T.ptr, k, is_2d=False):  # `T.ptr` parameters, typed by T.match_buffer in the body
        k: T.float32
        if is_2d:
            M, N = T.const("M, N")
            A = T.match_buffer(A, [M, N], T.float32)
            B = T.empty((M, N), T.float32)
            with T.Kernel(T.ceildiv(M, 16), threads=128) as bx:
                for i, j in T.Parallel(16, N):
                    B[bx * 16 + i, j] = A[bx * 16 + i, j] * k
        else:
            L = T.dynamic("L")
            A = T.match_buffer(A, [L], T.float32)
            B = T.empty((L,), T.float32)
            with T.Kernel(T.ceildiv(L, 32), threads=128) as bx:
                for i in T.Parallel(32):
                    B[bx * 32 + i] = A[bx * 32 + i] * k
        return B

    return scale


def test_ptr_parameters_typed_by_match_buffer():
    scale = _ptr_kernel()
    assert isinstance(scale, EagerJIT)
    a2, a1 = torch.randn(48, 8), torch.randn(70)
    torch.testing.assert_close(scale(a2, 1.5, is_2d=True), a2 * 1.5)
    torch.testing.assert_close(scale(a1, -2.0), a1 * -2.0)
    torch.testing.assert_close(scale(a1[:50], 3.0), a1[:50] * 3.0)

    @tritile.jit
    def strided(A: T.ptr):
        M, N, sM = T.dynamic("M, N, sM")
        A = T.match_buffer(A, [M, N], T.float32, strides=[sM, 1])
        B = T.empty((M, N), T.float32)
        with T.Kernel(T.ceildiv(M, 16), threads=128) as bx:
            for i, j in T.Parallel(16, 4):
                B[bx * 16 + i, j] = A[bx * 16 + i, j] + 1
        return B

    x = torch.randn(40, 10)
    torch.testing.assert_close(strided(x[:, 3:7]), x[:, 3:7] + 1)
    for backend in ("gluon", "triton"):
        kernel = _ptr_kernel(backend).compile(M=64, N=8, is_2d=True, target="cuda:90")
        assert ".target sm_90" in kernel.get_source("ptx")


def test_match_buffer_errors():
    @tritile.jit
    def not_a_ptr(A, n: int = 4):
        B = T.match_buffer(n, [4], T.float32)  # noqa: F841
        with T.Kernel(1) as _:
            pass

    with pytest.raises(tritile.CompileError, match="T.match_buffer takes a parameter of the kernel annotated"):
        not_a_ptr(torch.randn(4))

    @tritile.jit
    def untyped(A: T.ptr):
        with T.Kernel(1) as _:
            A[0] = 1.0

    with pytest.raises(tritile.CompileError, match=r"the T.ptr parameter A \(give it a type first: A = T.match_buffer"):
        untyped(torch.randn(4))


def test_par_compile_and_parse_cache_key():
    """`f.par_compile(configs)`: a kernel per config, from `T.Tensor` placeholders (their shapes give
    the T.const dims) or real tensors; `f.parse_cache_key(...)`."""

    @tritile.jit
    def gemm(A, B, block_M: int = 32, block_N: int = 32, block_K: int = 16):
        M, N, K = T.const("M, N, K")
        A: T.Tensor[[M, K], T.float16]
        B: T.Tensor[[K, N], T.float16]
        C = T.empty((M, N), T.float32)
        with T.Kernel(T.ceildiv(M, block_M), T.ceildiv(N, block_N), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), T.float16)
            B_shared = T.alloc_shared((block_K, block_N), T.float16)
            C_local = T.alloc_fragment((block_M, block_N), T.float32)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.copy(A[bx * block_M, k * block_K], A_shared)
                T.copy(B[k * block_K, by * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[bx * block_M, by * block_N])
        return C

    configs = [{"A": T.Tensor((64, 48), T.float16), "B": T.Tensor((48, 32), T.float16), "block_M": bm,
                "block_K": bk} for bm in (16, 32) for bk in (16, 48)]
    a, b = torch.randn(64, 48, dtype=torch.float16), torch.randn(48, 32, dtype=torch.float16)
    kernels = gemm.par_compile(configs + [(a, b, 64, 32, 16)])
    assert len(kernels) == 5 and len({id(k) for k in kernels}) == 5
    ref = a.float() @ b.float()
    for kernel in kernels:
        torch.testing.assert_close(kernel(a, b), ref, rtol=1e-2, atol=1e-2)
    assert gemm.par_compile(configs[:1])[0] is kernels[0]  # cached
    with pytest.raises(tritile.CompileError):
        gemm.par_compile([{"A": T.Tensor((64, 48), T.float16), "B": T.Tensor((48, 32), T.float16), "block_M": 0}])
    with pytest.warns(UserWarning, match="par_compile: config"):
        assert gemm.par_compile([{"A": T.Tensor((64, 48), T.float16), "B": T.Tensor((48, 32), T.float16),
                                  "block_M": 0}], ignore_error=True) == [None]
    with pytest.raises(ValueError, match="Invalid config type"):
        gemm.par_compile([3])
    key = gemm.parse_cache_key(a, b, block_M=16)
    assert key == gemm.parse_cache_key(a.clone(), b, block_M=16) != gemm.parse_cache_key(a, b, block_M=32)
    assert gemm.parse_cache_key(a, b) != gemm.parse_cache_key(a[:32], b)

    @tritile.jit(out_idx=[1])
    def lazy_copy(M, block=16):
        @T.prim_func
        def main(A: T.Tensor((M,), T.float32), B: T.Tensor((M,), T.float32)):
            with T.Kernel(T.ceildiv(M, block)) as bx:
                for i in T.Parallel(block):
                    B[bx * block + i] = A[bx * block + i]

        return main

    k1, k2 = lazy_copy.par_compile([(32,), {"M": 32, "block": 8}])
    x = torch.randn(32)
    torch.testing.assert_close(k1(x), x)
    torch.testing.assert_close(k2(x), x)
    assert lazy_copy.parse_cache_key(32) == lazy_copy.parse_cache_key(32) != lazy_copy.parse_cache_key(32.0)
