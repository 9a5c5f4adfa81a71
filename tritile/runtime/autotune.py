"""`@tritile.autotune`: TileLang's autotuner, stacked above `@tritile.jit`.

    @tritile.autotune(configs=[{"block_M": 64, "num_stages": 2}, ...], warmup=25, rep=100)
    @tritile.jit(out_idx=[-1])
    def matmul(M, N, K, block_M=128, num_stages=3): ...

Contract:
* `configs` is a non-empty list of dicts, or a callable returning one when given the call's
  arguments.  Every key is a keyword parameter of the jitted function (the "tunable"
  parameters); otherwise TypeError naming the key.  A tunable parameter without a default (as
  TileLang's examples write them: `def flashattn(batch, ..., block_N, num_stages)`) must be in
  every config, and the call leaves it out.  An empty list -> ValueError.
* A call that passes any tunable parameter explicitly skips tuning: it is the plain jit call.
* Lazy style (the function returns a `@T.prim_func`): `f(M, N, K)` tunes and returns the best
  `JITKernel`, with `.config` (the chosen dict) and `.latency` (ms) set on it.  Inputs are
  `supply_prog(params)` (params = the kernel's input `Buffer`s, each with `.shape` and `.dtype`)
  or tensors of the params' shapes and dtypes made as the profiler makes them, of `supply_type`
  (TileLang's; default `TensorSupplyType.Auto`: uniform(-1, 1) floats, small integers; a
  `T.dynamic` dimension needs `supply_prog`).
* `with set_autotune_inputs(a, b, c):` (or a list) - TileLang's capture: a lazy-style tuning
  inside it runs every config on those tensors, in place of `supply_prog` (warned) or random
  ones; the capture is per thread and nests.
* Eager style (the body is the kernel): `f(a, b)` tunes on clones of the actual tensors (so
  in-place kernels do not accumulate into the caller's data), then runs the best config on the
  caller's tensors and returns its outputs.  `supply_prog` is not used.
* `f.compile(*args, **kwargs)` returns the best config's `JITKernel` without running it (both
  styles).  Eager style from constants only (TileLang's `f.compile(M=M, N=N, K=K)`, no tensor
  among the arguments, the `T.const` dims by name): any tuned parameter given, the plain jit's
  kernel (the others at their defaults: TileLang skips tuning then too); none, each config is compiled from the constants and run as a lazy-style one, on
  `supply_prog(params)` or `supply_type` tensors of the kernel's parameter shapes and dtypes (or,
  inside `set_autotune_inputs`, on the captured tensors as its leading parameters).  A `T.const`
  left out, or a `T.dynamic` dim (the constants do not give the shape), is a ValueError naming
  the parameter.
* `f.tune(*args, **kwargs)` returns the `AutotuneResult` of a call without running it (eager) or
  with the kernel in `.kernel` (lazy); `f.last_result` is the result of the latest call.
* Per config: compile (and, eager, the first run); a config that raises `CompileError` (or,
  on CUDA, Triton's compilation / out-of-resources errors) is skipped with a warning; with
  `ref_prog` and not `skip_check`, outputs must match `ref_prog(*inputs)` within rtol/atol or
  the config is skipped; then timed: `triton.testing.do_bench(fn, warmup, rep,
  return_mode="median")` on CUDA, a few `time.perf_counter` reps of the interpreter on CPU.
  `timeout` (seconds) is checked between those phases - Python cannot pre-empt a running
  compile - and a config over it is skipped.  The fastest config wins; if none survives,
  RuntimeError lists why each failed.
* `manual_check_prog(outputs, ref_outputs)` (with `ref_prog`, not `skip_check`) replaces the
  rtol/atol comparison: it gets both lists of outputs and fails a config by raising
  AssertionError.  `early_stop=True`: once a config has been timed, each later one is first
  timed briefly (a tenth of `rep`), and one slower than `early_stop_factor` (>= 1) times the best
  so far is not timed in full (it cannot win); its record keeps the brief time.
* A config may hold `"pass_configs": {...}` (TileLang's reserved key): not a kernel parameter,
  the compile options of that config's kernel, merged over the jit's own `pass_configs`.
* `cache_input_tensors=True` generates the tuning inputs (and reference outputs) once and
  reuses them for every config; otherwise each config gets fresh ones.
* Results are cached in memory per decorated function and on disk as JSON under
  `$TRITILE_CACHE_DIR/autotune` (default `~/.cache/tritile/autotune`), keyed by the kernel's
  identity (module, qualname, hash of its source), the non-tuned arguments (tensors by shape
  and dtype), the configs, the jit target, the device name and the tritile version.
  `TRITILE_AUTOTUNE_DISABLE_CACHE=1` disables the disk cache; `f.clear_cache()` empties the
  in-memory one.  A damaged entry (unreadable, not JSON, not one of the configs) is removed with
  a `CacheWarning` naming it, and the call tunes again; a result that cannot be written (the
  directory is read-only, a file, ...) is kept in memory, with one `CacheWarning` per directory.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import json
import os
import statistics
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import torch

import tritile
from tritile import switches
from tritile.errors import CompileError
from tritile.runtime import cache
from tritile.frontend import probe_const_dims
from tritile.ir.printer import expr_str
from tritile.runtime.jit import COMPILE_OPTIONS, EagerJIT, LazyJIT
from tritile.runtime.kernel import JITKernel
from tritile.runtime.profiler import TensorSupplyType, supply_inputs
from tritile.runtime.target import parse_target

__all__ = ["autotune", "AutotuneResult", "AutoTunedKernel"]

# Interpreter runs take tens of milliseconds or more: a few timed reps are enough to rank configs.
_CPU_MAX_REPS = 3


@dataclasses.dataclass
class AutotuneResult:
    """The outcome of tuning one call signature.

    `config`: the chosen tunable arguments; `latency`: its time in ms; `kernel`: the best
    `JITKernel` (lazy style; None for eager); `source`: "tuned", "memory" or "disk";
    `records`: (config, latency ms or None, why it was skipped or None) per config tried
    (empty when the result came from a cache); `ref_latency`: `ref_prog`'s latency (ms) on the
    tuning inputs, timed as the configs are, where it ran (None otherwise)."""

    config: dict
    latency: float
    kernel: Optional[JITKernel] = None
    source: str = "tuned"
    records: list = dataclasses.field(default_factory=list)
    ref_latency: Optional[float] = None


class _ConfigFailed(Exception):
    """A config that cannot be used (compile error, wrong result, timeout); tuning goes on."""


class AutoTunedKernel:
    """The object `@tritile.autotune` returns; see the module docstring."""

    def __init__(self, jit_fn, configs, warmup, rep, timeout, ref_prog, supply_prog, rtol, atol, skip_check,
                 cache_input_tensors, supply_type=TensorSupplyType.Auto, manual_check_prog=None, early_stop=False,
                 early_stop_factor=2.0):
        if not isinstance(jit_fn, (LazyJIT, EagerJIT)):
            raise TypeError(f"@tritile.autotune must be stacked above @tritile.jit, got {type(jit_fn).__name__}")
        self.jit = jit_fn
        self.signature = inspect.signature(jit_fn.fn)
        self.configs = configs
        self.warmup, self.rep, self.timeout = warmup, rep, timeout
        self.ref_prog, self.supply_prog, self.supply_type = ref_prog, supply_prog, supply_type
        self.rtol, self.atol, self.skip_check = rtol, atol, skip_check
        self.cache_input_tensors = cache_input_tensors
        self.manual_check_prog = manual_check_prog
        if early_stop and early_stop_factor < 1.0:
            raise ValueError(f"autotune: early_stop_factor must be >= 1.0, got {early_stop_factor}")
        self.early_stop_factor = early_stop_factor if early_stop else None
        self.last_result: Optional[AutotuneResult] = None
        self._results = {}  # cache key -> AutotuneResult
        self.__name__ = jit_fn.__name__
        self.__doc__ = jit_fn.__doc__
        self.__wrapped__ = jit_fn
        self._identity = _kernel_identity(jit_fn.fn)
        if not callable(configs):
            self._check_configs(configs)

    # ---------------------------------------------------------------- calls
    def __call__(self, *args, **kwargs):
        bound = self._bind(args, kwargs)
        configs = self._configs_for(args, kwargs)
        if set(bound.arguments) & self._tunable_names(configs):
            return self.jit(*args, **kwargs)
        self._check_complete(bound, configs)
        result = self._result_for(bound, configs)
        if isinstance(self.jit, LazyJIT):
            return result.kernel
        return self.jit(*args, **kwargs, **self._call_config(result.config))

    def tune(self, *args, **kwargs) -> AutotuneResult:
        """Tune (or fetch from the caches) without running the best kernel."""
        bound = self._bind(args, kwargs)
        configs = self._configs_for(args, kwargs)
        tuned = sorted(set(bound.arguments) & self._tunable_names(configs))
        if tuned:
            raise TypeError(f"{self.__name__}.tune(): {', '.join(tuned)} are tuned; don't pass them")
        self._check_complete(bound, configs)
        return self._result_for(bound, configs)

    def compile(self, *args, **kwargs) -> JITKernel:
        """TileLang's `AutoTunedKernel.compile`: tune (or fetch) and return the best config's
        kernel without running it; eager style: the kernel a call with these tensors runs."""
        if isinstance(self.jit, LazyJIT):
            return self(*args, **kwargs)
        if not any(isinstance(v, torch.Tensor) for v in (*args, *kwargs.values())):
            return self._compile_from_constants(args, kwargs)
        result = self.tune(*args, **kwargs)
        return self.jit.kernel_for(*args, **kwargs, **self._call_config(result.config))

    def _compile_from_constants(self, args: tuple, kwargs: dict) -> JITKernel:
        """TileLang's `f.compile(M=M, N=N, K=K, ...)` on an eager-style kernel: constants only
        (`T.const` dims by name).  Any tuned parameter given: the plain jit's kernel; none:
        tuned on the tensors of an enclosing `set_autotune_inputs`, else each config compiled from
        the constants and run on inputs made from the kernel's parameters (`_ConstantsTrial`)."""
        configs = self._configs_for(args, kwargs)
        dims = {name: value for name, value in kwargs.items() if name not in self.signature.parameters}
        bound = self._bind(args, {name: value for name, value in kwargs.items() if name not in dims})
        tunable = self._tunable_names(configs)
        if tunable & set(bound.arguments):  # TileLang's rule: any tuned parameter given, no tuning
            return self.jit.compile(**bound.arguments, **dims)
        captured = get_autotune_inputs()
        if captured is not None and not args:
            return self._compile_on_captured(captured, kwargs)
        runtime = [name for name in self.jit.runtime_params if name in bound.arguments]
        if runtime:
            raise TypeError(f"{self.__name__}.compile(): {', '.join(runtime)} take tensors; tuning from constants "
                            f"only passes none")
        self._check_complete(bound, configs, exempt=self.jit.runtime_params)
        consts = {name: value for name, value in {**bound.arguments, **dims}.items() if name not in COMPILE_OPTIONS}
        undetermined = probe_const_dims(self.jit.fn, {**consts, **_kernel_parameters(configs[0])})
        if undetermined:
            name, (position, dim) = next(iter(undetermined.items()))
            raise ValueError(f"{self.__name__}.compile(): the constants do not give the shape of parameter "
                             f"'{self.jit.runtime_params[position]}': its dimension {dim} is T.const {name!r}; pass "
                             f"{name}=..., or the tensors")
        result = self._result_for(bound, configs, dims)
        kernel = self.jit.compile(**bound.arguments, **dims, **self._call_config(result.config))
        kernel.config, kernel.latency = result.config, result.latency
        return kernel

    def _compile_on_captured(self, captured: list, kwargs: dict) -> JITKernel:
        """`with set_autotune_inputs(a, b): f.compile(n=16)` on an eager-style kernel
        (examples/deepseek_mhc/example_mhc_bwd.py): tuned on the captured tensors, passed as its
        leading parameters; the `T.const` dims named among `kwargs` must match their shapes."""
        dims = {name: kwargs.pop(name) for name in list(kwargs) if name not in self.signature.parameters}
        if dims:  # checked before any config is tuned
            bound = self.signature.bind_partial(*captured, **kwargs)
            consts = {name: value for name, value in bound.arguments.items() if not isinstance(value, torch.Tensor)}
            first = self._configs_for(captured, kwargs)[0]
            for name, (position, dim) in probe_const_dims(self.jit.fn, {**consts, **first}).items():
                if name in dims and int(captured[position].shape[dim]) != dims[name]:
                    raise ValueError(f"{self.__name__}.compile(): {name}={dims[name]} but the captured autotune "
                                     f"input {position} has {name} = {int(captured[position].shape[dim])}")
        return self.compile(*captured, **kwargs)

    def clear_cache(self) -> None:
        """Forget the in-memory results (the disk cache is kept)."""
        self._results.clear()

    # ---------------------------------------------------------------- configs
    def _bind(self, args, kwargs) -> inspect.BoundArguments:
        """The call's arguments; parameters without a default may be missing only if the configs
        give them (checked by `_check_complete` once the configs are known)."""
        try:
            return self.signature.bind_partial(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.__name__}(): {exc}") from None

    def _check_complete(self, bound: inspect.BoundArguments, configs, exempt=()) -> None:
        tunable = self._tunable_names(configs)
        missing = [name for name, p in self.signature.parameters.items()
                   if p.default is p.empty and name not in bound.arguments and name not in tunable
                   and name not in exempt and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if missing:
            raise TypeError(f"{self.__name__}(): missing required argument(s) {', '.join(map(repr, missing))}")

    def _configs_for(self, args, kwargs) -> list:
        if not callable(self.configs):
            return self.configs
        configs = self.configs(*args, **kwargs)
        self._check_configs(configs)
        return configs

    def _check_configs(self, configs) -> None:
        if not isinstance(configs, (list, tuple)):
            raise TypeError(f"autotune configs of {self.__name__} must be a list of dicts (or a callable returning "
                            f"one), got {type(configs).__name__}")
        if not configs:
            raise ValueError(f"autotune configs of {self.__name__} is empty")
        params = self.signature.parameters
        for config in configs:
            if not isinstance(config, dict):
                raise TypeError(f"autotune config {config!r} of {self.__name__} must be a dict")
            if not isinstance(config.get(PASS_CONFIGS_KEY, {}), dict):
                raise TypeError(f"autotune config {config!r} of {self.__name__}: {PASS_CONFIGS_KEY!r} must be a dict")
            for key in _kernel_parameters(config):
                param = params.get(key)
                if param is None or param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
                    raise TypeError(f"autotune config key {key!r} is not a keyword parameter of {self.__name__}"
                                    f"({', '.join(params)})")
                if param.default is param.empty and any(key not in other for other in configs):
                    raise TypeError(f"autotune config key {key!r}: parameter {key!r} of {self.__name__} has no "
                                    f"default, so every config must give it")

    @staticmethod
    def _tunable_names(configs) -> set:
        return {key for config in configs for key in _kernel_parameters(config)}

    def _call_config(self, config: dict) -> dict:
        """A config as a call's keywords: its `pass_configs` merged over the jit's own."""
        if PASS_CONFIGS_KEY not in config:
            return config
        merged = {**(self.jit.options.get("pass_configs") or {}), **config[PASS_CONFIGS_KEY]}
        return {**config, PASS_CONFIGS_KEY: merged}

    # ---------------------------------------------------------------- caches
    def _result_for(self, bound: inspect.BoundArguments, configs, dims: Optional[dict] = None) -> AutotuneResult:
        """`dims`: tuning an eager-style kernel from constants only, its `T.const` dims given by name."""
        device = self._device(bound)
        key, description = self._cache_key(bound, configs, device, dims)
        result = self._results.get(key)
        if result is not None:
            result = dataclasses.replace(result, source="memory", records=[])
        else:
            result = self._load(key, configs, bound) or self._tune(bound, configs, device, dims)
            self._results[key] = result
            if result.source == "tuned":
                self._store(key, description, configs, result)
        if result.kernel is not None:  # TileLang exposes the tuning outcome on the kernel itself
            result.kernel.config, result.kernel.latency = result.config, result.latency
        self.last_result = result
        return result

    def _cache_key(self, bound, configs, device: torch.device, dims: Optional[dict] = None):
        tunable = self._tunable_names(configs)
        arguments = {name: _describe(value) for name, value in _with_defaults(bound).items() if name not in tunable}
        if dims is not None:  # from constants only: no tensors, the dims instead
            arguments = {**{name: _describe(value) for name, value in dims.items()}, **arguments}
            arguments["<from constants>"] = True
        description = {
            "kernel": self._identity[0],
            "source_sha256": self._identity[1],
            "arguments": arguments,
            "configs": _describe(list(configs)),
            "target": _describe(self.jit.options["target"]),
            "device": _device_name(device),
            "tritile": tritile.__version__,
        }
        key = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:32]
        return key, description

    def _load(self, key: str, configs, bound) -> Optional[AutotuneResult]:
        if _disk_cache_disabled():
            return None
        path = _cache_path(key)
        try:
            entry = json.loads(path.read_bytes().decode())
            index, latency = int(entry["config_index"]), float(entry["latency_ms"])
            if not 0 <= index < len(configs):  # the key covers the configs: only damage gets here
                raise ValueError(f"config_index {index} is not one of the {len(configs)} configs")
        except (FileNotFoundError, NotADirectoryError):
            return None  # not tuned yet, or no usable cache directory (reported when storing)
        except (OSError, ValueError, KeyError, TypeError) as err:
            cache.warn(f"discarded tritile's autotune cache entry {path} ({type(err).__name__}: {err}); tuning again")
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        config = configs[index]
        kernel = self._lazy_kernel(bound, config) if isinstance(self.jit, LazyJIT) else None
        return AutotuneResult(config, latency, kernel, source="disk")

    def _store(self, key: str, description: dict, configs, result: AutotuneResult) -> None:
        if _disk_cache_disabled():
            return
        entry = dict(description, config_index=configs.index(result.config),
                     config=_describe(result.config), latency_ms=result.latency)
        path = _cache_path(key)
        try:  # atomic: concurrent tuners never see a half-written entry
            cache.write_atomic(path, json.dumps(entry, indent=1, sort_keys=True).encode())
        except OSError as err:
            cache.warn_unusable(path.parent, err, "tuning results are kept in memory only")

    # ---------------------------------------------------------------- tuning
    def _device(self, bound) -> torch.device:
        tensors = [v for v in bound.arguments.values() if isinstance(v, torch.Tensor)]
        if isinstance(self.jit, EagerJIT) and tensors:
            return tensors[0].device
        target = parse_target(self.jit.options["target"])
        on_gpu = target.kind == "cuda" and torch.cuda.is_available()
        return torch.device("cuda" if on_gpu else "cpu")

    def _lazy_kernel(self, bound, config: dict) -> JITKernel:
        return self.jit(*bound.args, **bound.kwargs, **self._call_config(config))

    def _tune(self, bound, configs, device: torch.device, dims: Optional[dict] = None) -> AutotuneResult:
        if dims is not None:
            trial = _ConstantsTrial(self, bound, device, dims)
        else:
            trial = (_LazyTrial if isinstance(self.jit, LazyJIT) else _EagerTrial)(self, bound, device)
        records, best = [], None
        progress = _Progress(f"autotune {self.__name__}", len(configs))
        try:
            for config in configs:
                try:
                    baseline = None if best is None or self.early_stop_factor is None else best[1] * self.early_stop_factor
                    latency = trial.run(config, baseline)
                except _ConfigFailed as exc:
                    warnings.warn(f"autotune {self.__name__}: skipping config {config}: {exc}",
                                  stacklevel=_user_stacklevel())
                    records.append((config, None, str(exc)))
                else:
                    records.append((config, latency, None))
                    if best is None or latency < best[1]:
                        best = (config, latency)
                progress.step(None if best is None else best[1])
        finally:
            progress.close()
        if best is None:
            reasons = "\n".join(f"  {config}: {why}" for config, _, why in records)
            raise RuntimeError(f"autotune {self.__name__}: no config could be used:\n{reasons}")
        config, latency = best
        return AutotuneResult(config, latency, trial.kernel_for(config), source="tuned", records=records,
                              ref_latency=trial.ref_latency())


