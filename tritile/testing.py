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

from tritile.utils.tensor import torch_assert_close  # noqa: F401  (TileLang exports it from both)


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
