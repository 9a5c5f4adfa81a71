"""The table of devices `CUDA` / `CDNA` describe when no such GPU is present (or for what
torch.cuda does not report: peak FLOP/s, and memory bandwidth on older torch).

Numbers are the vendors' published figures for one representative part per architecture:
`peak_tflops` is the dense fp16 tensor-core peak (fp32 accumulation), `memory_bandwidth_GBps`
the HBM / GDDR bandwidth, `smem_per_block` the opt-in per-block shared memory (LDS on AMD),
`smem_per_sm` what one SM / CU has.  TileLang reads these from the driver only (and raises without
a device); tritile falls back to this table so a program can plan for a GPU it does not have.
"""
from __future__ import annotations

from dataclasses import dataclass

KiB, MiB = 1024, 1024 * 1024


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    num_sms: int
    smem_per_block: int
    smem_per_sm: int
    l2_cache_bytes: int
    peak_tflops: float
    memory_bandwidth_GBps: float
    warp_size: int = 32
    regs_per_sm: int = 65536
    max_threads_per_sm: int = 2048


# NVIDIA, by compute capability (sm_version)
CUDA_DEVICES = {
    80: DeviceSpec("NVIDIA A100-SXM4-80GB", 108, 163 * KiB, 164 * KiB, 40 * MiB, 312.0, 2039.0),
    89: DeviceSpec("NVIDIA L40S", 142, 99 * KiB, 100 * KiB, 96 * MiB, 362.0, 864.0, max_threads_per_sm=1536),
    90: DeviceSpec("NVIDIA H100 80GB HBM3", 132, 227 * KiB, 228 * KiB, 50 * MiB, 989.4, 3350.0),
    100: DeviceSpec("NVIDIA B200", 148, 227 * KiB, 228 * KiB, 126 * MiB, 2250.0, 8000.0),
}

# AMD CDNA, by gfx name
CDNA_DEVICES = {
    "gfx942": DeviceSpec("AMD Instinct MI300X", 304, 64 * KiB, 64 * KiB, 4 * MiB, 1307.4, 5300.0, warp_size=64,
                         regs_per_sm=131072),
    "gfx950": DeviceSpec("AMD Instinct MI355X", 256, 160 * KiB, 160 * KiB, 4 * MiB, 2500.0, 8000.0, warp_size=64,
                         regs_per_sm=131072),
}


def cuda_spec(sm_version: int) -> DeviceSpec:
    """The table's entry for `sm_version`, else the newest one not newer (sm_86 -> sm_80), else sm_80."""
    older = [v for v in CUDA_DEVICES if v <= sm_version]
    return CUDA_DEVICES[max(older) if older else min(CUDA_DEVICES)]


def cdna_spec(gfx: str) -> DeviceSpec:
    """The table's entry for `gfx` (e.g. "gfx942"), else gfx942's."""
    return CDNA_DEVICES.get(gfx.split(":")[0], CDNA_DEVICES["gfx942"])
