"""TileLang's API around the kernels under its TileLang names: `tritile.PassConfigKey` and
`pass_configs=`, `tritile.profiler.do_bench`, `tritile.testing`, `tritile.cdiv`,
`tritile.carver.arch.driver`, `tritile.disable_cache` / `enable_cache`, `T.func_attr` (what
TileLang's own example programs and test files call)."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

import tritile
import tritile.testing
from tritile import transform
from tritile.profiler import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def attention_kernel(pass_configs=None):
    from flash_attention import flashattn

    return tritile.compile(flashattn.fn(1, 2, 1024, 1024, 128, False, block_M=128, block_N=128, num_stages=2,
                                        threads=256), out_idx=[3], target="cuda:90", pass_configs=pass_configs)


def test_pass_config_keys_are_tilelangs_strings():
    key = tritile.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED
    assert key == "tl.disable_warp_specialized" and {key: True} == {"tl.disable_warp_specialized": True}
    assert tritile.PassConfigKey.TL_ENABLE_FAST_MATH.value == "tl.enable_fast_math"
    # every key of TileLang's PassConfigKey (test_tilelang_language_reducer_v2.py passes this one)
    assert tritile.PassConfigKey.TL_REDUCER_FORCE_BASELINE.value == "tl.reducer_force_baseline"
    assert tritile.PassConfigKey.TL_PASS_PROFILE_THRESHOLD_MS.value == "tl.pass_profile_threshold_ms"


def test_disable_warp_specialized_is_honoured():
    assert "warp_specialize(" in attention_kernel().get_source("gluon")
    for configs in ({tritile.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True}, {"tl.disable_warp_specialized": True}):
        assert "warp_specialize(" not in attention_kernel(configs).get_source("gluon")


def test_unknown_pass_config_is_a_ValueError_listing_the_keys():
    with pytest.raises(ValueError, match=r"unknown key 'tl.no_such_thing'; valid keys: .*tl.disable_warp_specialized"):
        transform.normalize({"tl.no_such_thing": True})


def test_a_key_without_meaning_here_warns_once(monkeypatch):
    monkeypatch.setattr(transform, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            transform.normalize({tritile.PassConfigKey.TL_ENABLE_FAST_MATH: True, "tl.disable_warp_specialized": False})
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "'tl.enable_fast_math' has no effect" in messages[0]


def test_cdiv():
    assert [tritile.cdiv(a, 4) for a in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_do_bench_times_a_call_on_the_cpu():
    calls = []
    ms = do_bench(lambda: calls.append(sum(range(10000))), warmup=1, rep=1)
    assert ms > 0 and len(calls) == 4  # one warm-up, three timed (the CPU clock)
    assert len(do_bench(lambda: None, return_mode="all")) == 3
    with pytest.raises(ValueError, match="backend"):
        do_bench(lambda: None, backend="nvprof")


def test_torch_assert_close_allows_a_ratio_of_mismatches():
    a = torch.randn(1000)
    b = a.clone()
    b[:3] += 1.0
    tritile.testing.torch_assert_close(a, b, max_mismatched_ratio=0.005)
    with pytest.raises(AssertionError, match="3 of 1000 elements"):
        tritile.testing.torch_assert_close(a, b, max_mismatched_ratio=0.001)
    with pytest.raises(AssertionError, match="shape"):
        tritile.testing.torch_assert_close(a, b[:10])


def test_set_random_seed_repeats_draws():
    tritile.testing.set_random_seed(7)
    first = torch.randn(4)
    tritile.testing.set_random_seed(7)
    assert torch.equal(first, torch.randn(4))


def test_skip_decorators_follow_the_device():
    have_cuda = torch.cuda.is_available()
    assert tritile.testing.requires_cuda.kwargs["reason"] and tritile.testing.requires_cuda.args == (not have_cuda,)
    never = tritile.testing.requires_cuda_compute_version(99, 0)
    assert never.args == (True,) and ">= 99.0" in never.kwargs["reason"]


@pytest.mark.gpu
def test_driver_reports_the_gpus_sms():
    from tritile.carver.arch import driver

    assert driver.get_num_sms() == torch.cuda.get_device_properties(0).multi_processor_count


def test_utils_tensor_maps_dtype_names_to_torch():
    from tritile.utils.tensor import TensorSupplyType, map_torch_type

    assert TensorSupplyType is tritile.TensorSupplyType
    assert map_torch_type("float16") is torch.float16
    assert map_torch_type("float8_e4m3") is torch.float8_e4m3fn
    with pytest.raises(ValueError, match="nonsense"):
        map_torch_type("nonsense")


def _scaled_copy(factor: float):
    import tritile.language as T

    @T.prim_func
    def main(A: T.Tensor((64,), "float32"), B: T.Tensor((64,), "float32")):
        T.func_attr({"tir.noalias": True})  # TVM's attributes: accepted, no effect here
        with T.Kernel(1, threads=64) as _:
            for i in T.Parallel(64):
                B[i] = A[i] * factor

    return main


def test_func_attr_is_accepted_and_a_non_dict_is_a_CompileError():
    a = torch.randn(64)
    torch.testing.assert_close(tritile.compile(_scaled_copy(2.0), out_idx=[1])(a), a * 2.0)
    import tritile.language as T

    with pytest.raises(tritile.CompileError, match=r"test_tilelang_api.py:\d+: T.func_attr takes a dict"):
        @T.prim_func
        def main(A: T.Tensor((64,), "float32")):
            T.func_attr("tir.noalias")
            with T.Kernel(1, threads=64) as _:
                A[0] = 1.0


def test_disable_cache_compiles_every_kernel_afresh(monkeypatch, tmp_path):
    from tritile.codegen.gluon import compile_kernel

    monkeypatch.setenv("TRITILE_CACHE_DIR", str(tmp_path))
    final = tritile.compile(_scaled_copy(3.0), out_idx=[1], target="cuda:90").func
    target = tritile.compile(_scaled_copy(3.0), out_idx=[1], target="cuda:90").target
    assert tritile.is_cache_enabled()
    first = compile_kernel(final, target)
    assert compile_kernel(final, target) is first  # a cache hit
    modules = sorted((tmp_path / "gluon").glob("k_*.py"))
    assert len(modules) == 1
    tritile.disable_cache()
    try:
        assert not tritile.is_cache_enabled()
        again = compile_kernel(final, target)
        assert again is not first and again.source == first.source
        assert sorted((tmp_path / "gluon").glob("k_*.py")) == modules  # nothing written either
    finally:
        tritile.enable_cache()
    assert compile_kernel(final, target) is first


def test_utils_tensor_get_tensor_supply_and_torch_assert_close():
    """examples/blocksparse_gemm and examples/cast import these from `tilelang.utils.tensor`."""
    from tritile.utils.tensor import TensorSupplyType, get_tensor_supply, torch_assert_close

    class Param:
        shape, dtype = (4, 8), torch.float16

    auto = get_tensor_supply(TensorSupplyType.Auto)(Param())
    assert auto.shape == (4, 8) and auto.dtype == torch.float16 and auto.abs().max() <= 1.0
    ints = get_tensor_supply()(Param())  # TileLang's default: Integer, small integers
    assert torch.equal(ints, ints.round()) and ints.abs().max() <= 2
    assert get_tensor_supply(TensorSupplyType.One)(Param()).eq(1).all()
    assert torch_assert_close is tritile.testing.torch_assert_close
    with pytest.raises(ValueError, match="has no shape"):
        get_tensor_supply()(type("Scalar", (), {"shape": (), "dtype": torch.float32})())


def test_submodules_are_attributes_of_the_package():
    """`tilelang.math.next_power_of_2(...)` after only `import tilelang` (examples/deepseek_nsa)."""
    import subprocess

    code = "import tritile; print(tritile.math.next_power_of_2(33), tritile.profiler.do_bench.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["64", "do_bench"]
    with pytest.raises(AttributeError):
        tritile.no_such_submodule  # noqa: B018


def test_jit_function_get_kernel_source():
    """TileLang's `f.get_kernel_source(**consts)` (examples/deepseek_nsa): `f.compile(...)`'s source."""
    import tritile.language as T

    @tritile.jit
    def scale(A, factor=2.0, block=32):
        n = T.const("n")
        A: T.Tensor((n,), T.float32)
        B = T.empty((n,), T.float32)
        with T.Kernel(T.ceildiv(n, block), threads=128) as bx:
            for i in T.Parallel(block):
                B[bx * block + i] = A[bx * block + i] * factor
        return B

    source = scale.get_kernel_source(n=128, factor=3.0)
    assert source == scale.compile(n=128, factor=3.0).get_kernel_source() and "3.0" in source


def test_eager_compile_and_source_in_the_call_form():
    """TileLang's `f.get_kernel_source(*call_args)` / `f.compile(*call_args)` on an eager kernel
    (examples/deepseek_mhc/example_mhc_post.py): the kernel the call `f(*call_args)` runs, not run."""
    import tritile.language as T

    @tritile.jit
    def axpy(x, y, out, alpha: float, block: int = 32):
        n = T.dynamic("n")
        x: T.Tensor((n, 4), T.float32)
        y: T.Tensor((n, 4), T.bfloat16)
        out: T.Tensor((n, 4), T.float32)
        with T.Kernel(T.ceildiv(n, block), threads=128) as bx:
            for i, j in T.Parallel(block, 4):
                out[bx * block + i, j] = x[bx * block + i, j] * alpha + y[bx * block + i, j]

    x, y = torch.randn(70, 4), torch.randn(70, 4).bfloat16()
    out = torch.empty(70, 4)
    before = out.clone()
    kernel = axpy.compile(x, y, out, 1.5)
    assert torch.equal(out.nan_to_num(), before.nan_to_num())  # compiled, not run
    source = axpy.get_kernel_source(x, y, out, alpha=1.5)
    assert source == kernel.get_kernel_source() and "1.5" in source
    assert axpy.compile(x, y, out, 1.5) is kernel and axpy.kernel_for(x, y, out, 1.5) is kernel
    kernel(x, y, out)
    torch.testing.assert_close(out, x * 1.5 + y.float())
    with pytest.raises(TypeError, match="axpy"):
        axpy.compile(x, y)


def test_autotuned_eager_compile_with_constants_only():
    """examples/blocksparse_gemm: `f.compile(M=M, N=N, K=K, block_M=..., ...)` on an autotuned
    eager kernel, every tuned parameter given: the plain jit's kernel, no tensors needed; none
    given (examples/convolution/example_convolution_autotune.py): tuned on inputs the tuner makes
    (tests/test_autotune.py covers it)."""
    import tritile.language as T

    @tritile.autotune(configs=[{"block": 32}, {"block": 64}])
    @tritile.jit
    def add_one(A, block):
        n = T.const("n")
        A: T.Tensor((n,), T.float32)
        B = T.empty((n,), T.float32)
        with T.Kernel(T.ceildiv(n, block), threads=128) as bx:
            for i in T.Parallel(block):
                B[bx * block + i] = A[bx * block + i] + 1.0
        return B

    kernel = add_one.compile(n=256, block=64)
    a = torch.randn(256)
    torch.testing.assert_close(kernel(a), a + 1.0)
    tuned = add_one.compile(n=256)
    assert tuned.config in ({"block": 32}, {"block": 64})
    torch.testing.assert_close(tuned(a), a + 1.0)


def test_autotuned_eager_compile_on_captured_inputs():
    """examples/deepseek_mhc/example_mhc_bwd.py: `with set_autotune_inputs(R, dR): kernel =
    f.compile(n_stream=16)` on an eager kernel with tuned parameters missing - tuned on the captured
    tensors (its leading parameters); a named `T.const` dim must match their shapes."""
    import tritile.language as T
    from tritile.autotuner import set_autotune_inputs

    @tritile.autotune(configs=[{"block": 16, "threads": 32}, {"block": 32, "threads": 64}], warmup=1, rep=1)
    @tritile.jit
    def scaled_rows(x, y, block: int = 8, threads: int = 128):
        rows = T.dynamic("rows")
        width = T.const("width")
        x: T.Tensor((rows, width), T.float32)
        y: T.Tensor((rows, width), T.float32)
        out = T.empty((rows, width), T.float32)
        with T.Kernel(T.ceildiv(rows, block), threads=threads) as bx:
            for i, j in T.Parallel(block, width):
                out[bx * block + i, j] = x[bx * block + i, j] * 2.0 - y[bx * block + i, j]
        return out

    x, y = torch.randn(48, 16), torch.randn(48, 16)
    with set_autotune_inputs(x, y):
        kernel = scaled_rows.compile(width=16)
    torch.testing.assert_close(kernel(x, y), x * 2.0 - y)
    with set_autotune_inputs(x, y), pytest.raises(ValueError, match="width=8"):
        scaled_rows.compile(width=8)
    with pytest.raises(ValueError, match="parameter 'x' has the runtime dimension rows; the constants do not"):
        scaled_rows.compile(width=16)  # outside the block: no tensors, and `rows` is T.dynamic


def test_env_reads_variables_live_and_forces_assigned_values(monkeypatch, tmp_path):
    # TileLang's examples/minference: `tilelang.env.TILELANG_CACHE_DIR` names a directory
    import tritile.env  # noqa: F401  (keeps the package attribute the object, as TileLang's)

    env_module = sys.modules["tritile.env"]
    env = tritile.env
    assert isinstance(env, env_module.Environment) and env is env_module.env
    assert env_module.TILELANG_CACHE_DIR == env.TILELANG_CACHE_DIR  # the module forwards to the object
    monkeypatch.delenv("TILELANG_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITILE_CACHE_DIR", str(tmp_path / "tritile"))
    assert env.TILELANG_CACHE_DIR == str(tmp_path / "tritile")  # default: tritile's cache directory
    assert env.TILELANG_TMP_DIR == str(tmp_path / "tritile" / "tmp")
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "tl"))
    assert env.TILELANG_CACHE_DIR == str(tmp_path / "tl")  # read at every access
    assert env.TILELANG_TMP_DIR == str(tmp_path / "tl" / "tmp")
    try:
        env.TILELANG_CACHE_DIR = str(tmp_path / "forced")
        assert env.TILELANG_CACHE_DIR == str(tmp_path / "forced")
    finally:
        env_module.Environment.__dict__["TILELANG_CACHE_DIR"].reset()
    assert env.TILELANG_CACHE_DIR == str(tmp_path / "tl")


def test_env_cache_switches_are_tritiles(monkeypatch):
    from tritile.runtime import cache

    env = tritile.env
    monkeypatch.delenv("TILELANG_DISABLE_CACHE", raising=False)
    try:
        env.disable_cache()
        assert not cache.is_cache_enabled() and not env.is_cache_enabled()
        env.enable_cache()
        assert cache.is_cache_enabled() and env.is_cache_enabled()
        monkeypatch.setenv("TILELANG_DISABLE_CACHE", "1")
        assert env.is_cache_globally_disabled() and not env.is_cache_enabled()
    finally:
        cache.enable_cache()
