"""Entry points: @tritile.jit (lazy and eager), tritile.compile, JITKernel caching, out_idx
handling and get_source stages."""
import pytest
import torch

import tritile
import tritile.language as T
import tritile.runtime.target
from tritile.lowering import PASS_NAMES


@tritile.jit(out_idx=[-1])
def scale_lazy(M, N, factor, block=32, dtype="float32"):
    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, block)) as bx:
            for i, j in T.Parallel(block, N):
                Y[bx * block + i, j] = X[bx * block + i, j] * factor

    return main


@tritile.jit
def scale_eager(X, factor: float = 2.0, block: int = 32):
    M, N = T.const("M, N")
    X: T.Tensor((M, N), T.float32)
    Y = T.empty((M, N), T.float32)
    with T.Kernel(T.ceildiv(M, block)) as bx:
        for i, j in T.Parallel(block, N):
            Y[bx * block + i, j] = X[bx * block + i, j] * factor
    return Y


def test_lazy_kernel_cached_per_arguments(assert_close):
    k1 = scale_lazy(64, 32, 3.0)
    assert scale_lazy(64, 32, 3.0) is k1
    assert scale_lazy(64, 32, 4.0) is not k1
    assert scale_lazy(64, 32, 3) is not k1  # an int constant is another specialisation
    x = torch.randn(64, 32)
    assert_close(k1(x), x * 3.0)


def test_lazy_kernel_key_ignores_keyword_order_but_not_types(assert_close):
    k1 = scale_lazy(64, 32, 3.0, block=16, dtype="float32")
    assert scale_lazy(64, 32, 3.0, dtype="float32", block=16) is k1
    assert scale_lazy(64, 32, True, block=16) is not scale_lazy(64, 32, 1, block=16)
    x = torch.randn(64, 32)
    assert_close(k1(x), x * 3.0)


def test_lazy_kernel_keys_of_unhashable_constants():
    from tritile.runtime.jit import _constants_key

    assert _constants_key(([64, 32], 3.0), {"shape": [1, 2]}) == _constants_key(([64, 32], 3.0), {"shape": [1, 2]})
    assert _constants_key(([64, 32],), {}) != _constants_key(((64, 32),), {})  # a list is not a tuple
    assert _constants_key((1,), {}) != _constants_key((1.0,), {})


def test_eager_call_specialises_on_const_dims(assert_close):
    x = torch.randn(64, 32)
    assert_close(scale_eager(x), x * 2.0)
    assert_close(scale_eager(x, factor=0.5), x * 0.5)
    y = torch.randn(96, 32)
    assert_close(scale_eager(y), y * 2.0)
    assert scale_eager.cache_info().currsize == 3


def test_eager_compile_returns_cached_kernel(assert_close):
    kernel = scale_eager.compile(M=64, N=16, factor=1.5)
    assert isinstance(kernel, tritile.JITKernel)
    assert scale_eager.compile(M=64, N=16, factor=1.5) is kernel
    assert kernel.out_idx == [1]
    x = torch.randn(64, 16)
    assert_close(kernel(x), x * 1.5)


def test_eager_compile_takes_tritile_compiles_options(monkeypatch, assert_close):
    """`target=` and `backend=` given to `.compile` are options of the kernel, not constants."""
    monkeypatch.delenv("TRITILE_BACKEND", raising=False)
    scale_eager.cache_clear()  # kernels compiled earlier under CI's TRITILE_BACKEND=triton run
    default = scale_eager.compile(M=64, N=16, factor=1.5)
    amd = scale_eager.compile(M=64, N=16, factor=1.5, target="hip:gfx942")
    assert amd is not default and str(amd.target) == "hip:gfx942" and default.target != amd.target
    assert [b.name for b in amd.backends] == ["triton"] and "@triton.jit" in amd.get_source("triton")
    on_triton = scale_eager.compile(M=64, N=16, factor=1.5, backend="triton")
    assert on_triton.backend == "triton" and default.backend == "auto"
    assert scale_eager.compile(M=64, N=16, factor=1.5, backend="triton") is on_triton
    x = torch.randn(64, 16)
    assert_close(on_triton(x), x * 1.5)  # Triton's interpreter of the generated kernel
    with pytest.raises(ValueError, match="unknown backend 'tvm'"):
        scale_eager.compile(M=64, N=16, factor=1.5, backend="tvm")


def test_eager_compile_option_named_like_a_parameter_is_a_type_error():
    @tritile.jit
    def shift(X, backend: int = 1):
        N = T.const("N")
        X: T.Tensor((N,), T.float32)
        Y = T.empty((N,), T.float32)
        with T.Kernel(1) as bx:
            for i in T.Parallel(N):
                Y[i] = X[i] + backend
        return Y

    with pytest.raises(TypeError, match="'backend' is both a parameter of the kernel and an option"):
        shift.compile(N=32, backend="triton")
    x = torch.randn(32)
    torch.testing.assert_close(shift(x, backend=3), x + 3)  # a call still takes it as the constant


def test_eager_rejects_out_idx():
    with pytest.raises(ValueError, match="out_idx"):
        @tritile.jit(out_idx=[-1])
        def f(X):
            X: T.Tensor((32,), T.float32)
            Y = T.empty((32,), T.float32)
            with T.Kernel(1):
                T.copy(X, Y)
            return Y