class _Trial:
    """Compiles, checks and times one config at a time for one call signature.

    Subclasses define `prepare(config)` (compile; returns what `launch` runs), `make_inputs`,
    `ref_args(inputs)` (the tensors `ref_prog` gets), `compatible(inputs, prepared)` (may
    cached inputs be reused), `launch(prepared, inputs)` and `kernel_for(config)`."""

    def __init__(self, tuner: AutoTunedKernel, bound, device: torch.device):
        self.tuner, self.bound, self.device = tuner, bound, device
        self._cached = None  # (inputs, reference outputs), reused with cache_input_tensors

    def run(self, config: dict, baseline: Optional[float] = None) -> float:
        """The config's latency (ms); `baseline`: early stop - a brief timing above it is returned
        as it is."""
        tuner = self.tuner
        start = time.perf_counter()
        try:
            prepared = self.prepare(config)
        except _compile_errors() as exc:
            raise _ConfigFailed(f"compile failed: {exc}") from exc
        self._check_time(start, "compile")
        inputs, expected = self._inputs(prepared)
        if expected is not None:
            actual = _as_list(self.launch(prepared, inputs))
            if tuner.manual_check_prog is not None:
                try:
                    tuner.manual_check_prog(actual, expected)
                except AssertionError as exc:
                    raise _ConfigFailed(f"manual_check_prog failed: {str(exc).strip()[:200]}") from None
            else:
                _compare(actual, expected, tuner.rtol, tuner.atol)
            self._check_time(start, "the correctness check")
        if baseline is not None:
            estimate = _bench(lambda: self.launch(prepared, inputs), self.device, min(tuner.warmup, 1.0), tuner.rep / 10)
            if estimate > baseline:
                return estimate
        latency = _bench(lambda: self.launch(prepared, inputs), self.device, tuner.warmup, tuner.rep)
        self._check_time(start, "benchmarking")
        return latency

    def ref_latency(self) -> Optional[float]:
        """`ref_prog`'s latency on the last inputs it checked a config against, or None."""
        if self._cached is None or self._cached[1] is None:
            return None
        tuner, args = self.tuner, self.ref_args(self._cached[0])
        return _bench(lambda: tuner.ref_prog(*args), self.device, tuner.warmup, tuner.rep)

    def _check_time(self, start: float, phase: str) -> None:
        elapsed = time.perf_counter() - start
        if elapsed > self.tuner.timeout:
            raise _ConfigFailed(f"timed out after {phase} ({elapsed:.1f} s > timeout={self.tuner.timeout} s)")

    def _inputs(self, prepared):
        tuner = self.tuner
        if tuner.cache_input_tensors and self._cached is not None and self.compatible(self._cached[0], prepared):
            return self._cached
        inputs = self.make_inputs(prepared)
        expected = None
        if tuner.ref_prog is not None and not tuner.skip_check:
            expected = _as_list(tuner.ref_prog(*self.ref_args(inputs)))
        self._cached = (inputs, expected)
        return self._cached


