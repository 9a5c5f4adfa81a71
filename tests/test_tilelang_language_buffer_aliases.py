"""TileLang's lower-case `T.parallel` (TVM's parallel `For`, a one-dimensional `T.Parallel` over
``[start, stop)``; examples/dsa_hisa/fp8_block_mean_pooling.py nests two) and the scoped buffer
annotations of macro parameters `T.SharedBuffer` / `T.FragmentBuffer` / `T.LocalBuffer`
(examples/dsa_sparse_finetune/indexer_topk_reducesum.py's bitonic sort): tritile's interpreter and
Triton's interpreter of the triton.language kernel against torch, and sm_90 PTX."""
import math

import pytest
import torch

import tritile
import tritile.language as T
from tritile.errors import CompileError

BACKENDS = ["auto", "triton"]  # on CPU tensors: tritile's interpreter / Triton's interpreter


def masked_rows(M, N):
    """fp8_block_mean_pooling's masking: rows from a runtime count on are zeroed in nested
    T.parallel loops; then T.parallel(start, stop) with a constant and a runtime start."""

    @T.prim_func
    def main(A: T.Tensor((M, N), T.float32), B: T.Tensor((M, N), T.float32), C: T.Tensor((M,), T.float32),
             n: T.int32, s: T.int32):
        with T.Kernel(2, threads=128) as bx:
            f = T.alloc_fragment((M, N), T.float32)
            r = T.alloc_fragment((M,), T.float32)
            T.copy(A, f)
            for i in T.parallel(M):
                for j in T.parallel(N):
                    if i >= n:
                        f[i, j] = T.cast(0, T.float32)
            T.reduce_sum(f, r, dim=1)
            for i in T.parallel(2, M):
                r[i] = r[i] * 2.0 + i
            for i in T.parallel(s, M):
                r[i] = r[i] + bx
            if bx == 1:
                T.copy(f, B)
                T.copy(r, C)

    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_nested_lower_case_parallel(backend):
    torch.manual_seed(0)
    M, N, n, s = 8, 16, 5, 3
    A = torch.randn(M, N)
    B, C = torch.zeros(M, N), torch.zeros(M)
    tritile.compile(masked_rows(M, N), backend=backend)(A, B, C, n, s)
    expected_B = A.clone()
    expected_B[n:] = 0
    expected_C = expected_B.sum(1)
    expected_C[2:] = expected_C[2:] * 2 + torch.arange(2, M)
    expected_C[s:] += 1
    torch.testing.assert_close(B, expected_B)
    torch.testing.assert_close(C, expected_C)


def bitonic_topk(rows, N):
    """indexer_topk_reducesum's bitonic sort, a macro whose parameters are T.SharedBuffer; a
    macro of T.FragmentBuffer / T.LocalBuffer parameters scales the sorted values."""
    num_iters = int(round(math.log2(N)))

    @T.macro
    def bitonic_sort(
        index_shared: T.SharedBuffer([N], dtype=T.int32),
        value_shared: T.SharedBuffer([N], dtype=T.float32),
    ):
        T.sync_threads()
        for i1 in T.serial(num_iters):
            for i2 in T.serial(i1 + 1):
                for i in T.Parallel(N):
                    ascending = (i & (1 << (i1 + 1))) != 0
                    j = i ^ (1 << (i1 - i2))
                    if i < j and ((ascending and value_shared[i] > value_shared[j])
                                  or (not ascending and value_shared[i] < value_shared[j])):
                        val = value_shared[i]
                        value_shared[i] = value_shared[j]
                        value_shared[j] = val
                        idx = index_shared[i]
                        index_shared[i] = index_shared[j]
                        index_shared[j] = idx
                T.sync_threads()

    @T.macro
    def scale(frag: T.FragmentBuffer([N], T.float32), factor: T.LocalBuffer([1], T.float32)):
        for i in T.Parallel(N):
            frag[i] = frag[i] * factor[0]

    @T.prim_func
    def main(X: T.Tensor((rows, N), T.float32), Values: T.Tensor((rows, N), T.float32),
             Indices: T.Tensor((rows, N), T.int32)):
        with T.Kernel(rows, threads=128) as bx:
            index_shared = T.alloc_shared([N], T.int32)
            value_shared = T.alloc_shared([N], T.float32)
            frag = T.alloc_fragment([N], T.float32)
            factor = T.alloc_local([1], T.float32)
            factor[0] = bx + 1.5
            T.copy(X[bx, :], value_shared)
            for i in T.Parallel(N):
                index_shared[i] = i
            bitonic_sort(index_shared, value_shared)
            T.copy(value_shared, frag)
            scale(frag, factor)
            T.copy(frag, Values[bx, :])
            T.copy(index_shared, Indices[bx, :])

    return main


def test_scoped_buffer_macro_parameters():
    # the interpreter only: the sort's `value_shared[j]` (j = i ^ 2^k) is a gather that neither GPU
    # backend lowers yet
    torch.manual_seed(1)
    rows, N = 3, 32
    X = torch.randn(rows, N)
    values, indices = torch.zeros(rows, N), torch.zeros(rows, N, dtype=torch.int32)
    tritile.compile(bitonic_topk(rows, N))(X, values, indices)
    # the network's final merge (i1 = log2 N - 1) sorts descending: (i & N) is 0 for every i < N
    expected, order = X.sort(dim=1, descending=True)
    torch.testing.assert_close(values, expected * (torch.arange(rows)[:, None] + 1.5))
    torch.testing.assert_close(indices, order.int())


def test_lower_case_parallel_compiles_for_hopper():
    for backend in ("gluon", "triton"):
        ptx = tritile.compile(masked_rows(8, 16), target="cuda:90", backend=backend).get_source("ptx")
        assert ".target sm_90" in ptx, backend


def test_scoped_buffer_types():
    for cls, scope in ((T.SharedBuffer, "shared.dyn"), (T.FragmentBuffer, "local.fragment"),
                       (T.LocalBuffer, "local")):
        spec = cls([4, 8], dtype=T.float16)
        assert (spec.shape, spec.dtype, spec.scope) == ((4, 8), T.float16, scope)
        assert cls[(4, 8), "float32"].shape == (4, 8)
        assert cls((4,), T.float32, scope="shared").scope == "shared"
    assert T.Tensor((4,), T.float32).scope == "global"


def test_scoped_buffer_kernel_parameter_is_a_compile_error():
    with pytest.raises(CompileError, match="annotates @T.macro parameters"):
        @T.prim_func
        def main(A: T.SharedBuffer((8,), T.float32)):
            with T.Kernel(1, threads=32) as bx:
                for i in T.Parallel(8):
                    A[i] = 1.0
