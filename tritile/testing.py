"""`tilelang.testing` under its TileLang name: what TileLang's test files call.

* `main()` - runs pytest on the calling file (a test file's ``if __name__ == "__main__"``);
* `set_random_seed(seed)` - torch's (CPU and CUDA), Python's and numpy's generators;
* `torch_assert_close(a, b, rtol, atol, max_mismatched_ratio, ...)` - like
  `torch.testing.assert_close` but allowing a ratio of mismatched elements (TileLang's
  signature);
* skip decorators: `requires_cuda`, `requires_cuda_or_cdna` (no AMD GPU is supported by the run-
  time here, so CUDA), `requires_cuda_compute_version(major, minor=0)` (at least) and
  `requires_cuda_compute_version_le` / `_lt` / `_ge` / `_gt` / `_eq`.
"""
from __future__ import annotations

import inspect
import random
import sys

import pytest
import torch


def main() -> None:
    caller = inspect.stack()[1].filename
    sys.exit(pytest.main([caller, *sys.argv[1:]]))


def set_random_seed(seed: int = 42) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed)


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


def _compute_version():
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
requires_cuda_or_cdna = requires_cuda


def _requires_version(compare, symbol):
    def decorator_factory(major: int, minor: int = 0):
        version = _compute_version()
        ok = version is not None and compare(version, (major, minor))
        return pytest.mark.skipif(not ok, reason=f"needs a CUDA GPU of compute capability {symbol} {major}.{minor}")

    return decorator_factory


requires_cuda_compute_version = _requires_version(lambda have, want: have >= want, ">=")
requires_cuda_compute_version_ge = requires_cuda_compute_version
requires_cuda_compute_version_gt = _requires_version(lambda have, want: have > want, ">")
requires_cuda_compute_version_le = _requires_version(lambda have, want: have <= want, "<=")
requires_cuda_compute_version_lt = _requires_version(lambda have, want: have < want, "<")
requires_cuda_compute_version_eq = _requires_version(lambda have, want: have == want, "==")
