"""Compilation targets: the CPU reference interpreter and CUDA compute capabilities."""
from __future__ import annotations

from dataclasses import dataclass

# Opt-in dynamic shared memory per block (bytes), from the CUDA programming guide.
_SHARED_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}


@dataclass(frozen=True)
class Target:
    kind: str  # "cuda" | "cpu"
    arch: int = 90  # compute capability for cuda; the planned-for arch on cpu

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
        return f"{self.kind}:{self.arch}" if self.kind == "cuda" else "cpu"


def parse_target(spec="auto") -> Target:
    """Accepts "auto", "cpu", "cuda", "cuda:90", "sm_80", {"kind": "cuda", "arch": "sm_90"} or a Target.
    "auto" means the current CUDA device when there is one, else the CPU interpreter."""
    if isinstance(spec, Target):
        return spec
    if isinstance(spec, dict):
        arch = str(spec.get("arch", "sm_90")).replace("sm_", "").rstrip("a")
        return Target(spec.get("kind", "cuda"), int(arch))
    if not isinstance(spec, str):
        raise TypeError(f"target must be a string, a dict or a Target, got {type(spec).__name__}")
    spec = spec.strip().lower()
    if spec == "auto":
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return Target("cuda", major * 10 + minor)
        return Target("cpu")
    if spec in ("cpu", "llvm", "interpreter"):
        return Target("cpu")
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
    raise ValueError(f"unknown target {spec!r}; use 'auto', 'cpu', 'cuda', 'cuda:90' or 'sm_80'")
