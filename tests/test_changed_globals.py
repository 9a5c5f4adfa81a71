"""A module global a kernel reads is part of its cache key: rebinding it (or changing a list
global's contents) compiles a new specialisation with the new value, in both `@jit` styles
and through `@T.macro` helpers; a value seen before finds its kernel again.  Results are
compared with torch on fresh random inputs, through the interpreter."""
import sys

import pytest
import torch

import tritile
import tritile.language as T

SCALE = 2.0
SHIFT = 1.0
BLOCK = 16
OFFSETS = [0.0, 1.0]
THIS_MODULE = sys.modules[__name__]


@T.macro
def add_shift(buf, i, j):
    buf[i, j] = buf[i, j] + SHIFT


@tritile.jit
def scale_eager(A):
    M, N = T.const("M, N")
    A: T.Tensor[[M, N], T.float32]
    B = T.empty((M, N), T.float32)
    with T.Kernel(T.ceildiv(M, 16), threads=128) as bx:
        tile = T.alloc_fragment((16, N), T.float32)
        T.copy(A[bx * 16, 0], tile)
        for i, j in T.Parallel(16, N):
            tile[i, j] = tile[i, j] * SCALE
        for i, j in T.Parallel(16, N):
            add_shift(tile, i, j)
        T.copy(tile, B[bx * 16, 0])
    return B


@tritile.jit(out_idx=[-1])
def scale_lazy(M, N):
    block = BLOCK  # read by the Python function itself, not by the traced kernel

    @T.prim_func
    def kernel(A: T.Tensor((M, N), T.float32), B: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(M, block), threads=128) as bx:
            tile = T.alloc_fragment((block, N), T.float32)
            T.copy(A[bx * block, 0], tile)
            for i, j in T.Parallel(block, N):
                tile[i, j] = tile[i, j] * SCALE + OFFSETS[1]
            T.copy(tile, B[bx * block, 0])

    return kernel


def _input(m=32, n=16):
    return torch.randn(m, n)


def test_eager_kernel_recompiles_for_a_changed_global(monkeypatch):
    scale_eager.cache_clear()
    a = _input()
    torch.testing.assert_close(scale_eager(a), a * 2.0 + 1.0)
    monkeypatch.setattr(THIS_MODULE, "SCALE", -3.0)
    a = _input()
    torch.testing.assert_close(scale_eager(a), a * -3.0 + 1.0)
    assert scale_eager.cache_info().misses == 2
    monkeypatch.setattr(THIS_MODULE, "SCALE", 2.0)  # an equal value seen before: its kernel, no compile
    a = _input()
    torch.testing.assert_close(scale_eager(a), a * 2.0 + 1.0)
    assert scale_eager.cache_info().misses == 2
    assert scale_eager.cache_info().currsize == 2


def test_a_global_read_by_a_macro_is_part_of_the_key(monkeypatch):
    scale_eager.cache_clear()
    a = _input()
    torch.testing.assert_close(scale_eager(a), a * 2.0 + 1.0)
    monkeypatch.setattr(THIS_MODULE, "SHIFT", 0.5)
    a = _input()
    torch.testing.assert_close(scale_eager(a), a * 2.0 + 0.5)


def test_a_redefined_macro_recompiles(monkeypatch):
    scale_eager.cache_clear()
    a = _input()
    torch.testing.assert_close(scale_eager(a), a * 2.0 + 1.0)

    @T.macro
    def subtract_shift(buf, i, j):
        buf[i, j] = buf[i, j] - SHIFT

    monkeypatch.setattr(THIS_MODULE, "add_shift", subtract_shift)
    a = _input()
    torch.testing.assert_close(scale_eager(a), a * 2.0 - 1.0)


def test_eager_compile_path_sees_the_change(monkeypatch):
    scale_eager.cache_clear()
    a = _input()
    torch.testing.assert_close(scale_eager.compile(M=32, N=16)(a), a * 2.0 + 1.0)
    monkeypatch.setattr(THIS_MODULE, "SCALE", 4.0)
    torch.testing.assert_close(scale_eager.compile(M=32, N=16)(a), a * 4.0 + 1.0)


def test_lazy_kernel_recompiles_for_globals_of_the_kernel_and_of_the_function(monkeypatch):
    scale_lazy.cache_clear()
    a = _input()
    first = scale_lazy(32, 16)
    torch.testing.assert_close(first(a), a * 2.0 + 1.0)
    assert scale_lazy(32, 16) is first  # unchanged globals: the same kernel
    monkeypatch.setattr(THIS_MODULE, "SCALE", 0.25)
    a = _input()
    torch.testing.assert_close(scale_lazy(32, 16)(a), a * 0.25 + 1.0)
    monkeypatch.setattr(THIS_MODULE, "BLOCK", 32)  # read only by the Python function's own code
    kernel = scale_lazy(32, 16)
    assert "T.Kernel(1," in kernel.get_source("tile")  # ceildiv(32, 32) blocks
    a = _input()
    torch.testing.assert_close(kernel(a), a * 0.25 + 1.0)
    assert scale_lazy.cache_info().misses == 3


def test_a_list_global_changed_in_place_recompiles():
    scale_lazy.cache_clear()
    a = _input()
    torch.testing.assert_close(scale_lazy(32, 16)(a), a * 2.0 + 1.0)
    OFFSETS[1] = -7.0
    try:
        a = _input()
        torch.testing.assert_close(scale_lazy(32, 16)(a), a * 2.0 - 7.0)
    finally:
        OFFSETS[1] = 1.0


def test_warm_calls_hit_without_recompiling():
    scale_eager.cache_clear()
    for _ in range(3):
        a = _input()
        torch.testing.assert_close(scale_eager(a), a * 2.0 + 1.0)
    info = scale_eager.cache_info()
    assert (info.misses, info.hits) == (1, 2)


def test_guards_record_the_globals_read_and_skip_modules():
    scale_eager.cache_clear()
    kernel = scale_eager.compile(M=32, N=16)
    names = {guard[1] for guard in kernel.globals_read}
    assert {"SCALE", "SHIFT", "add_shift"} <= names
    assert "T" not in names and "torch" not in names  # modules are not guarded


@pytest.mark.parametrize("value", [2, 2.0000001])
def test_a_value_of_another_type_or_value_is_a_change(monkeypatch, value):
    scale_eager.cache_clear()
    a = _input()
    scale_eager(a)
    monkeypatch.setattr(THIS_MODULE, "SCALE", value)
    a = _input()
    torch.testing.assert_close(scale_eager(a), a * value + 1.0)
    assert scale_eager.cache_info().misses == 2
