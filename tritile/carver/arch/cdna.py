"""`CDNA`, TileLang's AMD Instinct device for the carver (`tilelang/carver/arch/cdna.py`).

Mirrored: the attributes (`platform` "CDNA", `smem_cap` = LDS per workgroup, `compute_max_core`
= CUs, `warp_size` 64, `reg_cap`, `max_smem_usage`, `l2_cache_size_bytes`, `bandwidth`).
Simplified as `CUDA` is: tritile's target ("hip", "hip:gfx942"), numbers from torch.cuda on a
ROCm build with a device of that gfx name, else from `known_devices` (no device: an MI300X,
gfx942), where TileLang raises without a device.
"""
from __future__ import annotations

from tritile.carver.arch.arch_base import TileDevice
from tritile.carver.arch.cuda import memory_bandwidth_from_properties
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
        self.from_device = props is not None
        self.platform = "CDNA"
        self.compute_capability = gfx[3:5] if gfx.startswith("gfx") else gfx  # "94" for gfx942, as TileLang's "9.4"
        self.name = props.name if props is not None else spec.name
        self.compute_max_core = props.multi_processor_count if props is not None else spec.num_sms
        self.warp_size = getattr(props, "warp_size", spec.warp_size)
        lds = getattr(props, "shared_memory_per_block", spec.smem_per_block)
        self.smem_cap = max(lds, spec.smem_per_block) if gfx == "gfx950" else lds  # older drivers report 64 KiB
        self.smem_per_sm = self.smem_cap
        self.reg_cap = 32768  # TileLang's value
        self.max_threads_per_sm = getattr(props, "max_threads_per_multi_processor", spec.max_threads_per_sm)
        self.l2_cache_size_bytes = getattr(props, "L2_cache_size", spec.l2_cache_bytes)
        self.peak_tflops = spec.peak_tflops * self.compute_max_core / spec.num_sms
        self.memory_bandwidth_GBps = (memory_bandwidth_from_properties(props, spec.memory_bandwidth_GBps)
                                      if props is not None else spec.memory_bandwidth_GBps)
        self.max_smem_usage = self.smem_cap
        self.sm_partition = 4
        self.transaction_size = [32, 128]
        self.bandwidth = [1300, 14000]  # TileLang's relative numbers, kept for code that reads them

    def get_avaliable_tensorintrin_shapes(self):
        return [[16, 16]]

    def __repr__(self) -> str:
        return f"CDNA({self.target})"


__all__ = ["is_cdna_arch", "CDNA"]
