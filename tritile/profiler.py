"""`tilelang.profiler` under its TileLang name: `do_bench` and the `Profiler` of
`kernel.get_profiler()` (both in `tritile.runtime.profiler`)."""
from tritile.runtime.profiler import Profiler, TensorSupplyType, do_bench  # noqa: F401