_captured = threading.local()  # .stack: the tensors of the enclosing set_autotune_inputs blocks


@contextlib.contextmanager
def set_autotune_inputs(*tensors):
    """TileLang's `set_autotune_inputs(a, b, c)` / `([a, b, c])`: the inputs lazy-style tuning
    runs its configs on inside the block."""
    inputs = list(tensors[0]) if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)) else list(tensors)
    stack = _captured.__dict__.setdefault("stack", [])
    stack.append(inputs)
    try:
        yield
    finally:
        stack.pop()


def get_autotune_inputs() -> Optional[list]:
    stack = getattr(_captured, "stack", None)
    return stack[-1] if stack else None


class _LazyTrial(_Trial):
    """Lazy style: the config's `JITKernel`, run on `supply_prog` or random inputs."""

    def prepare(self, config) -> JITKernel:
        return self.tuner._lazy_kernel(self.bound, config)

    kernel_for = prepare

    # what to do about a parameter the tuner cannot make an input for
    no_shape_advice = "pass supply_prog= to give the tuning inputs"

    def make_inputs(self, kernel: JITKernel) -> list:
        params = _input_params(kernel)
        captured = get_autotune_inputs()
        if captured is not None:
            if self.tuner.supply_prog is not None:
                warnings.warn("supply_prog is ignored inside `with set_autotune_inputs(...)`", stacklevel=2)
            return list(captured)
        if self.tuner.supply_prog is not None:
            return list(self.tuner.supply_prog(params))
        for param in params:
            dynamic = [dim for dim in param.shape if not isinstance(dim, int)]
            if dynamic:
                raise ValueError(f"autotune {self.tuner.__name__}: parameter '{param.name}' has the runtime dimension "
                                 f"{expr_str(dynamic[0])}; {self.no_shape_advice}")
        return supply_inputs(kernel, self.tuner.supply_type, self.device, "autotune")

    @staticmethod
    def ref_args(inputs: list) -> list:
        return inputs

    @staticmethod
    def compatible(inputs: list, kernel: JITKernel) -> bool:
        wanted = [(tuple(p.shape), p.dtype.torch) for p in _input_params(kernel)]
        return [(tuple(t.shape), t.dtype) for t in inputs] == wanted

    @staticmethod
    def launch(kernel: JITKernel, inputs: list):
        return kernel(*inputs)


