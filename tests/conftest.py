"""Project-wide pytest configuration.

Tests marked ``@pytest.mark.gpu`` need a CUDA device; on a machine without one they are
skipped (not failed), so the same suite runs on CPU-only CI and on GPU boxes.  Everything
else runs on CPU tensors, i.e. through the reference interpreter.

The `device` fixture runs a kernel test twice: on "cpu" tensors (the reference interpreter)
and on "cuda" tensors (the Gluon kernel; that parameter carries the `gpu` mark).  A test
creates its inputs on `device` and computes its torch reference on the same device.

The `assert_close` fixture compares a kernel's result with a torch reference at the tolerance of
the result's dtype (fp16/bf16 1e-2, fp32 1e-4, relative and absolute).
"""
import os

import pytest
import torch
from hypothesis import settings


def pytest_collection_modifyitems(config, items):
    _scale_hypothesis_examples(items)
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is false)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def _scale_hypothesis_examples(items):
    """`TRITILE_HYPOTHESIS_SCALE=k` multiplies every hypothesis test's `max_examples` by k (a
    thorough local or GPU run; CI keeps 1).  Each test pins its own count with `@settings`,
    which a hypothesis profile cannot override, so the count is scaled on the collected test:
    `given` reads `_hypothesis_internal_use_settings` when the test runs."""
    scale = float(os.environ.get("TRITILE_HYPOTHESIS_SCALE", "1"))
    if scale == 1:
        return
    for item in items:
        test = getattr(item, "obj", None)
        current = getattr(test, "_hypothesis_internal_use_settings", None)
        if current is not None and getattr(test, "is_hypothesis_test", False):
            test._hypothesis_internal_use_settings = settings(
                current, max_examples=max(1, round(current.max_examples * scale)))


@pytest.fixture
def gluon_backend(monkeypatch):
    """Tests of the Gluon backend's own generated code, caches and schedules run on it whatever
    `TRITILE_BACKEND` says (CI also runs the kernel suites with TRITILE_BACKEND=triton)."""
    monkeypatch.setenv("TRITILE_BACKEND", "gluon")


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> str:
    """The torch device a kernel test runs on: "cpu" (interpreter) or "cuda" (Gluon kernel)."""
    return request.param


# Relative (and absolute) tolerance by the dtype of the result: one rounding of a half-precision
# output is ~4e-3, fp32 results differ from torch only by summation order.
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float32: 1e-4, torch.float64: 1e-8}


@pytest.fixture
def assert_close():
    """`assert_close(actual, expected)`: same shape and dtype, values within the dtype's tolerance."""

    def check(actual: torch.Tensor, expected: torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual).__name__}"
        assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
        tol = TOLERANCE.get(expected.dtype, 0.0)
        torch.testing.assert_close(actual.float(), expected.float(), rtol=tol, atol=tol)

    return check


@pytest.fixture
def gemm_kernel_requests(monkeypatch) -> list:
    """What `tritile.mm` / `tritile.bmm` ask their GEMM kernels for, one entry per kernel compiled:
    (A contiguous, B contiguous, trans_A, trans_B); the ops' remembered kernels forgotten first."""
    from tritile.ops import matmul as tritile_matmul
    from tritile.ops.signatures import Remembered

    requests = []
    monkeypatch.setattr(tritile_matmul, "_gemms", Remembered())
    for kernel_fn in (tritile_matmul.matmul, tritile_matmul.batched_matmul):
        def spy(x, y, kernel_for=kernel_fn.kernel_for, **kwargs):
            requests.append((x.is_contiguous(), y.is_contiguous(), kwargs["trans_A"], kwargs["trans_B"]))
            return kernel_for(x, y, **kwargs)

        monkeypatch.setattr(kernel_fn, "kernel_for", spy)
    return requests
