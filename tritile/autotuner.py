"""`tritile.autotuner.AutoTuner`: TileLang's programmatic autotuning form.

    result = (AutoTuner.from_kernel(kernel=fn, configs=[{...}, ...])
              .set_compile_args(out_idx=[-1], target="auto")
              .set_profile_args(ref_prog=ref, skip_check=False)
              .run(warmup=3, rep=20))
    result.kernel, result.config, result.latency

`fn(**config)` returns a `@T.prim_func`; its tuned parameters must have defaults (TileLang's
`def kernel(block_M=None, ...)`).  It is `@tritile.autotune(...)` above `@tritile.jit(...)` with
the same caches; `run` returns that decorator's `AutotuneResult`.  TileLang's profiling
`backend=` ("event" / "cupti" / "cudagraph") and `run`'s scheduling options (`use_pipeline`,
`enable_grouped_compile`, `group_compile_size`, `benchmark_multi_gpu`, `benchmark_devices`) are
accepted and have no effect: configurations compile and run one after another on one device,
timed by `tritile.profiler.do_bench`.
"""
from __future__ import annotations

from tritile.runtime.autotune import AutotuneResult, autotune, get_autotune_inputs, set_autotune_inputs  # noqa: F401
from tritile.runtime.jit import jit


class AutoTuner:
    def __init__(self, fn, configs):
        self.fn = fn
        self.configs = configs
        self.compile_args = {}
        self.profile_args = {}

    @classmethod
    def from_kernel(cls, kernel, configs) -> "AutoTuner":
        return cls(kernel, configs)

    def set_compile_args(self, out_idx=None, target="auto", target_host=None, execution_backend=None,
                         verbose=False, pass_configs=None) -> "AutoTuner":
        self.compile_args = dict(out_idx=out_idx, target=target, execution_backend=execution_backend,
                                 verbose=verbose, pass_configs=pass_configs)
        return self

    def set_profile_args(self, supply_type=None, ref_prog=None, supply_prog=None, rtol=1e-2, atol=1e-2,
                         skip_check=False, cache_input_tensors=False, backend="event",
                         manual_check_prog=None) -> "AutoTuner":
        self.profile_args = dict(ref_prog=ref_prog, supply_prog=supply_prog, rtol=rtol, atol=atol,
                                 skip_check=skip_check, cache_input_tensors=cache_input_tensors,
                                 manual_check_prog=manual_check_prog)
        if supply_type is not None:  # the profiler's TensorSupplyType; default Auto
            self.profile_args["supply_type"] = supply_type
        return self

    def run(self, warmup: float = 25, rep: float = 100, timeout: float = 100, use_pipeline: bool = False,
            enable_grouped_compile: bool = False, group_compile_size: int = 2, benchmark_devices=None,
            benchmark_multi_gpu: bool = False, early_stop: bool = False,
            early_stop_factor: float = 2.0) -> AutotuneResult:
        tuned = autotune(configs=self.configs, warmup=warmup, rep=rep, timeout=timeout, early_stop=early_stop,
                         early_stop_factor=early_stop_factor, **self.profile_args)(jit(**self.compile_args)(self.fn))
        return tuned.tune()
