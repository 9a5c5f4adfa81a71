"""The examples in examples/ run end to end and pass their own checks against torch.

An example's `main()` picks its device itself (CUDA when available, else the CPU interpreter at
small sizes); the `device` fixture's "cpu" case hides the GPU from it so both paths are covered
on a GPU machine."""
import importlib.util
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NAMES = ["gemm", "flash_attention", "flash_attention_bwd", "gemm_fp8", "flash_decoding"]


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"tritile_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", NAMES)
def test_example_main(name, device, capsys, monkeypatch):
    if device == "cpu":
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    load_example(name).main()
    out = capsys.readouterr().out
    assert "max |tritile - torch|" in out
    assert f"on {device}:" in out


def flash_attention_cuda_config(is_causal: bool):
    """The attention kernel examples/flash_attention.py's main() launches on CUDA."""
    module = load_example("flash_attention")
    return module.flashattn(1, 8, 1024, 1024, 64, is_causal, **module.tile_config("cuda"))


# The kernels the examples' main() launches, with their CUDA tile configs and sizes, for
# tests/test_kernels_compile.py (sm_90 and sm_80).
def flash_attention_bwd_cuda_config(kernel: str, is_causal: bool):
    """A kernel examples/flash_attention_bwd.py's main() launches on CUDA."""
    module = load_example("flash_attention_bwd")
    config = module.tile_config("cuda", 64, is_causal)
    if kernel == "fwd":
        return module.flashattn_fwd(2, 4, 1024, 64, is_causal, **config["fwd"])
    if kernel == "preprocess":
        return module.flashattn_bwd_preprocess(2, 4, 1024, 64)
    return module.flashattn_bwd(2, 4, 1024, 64, is_causal, **config["bwd"])


COMPILE_CASES = {
    "gemm-cuda_config": lambda: load_example("gemm").build_matmul_kernel(1024, 1024, 1024, "cuda"),
    "flash_attention-cuda_config-full": lambda: flash_attention_cuda_config(False),
    "flash_attention-cuda_config-causal": lambda: flash_attention_cuda_config(True),
    "flash_attention_bwd-fwd_lse-causal": lambda: flash_attention_bwd_cuda_config("fwd", True),
    "flash_attention_bwd-preprocess": lambda: flash_attention_bwd_cuda_config("preprocess", False),
    "flash_attention_bwd-bwd-full": lambda: flash_attention_bwd_cuda_config("bwd", False),
    "flash_attention_bwd-bwd-causal": lambda: flash_attention_bwd_cuda_config("bwd", True),
    "flash_decoding-split": lambda: load_example("flash_decoding").decode_split(
        8, 64, 8, 32768, 128, **load_example("flash_decoding").tile_config("cuda", 8, 8, 32768)),
    "flash_decoding-combine": lambda: load_example("flash_decoding").decode_combine(8, 64, 4, 128),
    "flash_decoding-fused": lambda: load_example("flash_decoding").decode_fused(
        8, 64, 8, 32768, 128, **load_example("flash_decoding").tile_config("cuda", 8, 8, 32768)),
    "flash_decoding-fused-unsplit": lambda: load_example("flash_decoding").decode_fused(
        64, 32, 8, 8192, 128, **load_example("flash_decoding").tile_config("cuda", 64, 8, 8192)),
    "gemm_fp8-cuda_config": lambda: load_example("gemm_fp8").gemm_fp8(1024, 1024, 4096,
                                                                      **load_example("gemm_fp8").tile_config("cuda")),
}
