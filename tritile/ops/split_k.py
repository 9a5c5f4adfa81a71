"""Split-K: a GEMM whose output has too few tiles to fill the GPU splits its K loop across
programs, then sums the partial products.

A GEMM with few output tiles and a long K (a weight gradient 1024 x 1024 summed over 16384
tokens) leaves most SMs idle with one program per output tile: 32 tiles of 128 x 256 on 132
SMs.  Splitting K gives each (tile, share of K) pair a program.  It is the ordinary T-language
GEMM loop (tritile/ops/gemm_loop.py's `accumulate_tiles`) over a range of K tiles, so the
passes plan its pipeline, layouts and TMA like any other GEMM; the sum is a second small T
kernel.

Contract:
* `matmul_partial_sums(A, B, splits=S, ...)` returns Partials (S, M, N) float32: Partials[s] =
  A @ B summed over split s's share of K's tiles (`k_tiles_per_split` consecutive K tiles of
  `block_K`; a share reaching past K reads zeros, as every tile copy clips at the matrix edges).
  `trans_A` / `trans_B` read transposed operands in place, as matmul's do.
* `reduce_partial_sums(Partials, Bias, Residual, Pre, ...)` returns C (M, N) in `dtype`: the
  float32 sum of Partials[0..S-1] in that order, then tritile/ops/epilogues.py's
  `apply_epilogue` (bias, activation, residual, the kept pre-activation), as the unsplit fused
  GEMM applies it.  Absent epilogue operands are placeholders, never read.
* `SplitKGemm` runs the two kernels: `gemm(a, b)` -> C; `gemm(a, b, bias, residual, pre)` with
  the epilogue's operands.  `SplitKGemm.build(a, b, config, ...)` compiles both for one call's
  operands (what tritile.mm / tritile.linear remember per call signature).
* `split_k_config(device_type, M, N, K, dtype, num_sms)` is the plan: the partial kernel's tiles
  with `splits`, or None when the GEMM should not split (the rule, measured on an H100, is in its
  docstring).  `TRITILE_SPLIT_K` (tritile/switches.py): `auto` (default) follows the rule on
  CUDA; `on` splits wherever K has 2 tiles or more, with tile_config's tiles (CPU included: the
  tests' way to run this path through the interpreter); `off` never.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

import tritile
import tritile.language as T
from tritile.ops.epilogues import apply_epilogue
from tritile.ops.gemm_loop import accumulate_tiles, tile_config
from tritile.runtime.kernel import JITKernel
from tritile.switches import schedule_switch

# The measured rule (H100, bench/gemm_split_k_h100.py, bench/NOTES.md session 19): splitting pays
# for a GEMM of few output tiles and both M and N wide, over a long K (a weight gradient 1024 x
# 1024 summed over 16384 tokens: 128x128 tiles in 2 splits, 0.90x cuBLAS against 0.38x unsplit);
# it lost wherever M <= 128 (decoding's linears, M = 16 / 64 / 128: the unsplit narrow tiles
# were the fastest at every split count tried, the second kernel costing more than the SMs it
# fills) and for more splits than fill the SMs once.
SPLIT_TILES = dict(block_M=128, block_N=128, block_K=64, num_stages=4, threads=256)
MIN_ROWS = 256  # M and N both at least this (narrower GEMMs keep tile_config's narrow tiles)
MIN_K_TILES_PER_SPLIT = 32  # each share a long pipelined loop (measured: 128 K tiles a share)
# the reduction's tiles: columns wide enough for 16-byte accesses, rows as many as the output has
REDUCTION_BLOCK_N, REDUCTION_THREADS = 128, 128


@tritile.jit
def matmul_partial_sums(A, B, splits: int = 2, block_M: int = 64, block_N: int = 64, block_K: int = 32,
                        num_stages: int = 2, threads: int = 128, dtype=T.float16, accum_dtype=T.float32,
                        trans_A: bool = False, trans_B: bool = False):
    """Partials[s] = A @ B over split s's share of the K tiles (one program per tile and split)."""
    M, N, K = T.const("M, N, K")
    A: T.Tensor((K, M) if trans_A else (M, K), dtype)
    B: T.Tensor((N, K) if trans_B else (K, N), dtype)
    Partials = T.empty((splits, M, N), accum_dtype)
    k_tiles_per_split = T.ceildiv(T.ceildiv(K, block_K), splits)

    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), splits, threads=threads) as (bx, by, bz):
        A_shared = T.alloc_shared((block_K, block_M) if trans_A else (block_M, block_K), dtype)
        B_shared = T.alloc_shared((block_N, block_K) if trans_B else (block_K, block_N), dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)

        accumulate_tiles(A, B, A_shared, B_shared, C_local, bx, by, K, block_M, block_N, block_K, num_stages,
                         trans_A, trans_B, k_first=bz * k_tiles_per_split, k_count=k_tiles_per_split)
        T.copy(C_local, Partials[bz, by * block_M, bx * block_N])
    return Partials


