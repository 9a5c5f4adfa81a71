"""TileLang's `T.cummax` / `T.cummin` (running extrema along a dimension, forward or reversed,
in place or into another buffer) and `T.Cast(dtype, value)` in tritile, checked against torch:
on CPU tensors through tritile's interpreter (backend "gluon") and through Triton's interpreter
running the triton.language backend's code (backend "triton"); compiled for sm_90 by both; on
the GPU by both (NaN propagates, as in torch.cummax)."""
import pytest
import torch

import tritile
import tritile.language as T

BACKENDS = ["gluon", "triton"]


def _scan_kernel(op, M, N, dim, reverse, in_place):
    @T.prim_func
    def main(A: T.Tensor((M, N), T.float32), B: T.Tensor((M, N), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            src = T.alloc_fragment((M, N), T.float32)
            dst = T.alloc_fragment((M, N), T.float32)
            T.copy(A[0, 0], src)
            if in_place:
                op(src, dim=dim, reverse=reverse)
                T.copy(src, B[0, 0])
            else:
                op(src, dst, dim=dim, reverse=reverse)
                T.copy(dst, B[0, 0])

    return main


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["cummax", "cummin"])
@pytest.mark.parametrize("dim,reverse,in_place", [(0, False, False), (1, False, True), (1, True, False), (-1, True, True)])
def test_cum_extremum(name, dim, reverse, in_place, backend, device):
    kernel = tritile.compile(_scan_kernel(getattr(T, name), 8, 16, dim, reverse, in_place), out_idx=[1],
                             backend=backend)
    a = torch.randn(8, 16, device=device)
    a[3, 5] = float("nan")  # propagates along the scan, as in torch
    scan = getattr(torch, name)
    ref = scan(a.flip(dim), dim).values.flip(dim) if reverse else scan(a, dim).values
    torch.testing.assert_close(kernel(a), ref, equal_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cum_extremum_compiles_for_hopper(backend):
    kernel = tritile.compile(_scan_kernel(T.cummax, 8, 16, 1, True, False), out_idx=[1], target="cuda:90",
                             backend=backend)
    assert "associative_scan(" in kernel.get_source(backend) and ".entry" in kernel.get_source("ptx")


def test_cum_extremum_shape_mismatch_is_an_error():
    with pytest.raises(tritile.CompileError, match="T.cummax: dst shape"):
        @T.prim_func
        def main(A: T.Tensor((8, 16), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                src = T.alloc_fragment((8, 16), T.float32)
                dst = T.alloc_fragment((16, 8), T.float32)
                T.cummax(src, dst)


def test_cummax_of_a_padded_tile_is_refused_by_the_backends_at_the_call():
    with pytest.raises(tritile.CompileError, match="T.cummax of a tile whose extents are not powers of two") as err:
        tritile.compile(_scan_kernel(T.cummax, 8, 12, 1, True, False), target="cuda:90",
                        backend="triton").get_source("triton")
    assert "test_tilelang_language_scan_cast.py" in str(err.value)


def test_Cast():
    @T.prim_func
    def main(A: T.Tensor((64,), T.float32), B: T.Tensor((64,), T.float16), C: T.Tensor((64,), T.int32)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(64):
                B[i] = T.Cast(T.float16, A[i] * 3.0)
                C[i] = T.Cast("int32", A[i] * 10.0) + T.Cast(T.int32, 2.7)

    kernel = tritile.compile(main, out_idx=[1, 2])
    a = torch.randn(64)
    b, c = kernel(a)
    torch.testing.assert_close(b, (a * 3).half())
    torch.testing.assert_close(c, (a * 10).to(torch.int32) + 2)
    assert T.Cast(T.int32, 2.7) == 2
    assert "gl." in tritile.compile(main, out_idx=[1, 2], target="cuda:90").get_source("gluon")


@pytest.mark.gpu
def test_Cast_gpu():
    @T.prim_func
    def main(A: T.Tensor((64,), T.float32), B: T.Tensor((64,), T.float16)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(64):
                B[i] = T.Cast(T.float16, A[i] * 3.0)

    a = torch.randn(64, device="cuda")
    torch.testing.assert_close(tritile.compile(main, out_idx=[1])(a), (a * 3).half())
