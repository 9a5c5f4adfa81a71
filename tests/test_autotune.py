"""`@tritile.autotune` above `@tritile.jit`, on CPU (the interpreter, timed with perf_counter).

Kernels are built by factories so each test gets a fresh decorated object (an empty in-memory
cache, like a new process) with the same identity (module, qualname, source), hence the same
disk-cache key.  The disk cache is redirected to tmp_path by an autouse fixture.
"""
import json

import pytest
import torch

import tritile
import tritile.language as T
from kernels import gemm, gemm_eager, gemm_reference, make_operands

GEMM_CONFIGS = [{"block_M": 32, "num_stages": 0}, {"block_M": 64, "num_stages": 2}]
TUNING = dict(warmup=1, rep=1)  # ms: one warmup call, one timed call per config on CPU


@pytest.fixture(autouse=True)
def disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITILE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRITILE_AUTOTUNE_DISABLE_CACHE", raising=False)
    return tmp_path / "autotune"


def make_lazy_gemm(configs=GEMM_CONFIGS, compiled=None, **tune_options):
    """`compiled` (a list) records the config of every compilation: the lazy body runs once per compile."""

    @tritile.autotune(configs=configs, **{**TUNING, **tune_options})
    @tritile.jit(out_idx=[-1])
    def matmul(M, N, K, block_M=64, block_N=64, block_K=32, num_stages=2, dtype="float16"):
        if compiled is not None:
            compiled.append({"block_M": block_M, "num_stages": num_stages})
        return gemm(M, N, K, block_M, block_N, block_K, in_dtype=dtype, out_dtype=dtype, num_stages=num_stages)

    return matmul


def make_eager_gemm(configs=GEMM_CONFIGS, **tune_options):
    return tritile.autotune(configs=configs, **{**TUNING, **tune_options})(tritile.jit(gemm_eager))


def test_lazy_tunes_and_returns_best_kernel(assert_close, disk_cache):
    matmul = make_lazy_gemm(ref_prog=gemm_reference)
    kernel = matmul(64, 64, 64)
    assert isinstance(kernel, tritile.JITKernel)
    result = matmul.last_result
    assert result.source == "tuned" and result.kernel is kernel
    assert [config for config, _, _ in result.records] == GEMM_CONFIGS
    latencies = {tuple(config.items()): latency for config, latency, _ in result.records}
    assert kernel.config in GEMM_CONFIGS and kernel.latency == min(latencies.values()) > 0
    a, b = make_operands(64, 64, 64)
    assert_close(kernel(a, b), gemm_reference(a, b))
    entry = json.loads(next(disk_cache.glob("*.json")).read_text())
    assert GEMM_CONFIGS[entry["config_index"]] == kernel.config
    assert entry["arguments"]["M"] == "64" and "block_M" not in entry["arguments"]


def test_eager_tunes_on_actual_tensors_and_runs_best(assert_close):
    matmul = make_eager_gemm(ref_prog=gemm_reference)
    a, b = make_operands(64, 64, 128)
    a_before = a.clone()
    assert_close(matmul(a, b), gemm_reference(a, b))
    assert torch.equal(a, a_before)  # tuning ran on clones
    result = matmul.last_result
    assert result.config in GEMM_CONFIGS and result.latency > 0 and len(result.records) == 2
    # another shape is another tuning key
    c, d = make_operands(128, 64, 64)
    assert_close(matmul(c, d), gemm_reference(c, d))
    assert matmul.last_result.source == "tuned"


def test_second_call_hits_memory_cache():
    compiled = []
    matmul = make_lazy_gemm(compiled=compiled)
    kernel = matmul(64, 64, 64)
    assert len(compiled) == len(GEMM_CONFIGS)  # the best one is served by @jit's own cache
    assert matmul(M=64, N=64, K=64) is kernel
    assert matmul.last_result.source == "memory" and len(compiled) == len(GEMM_CONFIGS)

    eager = make_eager_gemm()
    a, b = make_operands(64, 64, 64)
    eager(a, b)
    eager(a.clone(), b.clone())
    assert eager.last_result.source == "memory"