@tritile.jit
def reduce_partial_sums(Partials, Bias, Residual, Pre, block_M: int = 64, block_N: int = REDUCTION_BLOCK_N,
                        threads: int = REDUCTION_THREADS, dtype=T.float16, accum_dtype=T.float32,
                        has_bias: bool = False, activation: str = "none", has_residual: bool = False,
                        keep_pre: bool = False):
    """C = act(sum_s Partials[s] + Bias) + Residual; Pre = sum_s Partials[s] + Bias when `keep_pre`."""
    S, M, N = T.const("S, M, N")
    Partials: T.Tensor((S, M, N), accum_dtype)
    Bias: T.Tensor((N,) if has_bias else (1,), dtype)
    Residual: T.Tensor((M, N) if has_residual else (1, 1), dtype)
    Pre: T.Tensor((M, N) if keep_pre else (1, 1), dtype)
    C = T.empty((M, N), dtype)

    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
        total = T.alloc_fragment((block_M, block_N), accum_dtype)
        partial = T.alloc_fragment((block_M, block_N), accum_dtype)
        T.copy(Partials[0, by * block_M, bx * block_N], total)
        for s in T.serial(1, S):
            T.copy(Partials[s, by * block_M, bx * block_N], partial)
            for i, j in T.Parallel(block_M, block_N):
                total[i, j] += partial[i, j]
        apply_epilogue(total, C, Bias, Residual, Pre, bx, by, block_M, block_N, dtype, has_bias, activation,
                       has_residual, keep_pre)
    return C


@dataclass(frozen=True)
class SplitKGemm:
    """The partial sums and their reduction, run as one GEMM; `placeholders` stand for the
    epilogue operands (Bias, Residual, Pre) of a call that has none."""

    partial_sums: JITKernel
    reduction: JITKernel
    placeholders: tuple

    def __call__(self, a: torch.Tensor, b: torch.Tensor, *epilogue_operands) -> torch.Tensor:
        return self.reduction(self.partial_sums(a, b), *(epilogue_operands or self.placeholders))

    @classmethod
    def build(cls, a: torch.Tensor, b: torch.Tensor, config: dict, dtype, trans_A: bool = False,
              trans_B: bool = False, epilogue_operands: tuple = (), **epilogue) -> "SplitKGemm":
        """Both kernels for operands `a`, `b` (as the partial kernel takes them: transposed ones
        already swapped back) with `config` (split_k_config's), the epilogue's flags
        (`has_bias`, `activation`, `has_residual`, `keep_pre`) and its operands (Bias, Residual,
        Pre; none: placeholders)."""
        partial_sums = matmul_partial_sums.kernel_for(a, b, dtype=dtype, trans_A=trans_A, trans_B=trans_B, **config)
        M, N = (a.shape[1] if trans_A else a.shape[0]), (b.shape[0] if trans_B else b.shape[1])
        placeholders = (a.new_empty(1), a.new_empty((1, 1)), a.new_empty((1, 1)))
        partials = torch.empty((config["splits"], M, N), dtype=torch.float32, device=a.device)
        reduction = reduce_partial_sums.kernel_for(partials, *(epilogue_operands or placeholders), dtype=dtype,
                                                   block_M=reduction_rows(M), **epilogue)
        return cls(partial_sums, reduction, placeholders)


def reduction_rows(M: int) -> int:
    """The reduction tile's rows: M rounded up to a power of two, between 16 and 64."""
    return min(64, max(16, 1 << (M - 1).bit_length()))


def split_k_config(device_type: str, M: int, N: int, K: int, dtype: torch.dtype = torch.float16,
                   num_sms: int = 132) -> Optional[dict]:
    """The partial kernel's config ({block_M, block_N, block_K, num_stages, threads, splits}) for
    this GEMM, or None: leave it unsplit.

    Rule (auto: CUDA, half precision): M and N both at least MIN_ROWS, and SPLIT_TILES's output
    tiles fill at most half the SMs; then K splits into the largest power of two of shares that
    keeps one program per SM at most and MIN_K_TILES_PER_SPLIT K tiles per share (None if that is
    1).  `on` splits any GEMM of 2 K tiles or more, with tile_config's tiles."""
    mode = schedule_switch("TRITILE_SPLIT_K")
    if mode == "off" or (mode == "auto" and (device_type != "cuda" or dtype == torch.float32)):
        return None
    if mode == "on":
        config = tile_config(device_type, M, N, K, dtype)
        k_tiles = -(-K // config["block_K"])
        return dict(config, splits=min(k_tiles, max(2, num_sms // output_tiles(M, N, config)))) if k_tiles > 1 else None
    tiles, k_tiles, splits = output_tiles(M, N, SPLIT_TILES), K // SPLIT_TILES["block_K"], 1
    if min(M, N) < MIN_ROWS or 2 * tiles > num_sms:
        return None
    while tiles * splits * 2 <= num_sms and k_tiles // (splits * 2) >= MIN_K_TILES_PER_SPLIT:
        splits *= 2
    return dict(SPLIT_TILES, splits=splits) if splits > 1 else None


def output_tiles(M: int, N: int, config: dict) -> int:
    return -(-M // config["block_M"]) * -(-N // config["block_N"])


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """The number of SMs of a CUDA device (the plan's program budget); 132 (an H100) elsewhere."""
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count
