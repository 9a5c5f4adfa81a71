"""TileLang's `tilelang.utils.tensor`: how a profiler supplies inputs, and dtype names to torch.

`TensorSupplyType` is the profiler's own enum (re-exported so that TileLang's import path works).
`get_tensor_supply(kind)` is the profiler's input maker as a function of one parameter (a tensor
`ir.Buffer`, or anything with `.shape` and `.dtype`).
`map_torch_type(name)` maps a dtype name (`"float16"`, `"float8_e4m3"`, a `T.float16`) to the
torch dtype; a name torch does not know is a ValueError naming it.
`torch_assert_close(a, b, rtol, atol, max_mismatched_ratio, ...)`: TileLang's comparison with a
budget of mismatched elements (also `tritile.testing.torch_assert_close`).
"""
from __future__ import annotations

import torch

from tritile.ir import nodes as ir
from tritile.ir.dtypes import element_dtype
from tritile.runtime.profiler import TensorSupplyType, _supply

__all__ = ["TensorSupplyType", "get_tensor_supply", "map_torch_type", "torch_assert_close"]

# TileLang's short fp8 names for torch's OCP ones.
_ALIASES = {"float8_e4m3": "float8_e4m3fn", "float8_e5m2": "float8_e5m2", "bool": "bool"}


def map_torch_type(dtype) -> torch.dtype:
    """The torch dtype named by `dtype` (a string or a tritile dtype, whose `str` is its name)."""
    name = str(dtype)
    found = getattr(torch, _ALIASES.get(name, name), None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"map_torch_type: dtype {name!r} has no torch equivalent")
    return found


def get_tensor_supply(supply_type: TensorSupplyType = TensorSupplyType.Integer):
    """A function making one input tensor for a parameter, as `kernel.get_profiler(supply_type)`
    does (TileLang's `get_tensor_supply`): `param` is a tensor `ir.Buffer` or has `.shape` (ints)
    and `.dtype`; on CUDA when a GPU is present, else on the CPU."""

    def get_tensor(param) -> torch.Tensor:
        buf = param
        if not isinstance(param, ir.Buffer):
            shape = tuple(param.shape)
            if not shape:
                raise ValueError(f"get_tensor_supply: {param!r} has no shape")
            buf = ir.Buffer(getattr(param, "name", "param"), shape, element_dtype(param.dtype), "global")
        return _supply(buf, supply_type, "cuda" if torch.cuda.is_available() else "cpu")

    return get_tensor


def torch_assert_close(tensor_a, tensor_b, rtol: float = 1e-2, atol: float = 1e-3, max_mismatched_ratio: float = 0.001,
                       verbose: bool = False, equal_nan: bool = True, check_device: bool = True,
                       check_dtype: bool = False, base_name: str = "LHS", ref_name: str = "RHS") -> None:
    """Raise AssertionError unless at most `max_mismatched_ratio` of the elements differ by more
    than atol + rtol * |b| (NaN equal to NaN when `equal_nan`)."""
    if check_device and tensor_a.device != tensor_b.device:
        raise AssertionError(f"{base_name} is on {tensor_a.device}, {ref_name} on {tensor_b.device}")
    if check_dtype and tensor_a.dtype != tensor_b.dtype:
        raise AssertionError(f"{base_name} has dtype {tensor_a.dtype}, {ref_name} {tensor_b.dtype}")
    a, b = tensor_a.double(), tensor_b.to(tensor_a.device).double()
    if a.shape != b.shape:
        raise AssertionError(f"{base_name} has shape {tuple(a.shape)}, {ref_name} {tuple(b.shape)}")
    close = torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)
    mismatched = int((~close).sum())
    allowed = int(max_mismatched_ratio * a.numel())
    if verbose:
        print(f"torch_assert_close: {mismatched} of {a.numel()} elements mismatch (allowed {allowed})")
    if mismatched > allowed:
        worst = (a - b).abs().nan_to_num(0.0).max().item()
        raise AssertionError(f"{mismatched} of {a.numel()} elements of {base_name} and {ref_name} differ by more "
                             f"than atol={atol} + rtol={rtol} * |{ref_name}| (allowed {allowed}); largest "
                             f"difference {worst:.4g}")
