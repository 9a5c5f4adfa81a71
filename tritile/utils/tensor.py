"""TileLang's `tilelang.utils.tensor`: how a profiler supplies inputs, and dtype names to torch.

`TensorSupplyType` is the profiler's own enum (re-exported so that TileLang's import path works).
`map_torch_type(name)` maps a dtype name (`"float16"`, `"float8_e4m3"`, a `T.float16`) to the
torch dtype; a name torch does not know is a ValueError naming it.
"""
from __future__ import annotations

import torch

from tritile.runtime.profiler import TensorSupplyType

__all__ = ["TensorSupplyType", "map_torch_type"]

# TileLang's short fp8 names for torch's OCP ones.
_ALIASES = {"float8_e4m3": "float8_e4m3fn", "float8_e5m2": "float8_e5m2", "bool": "bool"}


def map_torch_type(dtype) -> torch.dtype:
    """The torch dtype named by `dtype` (a string or a tritile dtype, whose `str` is its name)."""
    name = str(dtype)
    found = getattr(torch, _ALIASES.get(name, name), None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"map_torch_type: dtype {name!r} has no torch equivalent")
    return found
