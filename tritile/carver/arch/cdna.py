"""`CDNA`, TileLang's AMD Instinct device for the carver (`tilelang/carver/arch/cdna.py`).

Mirrored: the attributes (`platform` "CDNA", `smem_cap` = LDS per workgroup, `compute_max_core`
= CUs, `warp_size` 64, `reg_cap`, `max_smem_usage`, `l2_cache_size_bytes`, `bandwidth`).
Simplified as `CUDA` is: tritile's target ("hip", "hip:gfx942"), numbers from torch.cuda on a
ROCm build with a device of that gfx name, else from `known_devices` (no device: an MI300X,
gfx942), where TileLang raises without a device.
"""
from __future__ import annotations

from tritile.carver.arch.arch_base import TileDevice
from tritile.carver.arch.known_devices import cdna_spec
from tritile.runtime.target import Target, parse_target


def is_cdna_arch(arch: TileDevice) -> bool:
    return isinstance(arch, CDNA)


def _current_device_properties(gfx: str):
    import torch

    if not torch.cuda.is_available() or not torch.version.hip:
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return props if props.gcnArchName.split(":")[0] == gfx else None


class CDNA(TileDevice):
    def __init__(self, target: Target | str = "hip"):
        super().__init__()
        self.target = parse_target(target)
        if self.target.kind != "hip":
            raise ValueError(f"CDNA(): {target!r} is not a HIP target")
        gfx = str(self.target.arch)
        spec = cdna_spec(gfx)
        props = _current_device_properties(gfx)
        self.platform = "CDNA"
        self.compute_capability = gfx[3:5] if gfx.startswith("gfx") else gfx  # "94" for gfx942, as TileLang's "9.4"
        lds = getattr(props, "shared_memory_per_block", spec.smem_per_block)
        smem_cap = max(lds, spec.smem_per_block) if gfx == "gfx950" else lds  # older drivers report 64 KiB
        self.describe(props, spec, smem_cap, [1300, 14000])
        self.smem_per_sm = smem_cap
        self.reg_cap = 32768  # TileLang's value

    def get_avaliable_tensorintrin_shapes(self):
        return [[16, 16]]

    def __repr__(self) -> str:
        return f"CDNA({self.target})"


__all__ = ["is_cdna_arch", "CDNA"]
