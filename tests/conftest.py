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
import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is false)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


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
