"""The GEMM schedule recommender behind `MatmulTemplate.recommend_hints` (TileLang's roller:
`TensorCorePolicy` in `tilelang/carver/roller/policy/tensorcore.py`).

TileLang's roller walks the TVM TE graph of the computation, grows tiles step by step and scores
them by modelled memory traffic.  This is a small enumeration over the one computation tritile's
carver templates describe, C[M, N] = A[M, K] @ B[K, N]:

Candidates
    * block (block_M, block_N): each from 16, 32, 64, 128, 256 (tensor-core friendly), no larger
      than the problem's dimension rounded up to a power of two;
    * warps: 4 or 8 (one or two warp groups), the fewest that keep the fp32/int32 accumulator
      within 128 registers per thread; `warp` (warp_M, warp_N) splits the block into that many
      tiles of at least 16 x 16, the squarest split;
    * rstep = [block_K]: 16, 32, 64 or 128 elements, rows of 32 to 256 bytes, no larger than K
      rounded up to a power of two;
    * pipeline_stage: 1 to 4 (1 to 2 where copies cannot be asynchronous: before sm_80), at most
      the K loop's trip count;
    * kept when their shared memory fits the device's per-block limit (`arch.smem_cap`) with
      `SMEM_RESERVE` (1 KiB: mbarriers, alignment) to spare:
      ``stages * (block_M + block_N) * block_K * in_bytes + block_M * block_N * out_bytes`` - the
      operand ring plus the output tile TileLang's GEMM programs stage through shared memory (an
      upper bound: tritile's allocator may overlap the output tile with the ring).

Cost (lower is better), a roofline of the tiled program with wave quantization:
    * tiles = ceil(M / block_M) * ceil(N / block_N), waves = ceil(tiles / SMs);
    * a tile's arithmetic intensity I = 2 * block_M * block_N / ((block_M + block_N) * in_bytes)
      FLOPs per byte of A and B it loads (each tile loads its own operands: no L2 reuse modelled);
    * the device's ridge point R = peak FLOP/s / memory bandwidth; a tile runs at
      min(1, I / R) of one SM's peak;
    * estimated time = waves * (2 * block_M * block_N * K_padded) / (SM peak * min(1, I / R)).
    Ties (same time) go to deeper latency hiding - min(stages, preferred) * min(block_K row bytes,
    128) - then to less shared memory (more blocks resident: intensity per shared-memory byte).

Output: `topk` distinct hints, the best candidate of each block shape first (in cost order),
then the remaining candidates in cost order, so a short list spans several tilings.  The
rasterization plan is TileLang's: none before sm_80 or when A and B fit in L2, otherwise
`Rasterization2DColumn(int(sqrt(SMs)))`.
"""
from __future__ import annotations

import math

from tritile.carver.arch import TileDevice, is_cuda_arch
from tritile.carver.roller.hint import Hint
from tritile.carver.roller.rasterization import NoRasterization, Rasterization2DColumn
from tritile.ir.dtypes import as_dtype

BLOCK_SIZES = (16, 32, 64, 128, 256)
WARP_COUNTS = (4, 8)
RSTEPS = (16, 32, 64, 128)
MIN_WARP_TILE = 16
MAX_ACCUMULATOR_REGISTERS = 128  # per thread; the rest is left to operands and addresses
SMEM_RESERVE = 1024  # bytes of shared memory left to mbarriers and alignment


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def async_copies(arch: TileDevice) -> bool:
    """Whether global->shared copies can run ahead of the compute (cp.async / TMA, AMD's direct loads)."""
    return not is_cuda_arch(arch) or arch.sm_version >= 80


def preferred_stages(arch: TileDevice) -> int:
    """The pipeline depth the tie-break favours: 3 on sm_90 and newer, 2 with async copies, else 1."""
    if is_cuda_arch(arch) and arch.sm_version >= 90:
        return 3
    return 2 if async_copies(arch) else 1


def warp_split(block_m: int, block_n: int, warps: int):
    """(warp_M, warp_N) splitting the block into `warps` tiles of at least 16 x 16, the squarest;
    None if there is no such split."""
    best = None
    for rows in range(1, warps + 1):
        if warps % rows:
            continue
        cols = warps // rows
        if block_m % rows or block_n % cols:
            continue
        warp_m, warp_n = block_m // rows, block_n // cols
        if warp_m < MIN_WARP_TILE or warp_n < MIN_WARP_TILE:
            continue
        skew = abs(math.log2(warp_m / warp_n))
        if best is None or skew < best[0]:
            best = (skew, (warp_m, warp_n))
    return None if best is None else best[1]


def shared_memory_bytes(block_m: int, block_n: int, block_k: int, stages: int, in_bytes: int, out_bytes: int) -> int:
    return stages * (block_m + block_n) * block_k * in_bytes + block_m * block_n * out_bytes


