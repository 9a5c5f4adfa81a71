"""TileLang's `tilelang.contrib.nvcc` helpers that ask which GPU a program targets.

tritile compiles through Triton, never NVCC: only the compute-capability queries are here
(`get_target_compute_version`, `parse_compute_version`, `get_target_arch`, `have_fp16`, `have_int8`,
`have_tensorcore`); `compile_cuda` and friends raise."""
from __future__ import annotations

from ..runtime.target import Target, parse_target


def get_target_compute_version(target=None) -> str:
    """The compute capability as "major.minor" ("9.0"): of `target` (a tritile target spec such as
    "cuda:90", "sm_90a", {"kind": "cuda", "arch": "sm_90"} or a Target) when given, else of the current
    CUDA device; ValueError when neither names one."""
    if target is not None:
        t = parse_target(target) if not isinstance(target, Target) else target
        if t.kind == "cuda":
            return f"{t.arch // 10}.{t.arch % 10}"
    import torch

    if torch.cuda.is_available() and not torch.version.hip:
        major, minor = torch.cuda.get_device_capability()
        return f"{major}.{minor}"
    raise ValueError("No CUDA architecture was specified or GPU detected. Specify it with a target such as "
                     "'cuda:90' or {'kind': 'cuda', 'arch': 'sm_90'}.")


def parse_compute_version(compute_version) -> tuple[int, int]:
    """"9.0" -> (9, 0)."""
    try:
        major, minor = str(compute_version).split(".")[:2]
        return int(major), int(minor)
    except ValueError as err:
        raise RuntimeError("Compute version parsing error") from err


def get_target_arch(compute_version) -> str:
    """"9.0" or (9, 0) -> "90a" (the arch-specific suffix from 9.0 on, as TileLang)."""
    major, minor = parse_compute_version(compute_version) if isinstance(compute_version, str) else compute_version
    return f"{major * 10 + minor}" + ("a" if major >= 9 else "")


def have_fp16(compute_version) -> bool:
    major, minor = parse_compute_version(compute_version)
    return (major == 5 and minor >= 3) or major >= 6


def have_int8(compute_version) -> bool:
    return parse_compute_version(compute_version)[0] >= 6


def have_tensorcore(compute_version=None, target=None) -> bool:
    if compute_version is None:
        compute_version = get_target_compute_version(target)
    return parse_compute_version(compute_version)[0] >= 7


def compile_cuda(*args, **kwargs):
    raise NotImplementedError("tritile compiles through Triton, not NVCC: tilelang.contrib.nvcc.compile_cuda "
                              "has no tritile equivalent")