def _copy_func():
    @T.prim_func
    def copy2(X: T.Tensor((32, 32), "float32"), Y: T.Tensor((32, 32), "float32"),
              Z: T.Tensor((32, 32), "float32")):
        with T.Kernel(1) as bx:
            for i, j in T.Parallel(32, 32):
                Y[i, j] = X[i, j] + 1.0
                Z[i, j] = X[i, j] * 2.0

    return copy2


@pytest.mark.parametrize("out_idx, expected", [(None, []), (-1, [2]), ([1, 2], [1, 2]), ([-2], [1])])
def test_out_idx_variants(out_idx, expected, assert_close):
    kernel = tritile.compile(_copy_func(), out_idx=out_idx, target="cpu")
    assert kernel.out_idx == expected
    x = torch.randn(32, 32)
    if not expected:  # the caller passes every tensor and gets None back
        y, z = torch.randn(32, 32), torch.randn(32, 32)
        assert kernel(x, y, z) is None
        assert_close(y, x + 1.0)
        assert_close(z, x * 2.0)
        return
    result = kernel(x, *([torch.randn(32, 32)] * (3 - 1 - len(expected))))
    results = result if isinstance(result, list) else [result]
    refs = {1: x + 1.0, 2: x * 2.0}
    for index, tensor in zip(expected, results):
        assert_close(tensor, refs[index])


def test_out_idx_out_of_range():
    with pytest.raises(ValueError, match="out_idx"):
        tritile.compile(_copy_func(), out_idx=[3])


def test_get_source_stages():
    kernel = scale_lazy(64, 32, 3.0)
    tile = kernel.get_source("tile")
    assert "T.Parallel(32, 32)" in tile and "X[bx * 32 + i, j] * 3.0" in tile
    for name in PASS_NAMES:
        assert "def main(" in kernel.get_source(name)
    with pytest.raises(ValueError, match="unknown stage"):
        kernel.get_source("sass")
    assert isinstance(kernel.get_kernel_source(), str) and kernel.get_kernel_source()
    assert kernel.func.params[0].name == "X"
    assert kernel.target == tritile.runtime.target.parse_target("auto")


def test_interpret_env_forces_interpreter(monkeypatch, assert_close):
    monkeypatch.setenv("TRITILE_INTERPRET", "1")
    kernel = scale_lazy(32, 32, 5.0)
    x = torch.randn(32, 32)
    assert_close(kernel(x), x * 5.0)


def test_the_interpret_switch_is_read_per_call_as_os_environ_has_it(monkeypatch):
    """`switches.interpret_requested()` reads os.environ's own dict (a warm call's cheap read):
    the same answer as `os.environ.get`, every value and unset, changed between calls."""
    from tritile.switches import interpret_requested

    monkeypatch.delenv("TRITILE_INTERPRET", raising=False)
    assert interpret_requested() is False
    for value, on in (("1", True), ("0", False), ("", False), ("yes", True), ("1", True)):
        monkeypatch.setenv("TRITILE_INTERPRET", value)
        assert interpret_requested() is on, value
    monkeypatch.delenv("TRITILE_INTERPRET")
    assert interpret_requested() is False


# ---------------------------------------------------------------- warm-call fast paths
def test_eager_warm_calls_keep_results_and_statistics(assert_close):
    scale_eager.cache_clear()
    x, y = torch.randn(64, 32), torch.randn(96, 32)
    for _ in range(3):
        assert_close(scale_eager(x, factor=3.0), x * 3.0)
        assert_close(scale_eager(y, 0.25), y * 0.25)
        assert_close(scale_eager(X=y, factor=0.25), y * 0.25)  # the tensor passed by keyword
    info = scale_eager.cache_info()
    assert (info.misses, info.currsize, info.hits + info.misses) == (2, 2, 9)
    assert_close(scale_eager(x, factor=3), x * 3)  # an int constant is another specialisation
    assert scale_eager.cache_info().misses == 3


def test_eager_warm_call_still_checks_arguments(assert_close):
    x = torch.randn(64, 32)
    scale_eager(x)
    with pytest.raises(TypeError, match="argument 'X'"):
        scale_eager(x.numpy())
    with pytest.raises(ValueError, match="argument 'X'.*at least 2 dimensions"):
        scale_eager(torch.randn(64))
    with pytest.raises(TypeError, match="argument 'X'.*dtype float32, got float16"):
        scale_eager(x.half())
    assert_close(scale_eager(x), x * 2.0)


def test_kernel_warm_call_rechecks_strides_and_dtypes(assert_close):
    kernel = tritile.compile(_copy_func(), out_idx=[-1], target="cpu")
    x, y = torch.randn(32, 32), torch.randn(32, 32)
    y_ref = y.clone()
    assert_close(kernel(x, y), x * 2.0)
    assert_close(y, x + 1.0)
    # a transposed input after a warm contiguous call of the same shape: copied, still correct
    xt = torch.randn(32, 32).t()
    assert_close(kernel(xt, y_ref), xt * 2.0)
    with pytest.raises(ValueError, match="argument 'Y' \\(param 1\\).*contiguous"):
        kernel(x, torch.randn(32, 32).t())
    with pytest.raises(TypeError, match="argument 'X' \\(param 0\\): expected dtype float32, got float16"):
        kernel(x.half(), y)
    with pytest.raises(TypeError, match="expected 2"):
        kernel(x)
    fresh = [torch.randn(32, 32) for _ in range(2)]
    assert kernel(*fresh) is not kernel(*fresh)  # outputs are allocated on every call
