"""Compilation targets: the CPU reference interpreter, CUDA compute capabilities and AMD GPUs.

`Target("cuda", 90)` / `Target("hip", "gfx942")`: `arch` is the compute capability (an int) on
NVIDIA, the gfx name on AMD.  Only the triton.language backend compiles for "hip"."""
from __future__ import annotations

from dataclasses import dataclass

# Opt-in dynamic shared memory per block (bytes), from the CUDA programming guide.
_SHARED_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024, 120: 99 * 1024,
                 # LDS per workgroup (AMD CDNA3 / CDNA4 ISA guides)
                 "gfx942": 64 * 1024, "gfx950": 160 * 1024}


@dataclass(frozen=True)
class Target:
    kind: str  # "cuda" | "hip" | "cpu"
    arch: object = 90  # compute capability (int) for cuda, gfx name for hip; the planned-for arch on cpu

    @property
    def warp_size(self) -> int:
        return 64 if self.kind == "hip" else 32

    @property
    def shared_memory_limit(self) -> int:
        return _SHARED_LIMIT.get(self.arch, 99 * 1024)

    @property
    def has_wgmma(self) -> bool:
        return self.kind == "cuda" and self.arch == 90

    @property
    def has_tma(self) -> bool:
        return self.kind == "cuda" and self.arch >= 90

    def __str__(self) -> str:
        return f"{self.kind}:{self.arch}" if self.kind in ("cuda", "hip") else "cpu"


def parse_target(spec="auto") -> Target:
    """Accepts "auto", "cpu", "cuda", "cuda:90", "sm_80", "hip", "hip:gfx942", {"kind": "cuda", "arch":
    "sm_90"} or a Target.  "auto" means the current GPU (CUDA or ROCm) when there is one, else the CPU
    interpreter; "hip" the current AMD GPU, else gfx942."""
    if isinstance(spec, Target):
        return spec
    if isinstance(spec, dict) and spec.get("kind") == "hip":
        return Target("hip", str(spec.get("arch", "gfx942")))
    if isinstance(spec, dict):
        arch = str(spec.get("arch", "sm_90")).replace("sm_", "").rstrip("a")
        return Target(spec.get("kind", "cuda"), int(arch))
    if not isinstance(spec, str):
        raise TypeError(f"target must be a string, a dict or a Target, got {type(spec).__name__}")
    spec = spec.strip().lower()
    if spec == "auto":
        import torch

        if torch.cuda.is_available():
            return _current_device()
        return Target("cpu")
    if spec in ("cpu", "llvm", "interpreter"):
        return Target("cpu")
    if spec.startswith("hip"):
        if ":" in spec:
            return Target("hip", spec.split(":", 1)[1])
        import torch

        if torch.cuda.is_available() and torch.version.hip:
            return _current_device()
        return Target("hip", "gfx942")
    if spec.startswith("sm_"):
        return Target("cuda", int(spec[3:].rstrip("a")))
    if spec.startswith("cuda"):
        if ":" in spec:
            return Target("cuda", int(spec.split(":", 1)[1].replace("sm_", "").rstrip("a")))
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return Target("cuda", major * 10 + minor)
        return Target("cuda", 90)
    raise ValueError(f"unknown target {spec!r}; use 'auto', 'cpu', 'cuda', 'cuda:90', 'sm_80', 'hip' or 'hip:gfx942'")


def _current_device() -> Target:
    """The current torch GPU: an AMD one (a ROCm build) by its gfx name, else its compute capability."""
    import torch

    if torch.version.hip:
        return Target("hip", torch.cuda.get_device_properties(torch.cuda.current_device()).gcnArchName.split(":")[0])
    major, minor = torch.cuda.get_device_capability()
    return Target("cuda", major * 10 + minor)