def test_fresh_state_reads_disk_cache(assert_close, disk_cache):
    first = make_lazy_gemm()
    best = first(64, 64, 64).config
    assert len(list(disk_cache.glob("*.json"))) == 1

    compiled = []
    fresh = make_lazy_gemm(compiled=compiled)
    kernel = fresh(64, 64, 64)
    assert fresh.last_result.source == "disk" and kernel.config == best
    assert compiled == [best]  # only the cached winner is compiled, nothing is timed
    a, b = make_operands(64, 64, 64)
    assert_close(kernel(a, b), gemm_reference(a, b))

    fresh_eager = make_eager_gemm()
    fresh_eager(*make_operands(64, 64, 64))
    make_eager_gemm()(*make_operands(64, 64, 64))
    assert len(list(disk_cache.glob("*.json"))) == 2


def test_disable_disk_cache_env(monkeypatch, disk_cache):
    monkeypatch.setenv("TRITILE_AUTOTUNE_DISABLE_CACHE", "1")
    make_lazy_gemm()(64, 64, 64)
    fresh = make_lazy_gemm()
    fresh(64, 64, 64)
    assert fresh.last_result.source == "tuned"
    assert not disk_cache.exists()


@pytest.mark.usefixtures("gluon_backend")  # a config that fails in the Gluon backend
def test_config_that_fails_to_compile_is_skipped(assert_close):
    too_big = {"block_M": 64, "block_N": 1024, "block_K": 512, "num_stages": 2}  # exceeds shared memory
    matmul = make_lazy_gemm(configs=[too_big, GEMM_CONFIGS[0]])
    with pytest.warns(UserWarning, match="skipping config .*shared memory"):
        kernel = matmul(64, 64, 64)
    assert kernel.config == GEMM_CONFIGS[0]
    skipped = matmul.last_result.records[0]
    assert skipped[0] == too_big and skipped[1] is None and "compile failed" in skipped[2]
    a, b = make_operands(64, 64, 64)
    assert_close(kernel(a, b), gemm_reference(a, b))

    with pytest.warns(UserWarning, match="skipping config"), pytest.raises(RuntimeError, match="no config"):
        make_eager_gemm(configs=[too_big])(*make_operands(64, 64, 64))