class _ConstantsTrial(_LazyTrial):
    """Eager style from constants only (`f.compile(M=M, N=N, K=K)`): each config's kernel
    compiled from the constants (the call's and the `T.const` dims), then run as a lazy-style
    config is, on inputs made from its parameters."""

    no_shape_advice = ("the constants do not determine it (T.dynamic); pass the tensors, or tune inside "
                       "`with set_autotune_inputs(...)`")

    def __init__(self, tuner: AutoTunedKernel, bound, device: torch.device, dims: dict):
        super().__init__(tuner, bound, device)
        self.dims = dims

    def prepare(self, config) -> JITKernel:
        return self.tuner.jit.compile(**self.bound.arguments, **self.dims, **self.tuner._call_config(config))

    kernel_for = prepare


class _EagerTrial(_Trial):
    """Eager style: `f(**arguments, **config)` on clones of the caller's tensors."""

    def prepare(self, config) -> dict:
        self.launch(config, self.make_inputs(config))  # the first call compiles (and may raise)
        return config

    def make_inputs(self, _config) -> dict:
        return {name: value.clone() if isinstance(value, torch.Tensor) else value
                for name, value in self.bound.arguments.items()}

    @staticmethod
    def ref_args(inputs: dict) -> list:
        return [value for value in inputs.values() if isinstance(value, torch.Tensor)]

    @staticmethod
    def compatible(_inputs: dict, _config: dict) -> bool:
        return True  # every config runs on the same call's tensors

    def launch(self, config: dict, inputs: dict):
        return self.tuner.jit(**inputs, **self.tuner._call_config(config))

    @staticmethod
    def kernel_for(_config):
        return None


