"""tritile: TileLang's tile programming model on Triton's toolchain."""
from tritile.errors import CompileError, HazardError  # noqa: F401
from tritile.env import env  # noqa: F401  (TileLang's: the `Environment` object over its submodule)
from tritile import tvm_import

tvm_import.install()

__version__ = "0.1.0"


def __getattr__(name):
    # The runtime imports the frontend and backends; load it on first use so that
    # `import tritile.language as T` stays cheap.
    if name in ("jit", "compile", "JITKernel"):
        from tritile.runtime import jit as _jit

        return getattr(_jit, name)
    if name == "TensorSupplyType":
        from tritile.runtime.profiler import TensorSupplyType

        return TensorSupplyType
    if name == "autotune":
        from tritile.runtime.autotune import autotune

        return autotune
    if name in ("disable_cache", "enable_cache", "is_cache_enabled"):
        from tritile.runtime import cache

        return getattr(cache, name)
    if name == "DataType":  # TileLang's `from tilelang import DataType` (TVM's)
        from tritile.tvm import DataType

        return DataType
    if name == "PassConfigKey":
        from tritile.transform import PassConfigKey

        return PassConfigKey
    if name in _SUBMODULES:  # `tilelang.math.next_power_of_2(...)` with only `import tilelang`
        import importlib

        return importlib.import_module(f"tritile.{name}")
    raise AttributeError(f"module 'tritile' has no attribute {name!r}")


# submodules TileLang's programs reach as attributes of the package
_SUBMODULES = ("autotuner", "carver", "contrib", "cuda", "engine", "language", "layout", "math", "profiler", "testing",
               "tools", "transform", "tvm", "utils")


def cdiv(a: int, b: int) -> int:
    """`ceil(a / b)` for integers (TileLang's `tilelang.cdiv`)."""
    return -(-a // b)
