"""`tilelang.carver.arch`: the devices the carver plans for (`CUDA`, `CDNA`, their predicates,
`get_arch`, `auto_infer_current_arch`) and `driver`'s queries of the current CUDA device.
TileLang's RDNA / METAL / CPU devices are not provided."""
from __future__ import annotations

from tritile.carver.arch import driver  # noqa: F401
from tritile.carver.arch.arch_base import TileDevice
from tritile.carver.arch.cdna import CDNA, is_cdna_arch
from tritile.carver.arch.cuda import (CUDA, check_sm_version, has_mma_support, is_ada_arch, is_ampere_arch,
                                      is_cuda_arch, is_hopper_arch, is_tensorcore_supported_precision,
                                      is_volta_arch)
from tritile.runtime.target import Target, parse_target


def get_arch(target: Target | str = "cuda") -> TileDevice:
    """The device of `target`: `CUDA` for a CUDA target, `CDNA` for a HIP one."""
    target = parse_target(target)
    if target.kind == "cuda":
        return CUDA(target)
    if target.kind == "hip":
        return CDNA(target)
    raise ValueError(f"Unsupported target: {target} (the carver plans for CUDA and HIP devices)")


def auto_infer_current_arch() -> TileDevice:
    """The current GPU's device; without one an H100 (`CUDA("cuda")`), since tritile's CPU
    interpreter runs programs planned for sm_90."""
    import torch

    if torch.cuda.is_available() and torch.version.hip:
        return CDNA("hip")
    return CUDA("cuda")


__all__ = ["TileDevice", "CUDA", "CDNA", "get_arch", "auto_infer_current_arch", "is_cuda_arch", "is_volta_arch",
           "is_ampere_arch", "is_ada_arch", "is_hopper_arch", "is_tensorcore_supported_precision",
           "has_mma_support", "is_cdna_arch", "check_sm_version"]