# -------------------------------------------------------------------- helpers
def _input_params(kernel: JITKernel) -> list:
    return [p for i, p in enumerate(kernel.params) if i not in kernel.out_idx]


def _user_stacklevel() -> int:
    """The `stacklevel` that makes a warning issued by the caller point at the first frame outside
    this module (`f(...)`, `f.compile(...)`, `f.tune(...)` reach the tuning at different depths)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    return level


def _as_list(outputs) -> list:
    if outputs is None:
        return []
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


PASS_CONFIGS_KEY = "pass_configs"  # TileLang's reserved config key: compile options, not a parameter


def _kernel_parameters(config: dict) -> dict:
    return {key: value for key, value in config.items() if key != PASS_CONFIGS_KEY}


def _compare(actual: list, expected: list, rtol: float, atol: float) -> None:
    if len(actual) != len(expected):
        raise ValueError(f"autotune: the kernel returns {len(actual)} outputs but ref_prog returns {len(expected)}")
    for index, (a, e) in enumerate(zip(actual, expected)):
        try:
            torch.testing.assert_close(a.float(), e.to(a.device).float(), rtol=rtol, atol=atol)
        except AssertionError as exc:
            first_line = str(exc).strip().splitlines()[0]
            raise _ConfigFailed(f"output {index} differs from ref_prog: {first_line}") from None


def _bench(fn: Callable, device: torch.device, warmup: float, rep: float) -> float:
    """Median latency of `fn` in ms."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    if warmup > 0:
        fn()
    times, budget = [], rep / 1e3
    while len(times) < _CPU_MAX_REPS and (not times or sum(times) < budget):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _compile_errors() -> tuple:
    """What marks a config as unbuildable: ours, and Triton's when it compiles/launches on CUDA."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources

    return CompileError, CompilationError, OutOfResources


def _kernel_identity(fn) -> tuple:
    """(module.qualname, sha256 of the source): an edited kernel never reuses old tuning results."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = repr(fn.__code__.co_code)
    return f"{fn.__module__}.{fn.__qualname__}", hashlib.sha256(source.encode()).hexdigest()