def estimated_time(M: int, N: int, K: int, block_m: int, block_n: int, block_k: int, in_bytes: int,
                   arch: TileDevice) -> float:
    """Seconds, by the roofline with wave quantization of the module docstring."""
    sms = max(1, arch.compute_max_core)
    tiles = math.ceil(M / block_m) * math.ceil(N / block_n)
    waves = math.ceil(tiles / sms)
    k_padded = math.ceil(K / block_k) * block_k
    intensity = 2 * block_m * block_n / ((block_m + block_n) * in_bytes)
    ridge = arch.peak_tflops * 1e12 / (arch.memory_bandwidth_GBps * 1e9)
    sm_peak = arch.peak_tflops * 1e12 / sms
    return waves * 2 * block_m * block_n * k_padded / (sm_peak * min(1.0, intensity / ridge))


def rasterization_plan(M: int, N: int, K: int, in_bytes: int, arch: TileDevice):
    if is_cuda_arch(arch) and arch.sm_version < 80:
        return NoRasterization()
    if (M + N) * K * in_bytes < arch.l2_cache_size_bytes:
        return NoRasterization()
    return Rasterization2DColumn(int(arch.compute_max_core ** 0.5))


def tensor_core_precision(in_dtype, accum_dtype, arch: TileDevice) -> bool:
    from tritile.carver.arch import is_tensorcore_supported_precision

    if is_cuda_arch(arch):
        try:
            return is_tensorcore_supported_precision(in_dtype, accum_dtype, arch)
        except ValueError:
            return False
    return (str(in_dtype), str(accum_dtype)) in {("float16", "float32"), ("bfloat16", "float32"), ("int8", "int32"),
                                                 ("float16", "float16")}


def recommend_matmul_hints(M: int, N: int, K: int, arch: TileDevice, in_dtype="float16", accum_dtype="float32",
                           out_dtype="float16", topk: int = 10) -> list:
    """Up to `topk` distinct `Hint`s for C[M, N] = A[M, K] @ B[K, N] on `arch`, best first."""
    if not all(isinstance(d, int) and d > 0 for d in (M, N, K)):
        raise ValueError(f"M, N, K must be positive integers, got {M}, {N}, {K}")
    in_bytes = as_dtype(in_dtype).itemsize
    out_bytes = as_dtype(out_dtype).itemsize
    acc_words = max(1, as_dtype(accum_dtype).itemsize // 4)
    warp_size = arch.warp_size or 32
    max_stages = 4 if async_copies(arch) else 2
    prefer = preferred_stages(arch)
    raster = rasterization_plan(M, N, K, in_bytes, arch)
    use_tc = tensor_core_precision(in_dtype, accum_dtype, arch)

    blocks_m = [b for b in BLOCK_SIZES if b <= max(BLOCK_SIZES[0], _next_power_of_2(M))]
    blocks_n = [b for b in BLOCK_SIZES if b <= max(BLOCK_SIZES[0], _next_power_of_2(N))]
    rsteps = [k for k in RSTEPS if 32 <= k * in_bytes <= 256 and k <= max(RSTEPS[0], _next_power_of_2(K))]
    rsteps = rsteps or [min(RSTEPS)]

    candidates = []
    for block_m in blocks_m:
        for block_n in blocks_n:
            for warps in WARP_COUNTS:
                split = warp_split(block_m, block_n, warps)
                if split is None or block_m * block_n * acc_words > MAX_ACCUMULATOR_REGISTERS * warps * warp_size:
                    continue
                break
            else:
                continue
            for block_k in rsteps:
                trips = math.ceil(K / block_k)
                time = estimated_time(M, N, K, block_m, block_n, block_k, in_bytes, arch)
                for stages in range(1, min(max_stages, trips) + 1):
                    smem = shared_memory_bytes(block_m, block_n, block_k, stages, in_bytes, out_bytes)
                    if smem + SMEM_RESERVE > arch.smem_cap:
                        continue
                    hiding = min(stages, prefer) * min(block_k * in_bytes, 128)
                    candidates.append(((time, -hiding, smem), block_m, block_n, split, block_k, stages, smem))
    candidates.sort(key=lambda c: c[0])

    def make(c) -> Hint:
        score, block_m, block_n, split, block_k, stages, smem = c
        hint = Hint()
        hint.arch, hint.use_tc, hint.warp_size = arch, use_tc, warp_size
        hint.block, hint.warp, hint.rstep = [block_m, block_n], list(split), [block_k]
        hint.pipeline_stage, hint.use_async = stages, async_copies(arch) and stages > 1
        hint.rasterization_plan, hint.smem_bytes, hint.score = raster, smem, score
        return hint

    firsts, rest, seen_blocks = [], [], set()
    for c in candidates:
        (firsts if (c[1], c[2]) not in seen_blocks else rest).append(c)
        seen_blocks.add((c[1], c[2]))
    return [make(c) for c in (firsts + rest)[:topk]]
