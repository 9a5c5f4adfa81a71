"""Python that runs while TileLang traces a kernel, in tritile: plain helper functions that
call T operations (inlined like `@T.macro`), lambdas and other Python callables calling T
operations (lowered at the traced line: TileLang's test_tilelang_language_clamp.py keeps
`T.max` / `T.min` / `T.clamp` lambdas in a dict), comprehensions and generator expressions over
compile-time values, Python arithmetic (`//`, `%`, ...) on symbolic sizes in helpers, names
bound to regions (`X_shared = A_shared[:M, :K]`) and TVM's `x = T.int32()` / `T.let`."""
import pytest
import torch

import tritile
import tritile.language as T


def _scale_into(src, dst, factor, n):
    """A plain helper (no @T.macro) that emits a T.Parallel loop."""
    for i in T.Parallel(n):
        dst[i] = src[i] * factor


def _split(m):
    return m // 4, m % 4


def test_plain_helper_calling_T_ops():
    @T.prim_func
    def main(A: T.Tensor((64,), T.float32), B: T.Tensor((64,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            tile = T.alloc_fragment((64,), T.float32)
            T.copy(A[0], tile)
            _scale_into(tile, tile, 3.0, 64)
            T.copy(tile, B[0])

    kernel = tritile.compile(main, out_idx=[1])
    a = torch.randn(64)
    torch.testing.assert_close(kernel(a), a * 3)
    assert "gl." in tritile.compile(main, out_idx=[1], target="cuda:90").get_source("gluon")


ELEMENTWISE = {
    "max": lambda a, b: T.max(a, b),
    "min": lambda a, b: T.min(a, b),
    "clamp": lambda a, b: T.clamp(a, T.cast(-1.0, T.float32), b),
    "exp_sum": lambda a, b: T.exp(a) + b,
}


@pytest.mark.parametrize("op, ref", [
    ("max", torch.maximum), ("min", torch.minimum), ("clamp", lambda a, b: torch.minimum(a.clamp_min(-1.0), b)),
    ("exp_sum", lambda a, b: torch.exp(a) + b),
])
def test_lambda_calling_T_ops(op, ref, device):
    @T.prim_func
    def main(A: T.Tensor((256,), T.float32), B: T.Tensor((256,), T.float32), C: T.Tensor((256,), T.float32)):
        with T.Kernel(4, threads=64) as bx:
            for i in T.Parallel(64):
                C[bx * 64 + i] = ELEMENTWISE[op](A[bx * 64 + i], B[bx * 64 + i])

    a, b = torch.randn(256, device=device), torch.randn(256, device=device)
    torch.testing.assert_close(tritile.compile(main, out_idx=[2])(a, b), ref(a, b))
    for backend in ("gluon", "triton"):
        assert ".entry" in tritile.compile(main, out_idx=[2], target="cuda:90", backend=backend).get_source("ptx")


def test_T_op_called_from_python_outside_a_trace_is_an_error():
    with pytest.raises(RuntimeError, match="T.max on runtime values can only be used inside a kernel"):
        ELEMENTWISE["max"](T.dynamic("n"), 1)


def test_floordiv_and_mod_of_a_symbolic_size_in_a_helper():
    M = T.dynamic("M")

    @T.prim_func
    def main(A: T.Tensor((M,), T.float32), B: T.Tensor((M,), T.float32)):
        with T.Kernel(T.ceildiv(M, 64), threads=128) as bx:
            quarters, rest = _split(M)
            for i in T.Parallel(64):
                if bx * 64 + i < M:
                    B[bx * 64 + i] = A[bx * 64 + i] + quarters * 10 + rest

    kernel = tritile.compile(main, out_idx=[1])
    for m in (100, 67):
        a = torch.randn(m)
        torch.testing.assert_close(kernel(a), a + (m // 4) * 10 + m % 4)


def test_python_operators_on_symbolic_sizes_build_ir():
    M = T.dynamic("M")
    assert isinstance(M // 4, tritile.ir.nodes.BinOp) and (M % 4).op == "%"
    assert (2 * M + 1).dtype == T.int32 and (-M).op == "-"


def test_comprehensions_and_generator_expressions():
    shape = (8, 16)

    @T.prim_func
    def main(A: T.Tensor(shape, T.float32), B: T.Tensor(shape, T.float32)):
        with T.Kernel(1, threads=128) as bx:
            tile = T.alloc_fragment(tuple(s for s in shape), T.float32)
            T.copy(A[0, 0], tile)
            offsets = {d: s * 2 for d, s in enumerate(shape) if s > 8}
            total = sum(s for s in shape) + offsets[1]
            for i, j in T.Parallel(*[s for s in shape]):
                tile[i, j] = tile[i, j] + total
            T.copy(tile, B[0, 0])

    kernel = tritile.compile(main, out_idx=[1])
    a = torch.randn(8, 16)
    torch.testing.assert_close(kernel(a), a + 24 + 32)


def test_comprehension_over_a_runtime_value_is_an_error():
    with pytest.raises(tritile.CompileError, match="compile-time iterable"):
        @T.prim_func
        def main(A: T.Tensor((8,), T.int32)):
            with T.Kernel(1, threads=128) as bx:
                xs = [x for x in A[0]]


@pytest.mark.gpu
def test_plain_helper_gpu():
    @T.prim_func
    def main(A: T.Tensor((64,), T.float32), B: T.Tensor((64,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            tile = T.alloc_fragment((64,), T.float32)
            T.copy(A[0], tile)
            _scale_into(tile, tile, 3.0, 64)
            T.copy(tile, B[0])

    a = torch.randn(64, device="cuda")
    torch.testing.assert_close(tritile.compile(main, out_idx=[1])(a), a * 3)


@tritile.jit(out_idx=[2])
def aliased_gemm(M, N, K, block_M, block_N, block_K):
    """TileLang's test_tilelang_language_alias.py: names bound to regions (`X_shared =
    A_shared[:block_M, :block_K]`) used as tile operands, and an offset declared `T.int32()` and
    bound by `T.let`; C = A @ B^T."""

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((N, K), T.float16), C: T.Tensor((M, N), T.float16)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), T.float16)
            B_shared = T.alloc_shared((block_N, block_K), T.float16)
            C_local = T.alloc_fragment((block_M, block_N), T.float32)
            X_shared = A_shared[:block_M, :block_K]
            X_local = C_local[:block_M, :block_N]
            T.clear(X_local)
            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=0):
                aliased_offset = T.int32()
                T.let(aliased_offset, ko * block_K)
                T.copy(A[by * block_M, aliased_offset], X_shared)
                T.copy(B[bx * block_N, ko * block_K], B_shared[:block_N, :block_K])
                T.gemm(X_shared, B_shared, C_local, transpose_B=True)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return main


def test_region_alias_and_let(device, assert_close):
    a = torch.randn(64, 96, device=device).half()
    b = torch.randn(32, 96, device=device).half()
    assert_close(aliased_gemm(64, 32, 96, 32, 32, 32)(a, b), (a.float() @ b.float().T).half())
    for backend in ("gluon", "triton"):
        kernel = tritile.compile(aliased_gemm.fn(64, 32, 96, 32, 32, 32), out_idx=[2], target="cuda:90",
                                 backend=backend)
        assert ".entry" in kernel.get_source("ptx")


def test_let_expression_and_misuse():
    @T.prim_func
    def main(A: T.Tensor((8,), T.int32)):
        with T.Kernel(1, threads=32) as _:
            x = T.int32()
            A[0] = T.let(x, 5, x * x + 1)

    a = torch.zeros(8, dtype=torch.int32)
    tritile.compile(main)(a)
    assert a[0].item() == 26
    with pytest.raises(tritile.CompileError, match="T.let binds a variable made by"):
        @T.prim_func
        def bad(A: T.Tensor((8,), T.int32)):
            with T.Kernel(1, threads=32) as _:
                T.let(A, 5)


@tritile.jit
def affine_sizes(block):
    """TileLang's test_tilelang_language_annot.py: symbols only in affine sizes (`n * 4`,
    `n * 3 + 1`) are solved from the call's tensors; B = 2 * A over A's n * 4 elements, C[0] = m."""
    n, m = T.symbolic("n"), T.symbolic("m")

    @T.prim_func
    def main(A: T.Tensor((n * 4,), T.float32), B: T.Tensor((n * 4,), T.float32), C: T.Tensor((m * 3 + 1,), T.int32)):
        with T.Kernel(T.ceildiv(n * 4, block), threads=128) as bx:
            for i in T.Parallel(block):
                if bx * block + i < n * 4:
                    B[bx * block + i] = A[bx * block + i] * 2.0
            if bx == 0:
                C[0] = m

    return main


def test_affine_symbolic_sizes(device):
    kernel = affine_sizes(64)
    for n in (25, 64):
        a, b = torch.randn(n * 4, device=device), torch.zeros(n * 4, device=device)
        c = torch.zeros(3 * 5 + 1, dtype=torch.int32, device=device)
        kernel(a, b, c)
        torch.testing.assert_close(b, a * 2.0)
        assert c[0].item() == 5
    with pytest.raises(ValueError, match=r"argument 'A'.*dimension 0: a dimension of size 99 is not n \* 4"):
        kernel(torch.randn(99, device=device), torch.zeros(99, device=device), c)
    for backend in ("gluon", "triton"):
        assert ".entry" in tritile.compile(affine_sizes.fn(64), target="cuda:90", backend=backend).get_source("ptx")