def _with_defaults(bound: inspect.BoundArguments) -> dict:
    """The call's arguments with defaults filled in, so f(64) and f(M=64) share a cache entry."""
    full = inspect.BoundArguments(bound.signature, bound.arguments.copy())
    full.apply_defaults()
    return dict(full.arguments)


def _describe(value) -> Any:
    """A JSON-able description: tensors by shape and dtype, containers recursively, else repr."""
    if isinstance(value, torch.Tensor):
        return f"Tensor({list(value.shape)}, {value.dtype})"
    if isinstance(value, dict):
        return {str(k): _describe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, *(_describe(v) for v in value)]
    return repr(value)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        name = f"cuda:{torch.cuda.get_device_name(device)}"
        # interpreter timings on a GPU say nothing about the compiled kernels
        return name + (" (interpreted)" if switches.interpret_requested() else "")
    return device.type


def _disk_cache_disabled() -> bool:
    return os.environ.get("TRITILE_AUTOTUNE_DISABLE_CACHE", "0") not in ("", "0")


def _cache_path(key: str) -> Path:
    return cache.cache_dir() / "autotune" / f"{key}.json"


class _Progress:
    """tqdm when it is installed, else one line on stderr rewritten in place."""

    def __init__(self, title: str, total: int):
        self.title, self.total, self.done = title, total, 0
        try:
            from tqdm import tqdm
        except ImportError:
            self._bar = None
            self._show(None)
        else:
            self._bar = tqdm(total=total, desc=title, unit="config", leave=False)

    def step(self, best_ms: Optional[float]) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)
            if best_ms is not None:
                self._bar.set_postfix(best_ms=f"{best_ms:.4g}")
        else:
            self._show(best_ms)

    def _show(self, best_ms: Optional[float]) -> None:
        best = "" if best_ms is None else f", best {best_ms:.4g} ms"
        sys.stderr.write(f"\r{self.title}: {self.done}/{self.total} configs{best}")
        sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\n")


def autotune(configs=None, warmup: float = 25, rep: float = 100, timeout: float = 100, ref_prog=None,
             supply_prog=None, rtol: float = 1e-2, atol: float = 1e-2, skip_check: bool = False,
             cache_input_tensors: bool = False, supply_type: TensorSupplyType = TensorSupplyType.Auto,
             manual_check_prog=None, early_stop: bool = False, early_stop_factor: float = 2.0):
    """`@tritile.autotune(configs=...)` above `@tritile.jit` (TileLang's keywords); see the module
    docstring for the semantics.  `warmup`/`rep` are in ms (do_bench's), `timeout` in seconds."""
    if configs is None:
        raise ValueError("autotune needs configs=[{...}, ...] (or a callable returning them)")

    def decorate(jit_fn) -> AutoTunedKernel:
        return AutoTunedKernel(jit_fn, configs, warmup, rep, timeout, ref_prog, supply_prog, rtol, atol,
                               skip_check, cache_input_tensors, supply_type, manual_check_prog, early_stop,
                               early_stop_factor)

    return decorate