def make_scale(configs, **tune_options):
    @tritile.autotune(configs=configs, **{**TUNING, **tune_options})
    @tritile.jit(out_idx=[-1])
    def scale(M, N, factor=1.0, block=32):
        @T.prim_func
        def main(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32")):
            with T.Kernel(T.ceildiv(M, block)) as bx:
                for i, j in T.Parallel(block, N):
                    Y[bx * block + i, j] = X[bx * block + i, j] * factor

        return main

    return scale


def test_ref_prog_rejects_wrong_configs_and_supply_prog_feeds_inputs(assert_close):
    supplied = []

    def supply(params):
        assert [p.name for p in params] == ["X"]  # outputs are not supplied
        supplied.append(torch.randn(*params[0].shape))
        return [supplied[-1]]

    scale = make_scale([{"factor": 3.0}, {"factor": 2.0, "block": 64}], ref_prog=lambda x: x * 2.0,
                       supply_prog=supply, cache_input_tensors=True)
    with pytest.warns(UserWarning, match="differs from ref_prog"):
        kernel = scale(64, 32)
    assert kernel.config == {"factor": 2.0, "block": 64}
    assert len(supplied) == 1  # cache_input_tensors: one input set for every config
    x = torch.randn(64, 32)
    assert_close(kernel(x), x * 2.0)


def test_callable_configs_get_call_arguments(assert_close):
    scale = make_scale(lambda M, N: [{"block": b} for b in (16, 32, 64) if b <= M])
    kernel = scale(32, 16)
    assert kernel.config in ({"block": 16}, {"block": 32})
    x = torch.randn(32, 16)
    assert_close(kernel(x), x)


def test_explicit_tunable_argument_skips_tuning(assert_close):
    compiled = []
    matmul = make_lazy_gemm(compiled=compiled)
    kernel = matmul(64, 64, 64, block_M=32, num_stages=0)
    assert compiled == [{"block_M": 32, "num_stages": 0}] and matmul.last_result is None
    a, b = make_operands(64, 64, 64)
    assert_close(kernel(a, b), gemm_reference(a, b))

    eager = make_eager_gemm()
    assert_close(eager(a, b, block_M=32), gemm_reference(a, b))
    assert eager.last_result is None


def test_tunable_parameters_without_defaults(assert_close, disk_cache):
    """TileLang's examples tune parameters that have no default (`def flashattn(batch, ...,
    block_N, num_stages)`): every config gives them and the call leaves them out."""

    @tritile.autotune(configs=GEMM_CONFIGS, **TUNING)
    @tritile.jit(out_idx=[-1])
    def matmul(M, N, K, block_M, num_stages, block_N=64, block_K=32):
        return gemm(M, N, K, block_M, block_N, block_K, num_stages=num_stages)

    kernel = matmul(64, 64, 64)
    assert kernel.config in GEMM_CONFIGS
    a, b = make_operands(64, 64, 64)
    assert_close(kernel(a, b), gemm_reference(a, b))
    with pytest.raises(TypeError, match="missing required argument.*'K'"):
        matmul(64, 64)


def test_config_errors():
    with pytest.raises(TypeError, match="'block_X' is not a keyword parameter"):
        make_lazy_gemm(configs=[{"block_M": 32}, {"block_X": 32}])
    with pytest.raises(TypeError, match="'M'.*has no default, so every config must give it"):
        make_lazy_gemm(configs=[{"M": 32}, {"block_M": 32}])
    with pytest.raises(ValueError, match="empty"):
        make_lazy_gemm(configs=[])
    with pytest.raises(TypeError, match="list of dicts"):
        make_lazy_gemm(configs={"block_M": 32})
    with pytest.raises(ValueError, match="empty"):
        make_scale(lambda M, N: [])(32, 32)
    with pytest.raises(TypeError, match="stacked above @tritile.jit"):
        tritile.autotune(configs=[{"block": 32}])(lambda block=32: None)


def test_programmatic_autotuner_from_kernel(tmp_path, monkeypatch):
    """TileLang's `AutoTuner.from_kernel(...).set_compile_args(...).set_profile_args(...).run()`."""
    from tritile.autotuner import AutoTuner

    monkeypatch.setenv("TRITILE_CACHE_DIR", str(tmp_path))

    def elementwise_add(block_M=None, block_N=None):
        @T.prim_func
        def add(A: T.Tensor((64, 64), "float32"), B: T.Tensor((64, 64), "float32"),
                C: T.Tensor((64, 64), "float32")):
            with T.Kernel(T.ceildiv(64, block_N), T.ceildiv(64, block_M), threads=128) as (bx, by):
                for i, j in T.Parallel(block_M, block_N):
                    C[by * block_M + i, bx * block_N + j] = A[by * block_M + i, bx * block_N + j] + \
                        B[by * block_M + i, bx * block_N + j]

        return add

    configs = [{"block_M": 32, "block_N": 32}, {"block_M": 64, "block_N": 64}]
    result = (AutoTuner.from_kernel(kernel=elementwise_add, configs=configs)
              .set_compile_args(out_idx=[-1], target="auto")
              .set_profile_args(ref_prog=lambda a, b: a + b, skip_check=False)
              .run(warmup=1, rep=1))
    assert result.config in configs and result.latency > 0
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    torch.testing.assert_close(result.kernel(a, b), a + b)


def test_set_autotune_inputs_feeds_the_configs(assert_close):
    """TileLang's `with set_autotune_inputs(x):` - the captured tensors are what every config runs
    on (a ref_prog sees them), in place of random inputs or supply_prog (with a warning)."""
    from tritile.autotuner import get_autotune_inputs, set_autotune_inputs

    x = torch.randn(64, 32)
    seen = []

    def reference(inp):
        seen.append(inp)
        return inp * 2.0

    scale = make_scale([{"factor": 3.0}, {"factor": 2.0, "block": 64}], ref_prog=reference,
                       supply_prog=lambda params: [torch.randn(*params[0].shape)])
    assert get_autotune_inputs() is None
    with set_autotune_inputs([x]), pytest.warns(UserWarning, match="supply_prog is ignored"):
        assert get_autotune_inputs() == [x]
        kernel = scale(64, 32)
    assert get_autotune_inputs() is None
    assert seen and all(inp is x for inp in seen)
    assert kernel.config == {"factor": 2.0, "block": 64}
    assert_close(kernel(x), x * 2.0)


def test_compile_returns_the_best_kernel_without_running_it(assert_close):
    """TileLang's `AutoTunedKernel.compile(...)`: the tuned kernel, in both styles."""
    lazy = make_lazy_gemm()
    kernel = lazy.compile(64, 64, 64)
    assert kernel is lazy(64, 64, 64) and kernel.config in GEMM_CONFIGS
    eager = make_eager_gemm()
    a, b = make_operands(64, 64, 64)
    compiled = eager.compile(a, b)
    assert eager.last_result.config in GEMM_CONFIGS
    c = compiled(a, b)  # the eager kernel: its outputs are the T.empty tensors it returns
    assert_close(c, gemm_reference(a, b))
    assert_close(eager(a, b), c)


def test_eager_compile_tunes_from_constants_only(assert_close, disk_cache):
    """TileLang's examples/convolution/example_convolution_autotune.py: `f.compile(M=.., N=.., K=..)`
    on an autotuned eager kernel, no tensors: each config compiled from the constants, run on
    inputs the tuner makes from the kernel's parameters (the profiler's supply: random, not zeros),
    checked against ref_prog and timed; the best config's kernel is returned."""
    configs = GEMM_CONFIGS + [{"block_M": 16, "num_stages": 1}]
    seen = []

    def reference(a, b):
        seen.append((a, b))
        return gemm_reference(a, b)

    eager = make_eager_gemm(configs=configs, ref_prog=reference)
    kernel = eager.compile(M=64, N=32, K=48)
    result = eager.last_result
    assert isinstance(kernel, tritile.JITKernel) and result.source == "tuned"
    assert [config for config, _, _ in result.records] == configs
    assert all(latency > 0 and why is None for _, latency, why in result.records)
    assert kernel.config == result.config in configs and kernel.latency == result.latency
    # fresh inputs per config (cache_input_tensors=False); the last ones also time ref_prog (ref_latency)
    assert len({id(a) for a, _ in seen}) == len(configs) and result.ref_latency > 0
    for a, b in seen:
        assert a.shape == (64, 48) and b.shape == (48, 32) and a.dtype == b.dtype == torch.float16
        assert a.abs().max() > 0 and b.abs().max() > 0 and a.unique().numel() > 10
    a, b = make_operands(64, 32, 48)
    assert_close(kernel(a, b), gemm_reference(a, b))
    entry = json.loads(next(disk_cache.glob("*.json")).read_text())
    assert entry["arguments"]["K"] == "48" and configs[entry["config_index"]] == kernel.config
    # cached: the same constants again in memory, a fresh tuner from disk; other constants tune anew
    assert eager.compile(M=64, N=32, K=48) is kernel and eager.last_result.source == "memory"
    fresh = make_eager_gemm(configs=configs, ref_prog=reference)
    assert fresh.compile(M=64, N=32, K=48).config == kernel.config and fresh.last_result.source == "disk"
    assert fresh.compile(M=32, N=32, K=48).config in configs and fresh.last_result.source == "tuned"
    # a wrong ref_prog skips every config
    wrong = make_eager_gemm(configs=configs, ref_prog=lambda a, b: gemm_reference(a, b) + 1)
    with pytest.warns(UserWarning, match="differs from ref_prog"), pytest.raises(RuntimeError, match="no config"):
        wrong.compile(M=32, N=32, K=32)


def test_eager_compile_from_constants_refuses_undetermined_shapes():
    """A shape the constants do not determine - a `T.const` left out, a `T.dynamic` dim - is a
    ValueError naming the parameter."""
    eager = make_eager_gemm()
    with pytest.raises(ValueError, match=r"shape of parameter 'A'.*T.const 'K'.*pass K="):
        eager.compile(M=64, N=64)
    with pytest.raises(ValueError, match=r"parameter 'A' has the runtime dimension m.*pass the tensors"):
        eager.compile(dynamic_dims=True)


def test_eager_compile_from_constants_with_some_tuned_parameters_skips_tuning(assert_close):
    """TileLang's rule (examples/gemv's `gemv_alloc_reducer.compile(M=.., N=.., block_M=128,
    block_N=128)` with num_stages / threads tuned too): any tuned parameter given, no tuning - the
    kernel of the given values and the other parameters' defaults."""
    partial = make_eager_gemm(configs=[{"block_M": 32, "block_N": 32}, {"block_M": 64, "block_N": 16}])
    kernel = partial.compile(M=64, N=48, K=64, block_M=32)
    assert partial.last_result is None
    a, b = make_operands(64, 48, 64)
    assert_close(kernel(a, b), gemm_reference(a, b))


def test_manual_check_prog_replaces_the_tolerance_check(assert_close):
    """TileLang's `manual_check_prog(outputs, ref_outputs)`: it decides, by raising AssertionError."""
    seen = []

    def strict_on_small_tiles(outputs, references):
        seen.append((len(outputs), len(references)))
        assert_close(outputs[0], references[0])
        assert len(seen) > 1, "the first config is refused"  # a check ref_prog's tolerances cannot express

    matmul = make_lazy_gemm(ref_prog=gemm_reference, manual_check_prog=strict_on_small_tiles)
    with pytest.warns(UserWarning, match="manual_check_prog failed: the first config is refused"):
        kernel = matmul(64, 64, 64)
    assert seen == [(1, 1), (1, 1)] and kernel.config == GEMM_CONFIGS[1]
    assert matmul.last_result.ref_latency > 0  # ref_prog timed on the tuning inputs
    a, b = make_operands(64, 64, 64)
    assert_close(kernel(a, b), gemm_reference(a, b))


def test_early_stop_times_a_hopeless_config_briefly(monkeypatch):
    """`early_stop=True`: a config whose brief timing is over `early_stop_factor` x the best so far
    is not timed in full; the brief time is its record."""
    from tritile.runtime import autotune as autotune_module

    calls = []

    def fake_bench(fn, device, warmup, rep):
        calls.append(rep)
        return 1.0 if rep == TUNING["rep"] else 5.0  # the first config's full timing, then a slow brief one

    monkeypatch.setattr(autotune_module, "_bench", fake_bench)
    matmul = make_lazy_gemm(early_stop=True, early_stop_factor=1.5)
    kernel = matmul(64, 64, 64)
    assert calls == [TUNING["rep"], TUNING["rep"] / 10]  # the second config: the brief timing only
    assert kernel.config == GEMM_CONFIGS[0]
    assert [latency for _, latency, _ in matmul.last_result.records] == [1.0, 5.0]
    with pytest.raises(ValueError, match="early_stop_factor must be >= 1.0"):
        make_lazy_gemm(early_stop=True, early_stop_factor=0.5)


def test_pass_configs_in_a_config_are_compile_options(assert_close, monkeypatch):
    """TileLang's reserved config key `pass_configs`: per config compile options, merged over the
    jit's own, not a kernel parameter."""
    compiled = []
    configs = [dict(config, pass_configs={"tl.disable_warp_specialized": ws}) for config, ws in
               zip(GEMM_CONFIGS, (True, False))]

    @tritile.autotune(configs=configs, ref_prog=gemm_reference, **TUNING)
    @tritile.jit(out_idx=[-1], pass_configs={"tl.disable_tma_lower": True})
    def matmul(M, N, K, block_M=64, block_N=64, block_K=32, num_stages=2):
        return gemm(M, N, K, block_M, block_N, block_K, num_stages=num_stages)

    from tritile.runtime import jit as jit_module
    original = jit_module.JITKernel.__init__

    def recording(self, func, *args, pass_configs=None, **kwargs):
        compiled.append(dict(pass_configs or {}))
        original(self, func, *args, pass_configs=pass_configs, **kwargs)

    monkeypatch.setattr(jit_module.JITKernel, "__init__", recording)
    kernel = matmul(64, 64, 64)
    assert {"tl.disable_tma_lower": True, "tl.disable_warp_specialized": True} in compiled
    assert {"tl.disable_tma_lower": True, "tl.disable_warp_specialized": False} in compiled
    assert kernel.config in configs
    a, b = make_operands(64, 64, 64)
    assert_close(kernel(a, b), gemm_reference(a, b))
    with pytest.raises(TypeError, match="'pass_configs' must be a dict"):
        tritile.autotune(configs=[{"block_M": 32, "pass_configs": 1}])(matmul.jit)(64, 64, 64)
