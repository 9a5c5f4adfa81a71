"""`TileDevice`, TileLang's description of a device for the carver (`tilelang/carver/arch/arch_base.py`).

Mirrored: the attribute names TileLang's templates and tools read (`reg_cap`, `smem_cap`,
`compute_max_core`, `warp_size`, `sm_partition`, `transaction_size`, `max_smem_usage`,
`bandwidth`, `platform`, `compute_capability`, `l2_cache_size_bytes`).  Added, because tritile's
recommender and Analyzer need real numbers (TileLang's `bandwidth` is a pair of relative
constants): `smem_per_sm`, `max_threads_per_sm`, `peak_tflops` (dense fp16 tensor-core TFLOP/s)
and `memory_bandwidth_GBps` (device memory)."""
from __future__ import annotations


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

    def get_avaliable_tensorintrin_shapes(self):  # TileLang's spelling
        raise NotImplementedError()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.name}: {self.compute_max_core} SMs, smem {self.smem_cap // 1024} KiB/block, "
                f"{self.peak_tflops:g} TFLOP/s, {self.memory_bandwidth_GBps:g} GB/s)")
