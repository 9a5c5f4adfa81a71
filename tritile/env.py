"""`tilelang.env` under its TileLang name: the `Environment` object whose attributes read
environment variables live (TileLang's `tilelang/env.py`).

`tilelang.env` is the object `env`: as TileLang's, the package imports this module and binds
the object over it (`sys.modules["tritile.env"]` is the module); the module forwards unknown
attributes to the object.

Each `EnvVar` reads ``os.environ[key]`` at every access, else its default; assigning the
attribute forces a value until `EnvVar.reset` (TileLang's descriptor).  What differs from
TileLang's, because tritile has no TVM / nvcc / CUTLASS:

* ``TILELANG_CACHE_DIR`` defaults to tritile's kernel cache directory (``$TRITILE_CACHE_DIR``,
  else ``~/.cache/tritile``) instead of ``~/.tilelang/cache`` - programs that put their own
  artifacts under it (TileLang's examples/minference builds a torch extension there) keep them
  beside tritile's kernels.  The variable itself still overrides.
* ``enable_cache`` / ``disable_cache`` / ``is_cache_enabled`` are tritile's kernel cache
  switches (`tritile.runtime.cache`); with ``TILELANG_DISABLE_CACHE=1``, ``is_cache_enabled()``
  is False as in TileLang, but tritile's caches follow only ``disable_cache()``.
* ``CUDA_HOME`` is found as torch finds it; TVM / CUTLASS / template paths are read but unused.
"""
from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import Any

_TRUE = ("1", "true", "yes", "on")


def _tritile_cache_dir() -> str:
    from tritile.runtime.cache import cache_dir

    return str(cache_dir())


def _find_cuda_home() -> str | None:
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception:  # noqa: BLE001 - a torch without its extension helpers
        CUDA_HOME = None
    return CUDA_HOME or os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")


@dataclass
class EnvVar:
    """One environment variable: live reads of ``os.environ[key]`` (else `default`, called
    if callable); assigning through the owning object forces a value (TileLang's)."""

    key: str
    default: Any
    _forced_value: Any = None

    def _get_default(self):
        return self.default() if callable(self.default) else self.default

    def get(self):
        if self._forced_value is not None:
            return self._forced_value
        if self.key in os.environ:
            return os.environ[self.key]
        return self._get_default()

    def reset(self) -> None:
        self._forced_value = None

    def __get__(self, instance, owner):
        return self.get()

    def __set__(self, instance, value):
        self._forced_value = value


class _Once:
    """A class attribute computed at its first read (finding CUDA imports torch's helpers)."""

    def __init__(self, compute):
        self.compute = compute

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, instance, owner):
        value = self.compute()
        setattr(owner, self.name, value)
        return value


class Environment:
    """TileLang's environment configuration (the variables and methods its programs read)."""

    CUDA_HOME = _Once(_find_cuda_home)
    ROCM_HOME = os.environ.get("ROCM_PATH") or os.environ.get("ROCM_HOME")
    TILELANG_PACKAGE_PATH = pathlib.Path(__file__).resolve().parent

    CUTLASS_INCLUDE_DIR = EnvVar("TL_CUTLASS_PATH", None)
    COMPOSABLE_KERNEL_INCLUDE_DIR = EnvVar("TL_COMPOSABLE_KERNEL_PATH", None)
    TVM_PYTHON_PATH = EnvVar("TVM_IMPORT_PYTHON_PATH", None)
    TVM_LIBRARY_PATH = EnvVar("TVM_LIBRARY_PATH", None)
    TILELANG_TEMPLATE_PATH = EnvVar("TL_TEMPLATE_PATH", None)
    TILELANG_CACHE_DIR = EnvVar("TILELANG_CACHE_DIR", _tritile_cache_dir)
    TILELANG_TMP_DIR = EnvVar("TILELANG_TMP_DIR", lambda: os.path.join(Environment.TILELANG_CACHE_DIR, "tmp"))

    TILELANG_PRINT_ON_COMPILATION = EnvVar("TILELANG_PRINT_ON_COMPILATION", "1")
    TILELANG_DISABLE_CACHE = EnvVar("TILELANG_DISABLE_CACHE", "0")
    TILELANG_CLEANUP_TEMP_FILES = EnvVar("TILELANG_CLEANUP_TEMP_FILES", "1")
    TILELANG_JIT_DIAGNOSTICS = EnvVar("TILELANG_JIT_DIAGNOSTICS", "0")
    TILELANG_COMPILE_TIMEOUT_SECONDS = EnvVar("TILELANG_COMPILE_TIMEOUT_SECONDS", "")

    TILELANG_AUTO_TUNING_DISABLE_CACHE = EnvVar("TILELANG_AUTO_TUNING_DISABLE_CACHE", "0")
    TILELANG_AUTO_TUNING_CPU_UTILITIES = EnvVar("TILELANG_AUTO_TUNING_CPU_UTILITIES", "0.9")
    TILELANG_AUTO_TUNING_CPU_COUNTS = EnvVar("TILELANG_AUTO_TUNING_CPU_COUNTS", "-1")
    TILELANG_AUTO_TUNING_MAX_CPU_COUNT = EnvVar("TILELANG_AUTO_TUNING_MAX_CPU_COUNT", "-1")

    TILELANG_DEFAULT_TARGET = EnvVar("TILELANG_DEFAULT_TARGET", "auto")
    TILELANG_DEFAULT_EXECUTION_BACKEND = EnvVar("TILELANG_EXECUTION_BACKEND", "auto")
    TILELANG_DEFAULT_VERBOSE = EnvVar("TILELANG_VERBOSE", "0")

    # cache control: tritile's kernel caches
    def is_cache_enabled(self) -> bool:
        from tritile.runtime import cache

        return not self.is_cache_globally_disabled() and cache.is_cache_enabled()

    def enable_cache(self) -> None:
        from tritile.runtime import cache

        cache.enable_cache()

    def disable_cache(self) -> None:
        from tritile.runtime import cache

        cache.disable_cache()

    def is_cache_globally_disabled(self) -> bool:
        return str(self.TILELANG_DISABLE_CACHE).lower() in _TRUE

    def is_autotune_cache_disabled(self) -> bool:
        return str(self.TILELANG_AUTO_TUNING_DISABLE_CACHE).lower() in _TRUE

    def is_print_on_compilation_enabled(self) -> bool:
        return str(self.TILELANG_PRINT_ON_COMPILATION).lower() in _TRUE

    def should_cleanup_temp_files(self) -> bool:
        return str(self.TILELANG_CLEANUP_TEMP_FILES).lower() in _TRUE

    def get_default_target(self):
        return self.TILELANG_DEFAULT_TARGET or "auto"

    def get_default_execution_backend(self) -> str:
        return self.TILELANG_DEFAULT_EXECUTION_BACKEND

    def get_default_verbose(self) -> bool:
        return str(self.TILELANG_DEFAULT_VERBOSE).lower() in _TRUE

    def is_light_import(self) -> bool:
        return False


env = Environment()

enable_cache = env.enable_cache
disable_cache = env.disable_cache
is_cache_enabled = env.is_cache_enabled
ROCM_HOME = env.ROCM_HOME


def __getattr__(name):  # `sys.modules["tritile.env"].X`: CUDA_HOME and the environment's attributes
    try:
        return getattr(env, name)
    except AttributeError:
        raise AttributeError(f"module 'tritile.env' has no attribute {name!r}") from None
