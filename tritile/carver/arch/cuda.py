"""`CUDA`, TileLang's NVIDIA device for the carver (`tilelang/carver/arch/cuda.py`), and its
predicates (`is_volta_arch`, `is_ampere_arch`, `is_hopper_arch`, `has_mma_support`, ...).

Mirrored: the attributes (`sm_version`, `smem_cap`, `compute_max_core`, `warp_size`, `reg_cap`,
`max_smem_usage`, `sm_partition`, `l2_cache_size_bytes`, `transaction_size`, `bandwidth`,
`platform` "CUDA", `compute_capability` "90", `available_tensor_instructions`) and the predicates.
Simplified: the target is tritile's (`"cuda"`, `"cuda:80"`, `"sm_90"`, a `Target`), not a TVM
Target; the numbers come from torch.cuda when the current device is of the target's compute
capability, otherwise from `known_devices` (no device: an H100 for "cuda"), so
`CUDA("cuda")` works on a machine without a GPU where TileLang raises.  `smem_cap` is the
opt-in per-block shared memory (TileLang's is the 48 KiB static default, with
`max_smem_usage` twice that); `peak_tflops` / `memory_bandwidth_GBps` are added (see
`arch_base`).
"""
from __future__ import annotations

import re

from tritile.carver.arch.arch_base import TileDevice
from tritile.carver.arch.known_devices import DeviceSpec, cuda_spec
from tritile.runtime.target import Target, parse_target

_SM_VERSION_PATTERN = re.compile(r"^(?:sm_)?(\d+)[a-zA-Z]*$")


def check_sm_version(arch: str) -> int:
    """The compute capability of "sm_90" / "sm_90a" / "90" (90), -1 for anything else ("gfx942")."""
    match = _SM_VERSION_PATTERN.match(str(arch))
    return int(match.group(1)) if match else -1


def is_cuda_arch(arch: TileDevice) -> bool:
    return isinstance(arch, CUDA)


def is_volta_arch(arch: TileDevice) -> bool:
    return is_cuda_arch(arch) and 70 <= arch.sm_version < 80


def is_ampere_arch(arch: TileDevice) -> bool:
    return is_cuda_arch(arch) and 80 <= arch.sm_version < 89


def is_ada_arch(arch: TileDevice) -> bool:
    return is_cuda_arch(arch) and arch.sm_version == 89


def is_hopper_arch(arch: TileDevice) -> bool:
    return is_cuda_arch(arch) and arch.sm_version == 90


def has_mma_support(arch: TileDevice) -> bool:
    return is_cuda_arch(arch) and arch.sm_version >= 80


volta_tensorcore_supported = [("float16", "float32"), ("float16", "float16")]
ampere_tensorcore_supported = [("bfloat16", "float32"), ("float16", "float32"), ("float16", "float16"),
                               ("int8", "int32"), ("int4", "int32"), ("int2", "int32"), ("int1", "int32")]
ada_tensorcore_supported = [("bfloat16", "float32"), ("float16", "float32"), ("float16", "float16"),
                            ("int8", "int32"), ("float8_e5m2", "float32"), ("float8_e4m3", "float32")]
hopper_tensorcore_supported = ada_tensorcore_supported


def is_tensorcore_supported_precision(in_dtype: str, accum_dtype: str, arch: TileDevice) -> bool:
    """Whether (in_dtype, accum_dtype) runs on `arch`'s tensor cores (TileLang's tables; sm_100 and
    newer as Hopper)."""
    pair = (str(in_dtype).replace("float8_e4m3fn", "float8_e4m3"), str(accum_dtype))
    if is_volta_arch(arch):
        return pair in volta_tensorcore_supported
    if is_ampere_arch(arch):
        return pair in ampere_tensorcore_supported
    if is_ada_arch(arch):
        return pair in ada_tensorcore_supported
    if is_cuda_arch(arch) and arch.sm_version >= 90:
        return pair in hopper_tensorcore_supported
    raise ValueError(f"Unsupported architecture: {arch}")


class TensorInstruction:
    def __init__(self, name: str, shape: list[int]):
        self.name = name
        self.shape = shape  # M and N of the instruction


def _current_device_properties(sm_version: int):
    """torch.cuda's properties of the current device when it is an NVIDIA GPU of `sm_version`."""
    import torch

    if not torch.cuda.is_available() or torch.version.hip:
        return None
    major, minor = torch.cuda.get_device_capability()
    if major * 10 + minor != sm_version:
        return None
    return torch.cuda.get_device_properties(torch.cuda.current_device())


class CUDA(TileDevice):
    def __init__(self, target: Target | str = "cuda"):
        super().__init__()
        self.target = parse_target(target)
        if self.target.kind != "cuda":
            raise ValueError(f"CUDA(): {target!r} is not a CUDA target")
        self.sm_version = check_sm_version(str(self.target.arch))
        spec: DeviceSpec = cuda_spec(self.sm_version)
        props = _current_device_properties(self.sm_version)
        self.platform = "CUDA"
        self.compute_capability = str(self.sm_version)
        self.describe(props, spec, getattr(props, "shared_memory_per_block_optin", spec.smem_per_block), [750, 12080])
        self.smem_per_sm = getattr(props, "shared_memory_per_multiprocessor", spec.smem_per_sm)
        self.reg_cap = getattr(props, "regs_per_multiprocessor", spec.regs_per_sm)
        self.available_tensor_instructions = None

    def get_avaliable_tensorintrin_shapes(self):
        self.available_tensor_instructions = (TensorInstruction("mma", [16, 16]), TensorInstruction("wmma", [16, 16]))
        return [t.shape for t in self.available_tensor_instructions]

    def __repr__(self) -> str:
        return f"CUDA({self.target})"


__all__ = ["is_cuda_arch", "is_volta_arch", "is_ampere_arch", "is_ada_arch", "is_hopper_arch",
           "is_tensorcore_supported_precision", "has_mma_support", "check_sm_version", "CUDA"]
