"""TileLang's `T.copy` corners from testing/python/language/test_tilelang_language_copy.py, in
kernels written as TileLang writes them, against torch:

* `T.annotate_safe_value({A: v})`: out-of-bounds reads of A give v (converted to A's dtype) in
  region copies, element copies inside `T.Parallel` and copies through shared memory (which
  then take neither TMA nor cp.async: both fill with 0);
* a one-element `T.copy` (`T.copy(A, A_local)`, `T.copy(indices[pid], idx[0])`);
* `T.clear` / `T.fill` of a global region.

On the `device` fixture's tensors (CPU: the tile-IR interpreter; CUDA: the GPU kernel) and, on
CPU, through the triton backend in Triton's interpreter; compiled for sm_90 by both backends.
"""
import pytest
import torch

import tritile
import tritile.language as T

BACKENDS = ["auto", "triton"]  # on CPU tensors: tritile's interpreter / Triton's interpreter


def _run(func, backend, device, *args, out_idx=None):
    if backend == "triton" and device != "cpu":
        pytest.skip("the triton backend's CPU check (Triton's interpreter)")
    return tritile.compile(func, out_idx=out_idx, backend=backend)(*args)


def padded_copy(M, N, block, src_dtype, dst_dtype, pad_value, via_shared):
    """A (M, N) copied into a zero-padded (block-multiple) B, tile by tile; the tile's part past
    A's edge reads the safe value (TileLang's tilelang_copy_oob_safe_value)."""
    padded_M, padded_N = T.ceildiv(M, block) * block, T.ceildiv(N, block) * block

    @T.prim_func
    def main(A: T.Tensor((M, N), src_dtype), B: T.Tensor((padded_M, padded_N), dst_dtype)):
        with T.Kernel(T.ceildiv(padded_N, block), T.ceildiv(padded_M, block), threads=128) as (bx, by):
            if pad_value is not None:
                T.annotate_safe_value({A: pad_value})
            if via_shared:
                tile = T.alloc_shared((block, block), src_dtype)
                T.copy(A[by * block, bx * block], tile)
                T.copy(tile, B[by * block, bx * block])
            else:
                T.copy(A[by * block:(by + 1) * block, bx * block:(bx + 1) * block],
                       B[by * block:(by + 1) * block, bx * block:(bx + 1) * block])

    return main


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("src_dtype, dst_dtype, pad_value, via_shared", [
    (T.float32, T.float32, -99, False), (T.float32, T.float16, -99.5, False), (T.float16, T.float16, 7, True),
    (T.int32, T.int32, -1, True)])
def test_copy_safe_value(src_dtype, dst_dtype, pad_value, via_shared, backend, device):
    M, N, block = 70, 75, 32
    src = getattr(torch, src_dtype)
    a = (torch.randn(M, N, device=device) * 100).to(src)
    b = _run(padded_copy(M, N, block, src_dtype, dst_dtype, pad_value, via_shared), backend, device, a, out_idx=[1])
    ref = torch.full((96, 96), pad_value, dtype=src, device=device)
    ref[:M, :N] = a
    assert torch.equal(b, ref.to(getattr(torch, dst_dtype)))


def elementwise_safe_value(M, N, padded, pad_value):
    """TileLang's tilelang_elementwise_copy_oob_safe_value: element copies inside T.Parallel."""

    @T.prim_func
    def main(A: T.Tensor((M, N), T.float32), B: T.Tensor((padded, padded), T.float32)):
        with T.Kernel(1, threads=128):
            T.annotate_safe_value({A: pad_value})
            for i, j in T.Parallel(padded, padded):
                T.copy(A[i, j], B[i, j])

    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_elementwise_copy_safe_value(backend, device):
    M, N, padded = 30, 45, 64
    a = torch.randn(M, N, device=device)
    b = _run(elementwise_safe_value(M, N, padded, -99), backend, device, a, out_idx=[1])
    ref = torch.full((padded, padded), -99.0, device=device)
    ref[:M, :N] = a
    assert torch.equal(b, ref)


def test_safe_value_takes_neither_tma_nor_cp_async():
    func = padded_copy(256, 256, 64, T.float16, T.float16, 7, True)
    ptx = tritile.compile(func, target="cuda:90", backend="gluon").get_source("ptx")
    assert "shared::cluster.global" not in ptx and "cp.async.cg" not in ptx and "cp.async.ca" not in ptx
    plain = tritile.compile(padded_copy(256, 256, 64, T.float16, T.float16, None, True), target="cuda:90",
                            backend="gluon").get_source("ptx")
    assert "shared::cluster.global" in plain  # without the annotation the tile is a TMA load


def test_safe_value_must_be_a_number_of_a_global_tensor():
    with pytest.raises(tritile.CompileError, match="keys must be global tensors"):
        @T.prim_func
        def main(A: T.Tensor((16,), T.float32)):
            with T.Kernel(1, threads=32):
                s = T.alloc_shared((16,), T.float32)
                T.annotate_safe_value({s: 1.0})


def one_element_copies(n, dtype):
    """TileLang's tile_atomic_add_scalar (a (1,) tensor copied to a local, cleared, atomics) and
    tilelang_copy_bufferload (an index copied into a local element)."""

    @T.prim_func
    def main(A: T.Tensor((1,), dtype), B: T.Tensor((1,), dtype), idx_in: T.Tensor((n,), T.int64),
             x: T.Tensor((n,), dtype)):
        with T.Kernel(n, threads=32) as pid:
            idx = T.alloc_local([1], T.int32)
            T.copy(idx_in[pid], idx[0])
            x[idx[0]] = x[idx[0]] + 1
            if pid == 0:
                A_local = T.alloc_local([1], dtype)
                T.copy(A, A_local)
                T.clear(B)
                T.atomic_add(B, A_local)
                T.atomic_add(B, 1)

    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_element_copies_and_global_clear(backend, device):
    n = 16
    a, b = torch.randn(1, device=device), torch.randn(1, device=device)
    perm = torch.randperm(n, device=device)
    x = torch.randn(n, device=device)
    ref_x = x.clone()
    ref_x[perm] += 1
    _run(one_element_copies(n, T.float32), backend, device, a, b, perm, x)
    torch.testing.assert_close(b, a + 1)
    torch.testing.assert_close(x, ref_x)


def fill_global(M, N, block, value):
    @T.prim_func
    def main(A: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(M, block), threads=32) as bx:
            T.fill(A[bx * block:(bx + 1) * block, 0:N], value)

    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_fill_global_region(backend, device):
    M, N = 40, 24  # the last block runs past M: those rows are not written
    a = torch.randn(M, N, device=device)
    _run(fill_global(M, N, 16, 2.5), backend, device, a)
    assert torch.equal(a, torch.full((M, N), 2.5, device=device))


def test_copies_compile_for_hopper():
    for func in (padded_copy(70, 75, 32, T.float32, T.float16, -99.5, False),
                 padded_copy(70, 75, 32, T.int32, T.int32, -1, True), elementwise_safe_value(30, 45, 64, -99),
                 one_element_copies(16, T.float32), fill_global(40, 24, 16, 2.5)):
        for backend in ("gluon", "triton"):
            assert ".target sm_90" in tritile.compile(func, target="cuda:90", backend=backend).get_source("ptx")
