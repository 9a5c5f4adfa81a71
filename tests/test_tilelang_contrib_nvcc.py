"""`tilelang.contrib.nvcc`'s compute-capability helpers (examples/flash_attention/example_gqa_bwd_tma_reduce*.py)."""
import pytest

from tritile.runtime.target import Target
from tritile.contrib import nvcc


def test_compute_version_of_targets():
    assert nvcc.get_target_compute_version("cuda:90") == "9.0"
    assert nvcc.get_target_compute_version("sm_86") == "8.6"
    assert nvcc.get_target_compute_version({"kind": "cuda", "arch": "sm_90a"}) == "9.0"
    assert nvcc.get_target_compute_version(Target("cuda", 100)) == "10.0"
    assert nvcc.parse_compute_version("8.9") == (8, 9)
    assert nvcc.get_target_arch("9.0") == "90a" and nvcc.get_target_arch((8, 0)) == "80"
    assert nvcc.have_tensorcore("8.0") and not nvcc.have_tensorcore("6.1")
    assert nvcc.have_fp16("5.3") and not nvcc.have_fp16("5.2") and nvcc.have_int8("6.1")
    with pytest.raises(RuntimeError):
        nvcc.parse_compute_version("sm90")


def test_compute_version_of_the_device(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    assert nvcc.get_target_compute_version() == "9.0"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="No CUDA architecture"):
        nvcc.get_target_compute_version()
