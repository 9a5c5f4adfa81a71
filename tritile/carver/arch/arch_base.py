"""`TileDevice`, TileLang's description of a device for the carver (`tilelang/carver/arch/arch_base.py`).

Mirrored: the attribute names TileLang's templates and tools read (`reg_cap`, `smem_cap`,
`compute_max_core`, `warp_size`, `sm_partition`, `transaction_size`, `max_smem_usage`,
`bandwidth`, `platform`, `compute_capability`, `l2_cache_size_bytes`).  Added, because tritile's
recommender and Analyzer need real numbers (TileLang's `bandwidth` is a pair of relative
constants): `smem_per_sm`, `max_threads_per_sm`, `peak_tflops` (dense fp16 tensor-core TFLOP/s)
and `memory_bandwidth_GBps` (device memory)."""
from __future__ import annotations


def memory_bandwidth_from_properties(props, default: float) -> float:
    """GB/s from the memory clock (kHz) and bus width (bits) torch reports on recent versions
    (double data rate), else `default`."""
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    if clock_khz and bus_bits:
        return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9
    return default


class TileDevice:
    """A device's resources.  Capacities are in bytes; `compute_max_core` counts SMs (CUs on AMD)."""

    def __init__(self) -> None:
        self.name: str = "unknown"
        self.reg_cap: int = 0  # 32-bit registers per SM
        self.smem_cap: int = 0  # shared memory one block may use (the opt-in maximum)
        self.smem_per_sm: int = 0  # shared memory of one SM (what resident blocks share)
        self.compute_max_core: int = 0  # SMs / CUs
        self.warp_size: int = 0
        self.max_threads_per_sm: int = 0
        self.sm_partition: int = 0  # warp schedulers per SM
        self.transaction_size: list[int] = [0, 0]  # memory transaction sizes, bytes
        self.max_smem_usage: int = 0
        self.bandwidth: list[int] = [0, 0]  # TileLang's relative numbers ("MB/s"); not used by tritile
        self.platform: str = "unknown"
        self.compute_capability: str = "unknown"
        self.l2_cache_size_bytes: int = 0
        self.peak_tflops: float = 0.0  # dense fp16 tensor-core peak
        self.memory_bandwidth_GBps: float = 0.0  # device memory (HBM) bandwidth

    def describe(self, props, spec, smem_cap: int, bandwidth: list) -> None:
        """Fill the attributes every device has from torch.cuda's properties `props` (None: no such
        device here) or else the `known_devices` entry `spec`; `smem_cap` (per block) and TileLang's
        relative `bandwidth` pair differ by platform."""
        self.from_device = props is not None
        self.name = props.name if props is not None else spec.name
        self.compute_max_core = props.multi_processor_count if props is not None else spec.num_sms
        self.warp_size = getattr(props, "warp_size", spec.warp_size)
        self.smem_cap = smem_cap
        self.max_threads_per_sm = getattr(props, "max_threads_per_multi_processor", spec.max_threads_per_sm)
        self.l2_cache_size_bytes = getattr(props, "L2_cache_size", spec.l2_cache_bytes)
        # peak scales with the SM count (a PCIe H100 has 114 of the SXM part's 132)
        self.peak_tflops = spec.peak_tflops * self.compute_max_core / spec.num_sms
        self.memory_bandwidth_GBps = (memory_bandwidth_from_properties(props, spec.memory_bandwidth_GBps)
                                      if props is not None else spec.memory_bandwidth_GBps)
        self.max_smem_usage = smem_cap
        self.sm_partition = 4
        self.transaction_size = [32, 128]
        self.bandwidth = bandwidth  # TileLang's relative numbers, kept for code that reads them

    def get_avaliable_tensorintrin_shapes(self):  # TileLang's spelling
        raise NotImplementedError()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.name}: {self.compute_max_core} SMs, smem {self.smem_cap // 1024} KiB/block, "
                f"{self.peak_tflops:g} TFLOP/s, {self.memory_bandwidth_GBps:g} GB/s)")
