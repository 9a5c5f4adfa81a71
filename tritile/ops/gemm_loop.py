"""The K loop every tritile GEMM kernel shares, and the tile sizes it runs with.

Contract:
* `load_operand_tiles` / `accumulate_tiles` (`T.macro`s) are the loop: tile copies of A and B
  into shared memory and a `T.gemm` per K tile, over a `T.Pipelined` loop the passes plan
  (stages, TMA, warp specialization).  Transposed operands are read in place; a batch index
  selects one matrix of a batch; `k_first` / `k_count` restrict the loop to a range of K tiles
  (tritile/ops/split_k.py).  Used by tritile/ops/matmul.py, linear.py and split_k.py.
* `tile_config(device_type, M, N, K, dtype)` picks the tile sizes per shape (and `swap_ab` for a
  thin A).
"""
from __future__ import annotations

import torch

import tritile.language as T

SINGLE_WAVE_PROGRAMS = 132  # an H100's SMs: one program each
THIN_SWAP_ROWS = 32  # A with at most this many rows is wgmma's N side (tile_config's swap_ab)


@T.macro
def load_operand_tiles(A, B, A_shared, B_shared, k, bx, by, block_M, block_N, block_K, trans_A, trans_B,
                       batched=False, bz=0):
    """Copies the k-th K tiles of A and B for output tile (by, bx) into shared memory (of matrix
    `bz` when `batched`: operands [batch, rows, cols]); a transposed operand is stored (K, M) /
    (N, K), so its tile's head address swaps."""
    if not batched:
        if trans_A:
            T.copy(A[k * block_K, by * block_M], A_shared)
        else:
            T.copy(A[by * block_M, k * block_K], A_shared)
        if trans_B:
            T.copy(B[bx * block_N, k * block_K], B_shared)
        else:
            T.copy(B[k * block_K, bx * block_N], B_shared)
    else:
        if trans_A:
            T.copy(A[bz, k * block_K, by * block_M], A_shared)
        else:
            T.copy(A[bz, by * block_M, k * block_K], A_shared)
        if trans_B:
            T.copy(B[bz, bx * block_N, k * block_K], B_shared)
        else:
            T.copy(B[bz, k * block_K, bx * block_N], B_shared)


@T.macro
def accumulate_tiles(A, B, A_shared, B_shared, C_local, bx, by, K, block_M, block_N, block_K, num_stages,
                     trans_A, trans_B, batched=False, bz=0, k_first=0, k_count=None, swap_ab=False):
    """C_local = the (by, bx) output tile of A @ B (of A[bz] @ B[bz] when `batched`): the K loop of
    this module's GEMMs, of tritile/ops/linear.py's `matmul_epilogue` and of
    tritile/ops/split_k.py's split GEMM (whose programs sum `k_count` K tiles from tile `k_first`;
    default: all of K).

    `swap_ab` computes the tile's transpose, B^T A^T, and transposes it into C_local at the end:
    wgmma's M side (at least 64 rows) is then B's tile and A's few rows are its N side (as small
    as 8), so a thin A (decoding's 16 rows) is neither padded to 64 rows in shared memory nor
    read as such - the pipeline holds more stages of B (cuBLAS's small-M kernels do the same)."""
    accumulator = T.alloc_fragment((block_N, block_M), C_local.dtype) if swap_ab else C_local
    T.clear(accumulator)
    for k in T.Pipelined(T.ceildiv(K, block_K) if k_count is None else k_count, num_stages=num_stages):
        load_operand_tiles(A, B, A_shared, B_shared, k_first + k, bx, by, block_M, block_N, block_K, trans_A,
                           trans_B, batched, bz)
        if swap_ab:
            T.gemm(B_shared, A_shared, accumulator, transpose_A=not trans_B, transpose_B=not trans_A)
        else:
            T.gemm(A_shared, B_shared, accumulator, transpose_A=trans_A, transpose_B=trans_B)
    if swap_ab:
        for i, j in T.Parallel(block_M, block_N):
            C_local[i, j] = accumulator[j, i]


def tile_config(device_type: str, M: int = None, N: int = None, K: int = None,
                dtype: torch.dtype = torch.float16) -> dict:
    """Tile sizes for one problem (M, N, K; None = large).

    CPU: small tiles keep the interpreter's per-block work small.  CUDA, half precision
    (measured on an H100, bench/NOTES.md, 2026-11-22): large M uses two warpgroups on a 128x256
    tile.  Small M leaves most SMs idle with 128x256 tiles (M=128, N=4096: 16 programs on 132
    SMs) and is bound by reading B, so it takes narrow tiles with one warpgroup and a deep
    pipeline: 128x64 when that still gives about one wave of programs (B is then read once),
    else 64-row tiles (wgmma's minimum).  For M <= 128 and a long K (session 19: fp16 / bf16,
    N = K = 4096 / 8192, M = 16 / 64 / 128) the loads in flight decide: 64x64 tiles on six 128-deep
    stages (192 KB, as cuBLAS's nvjet kernel keeps 208 KB in flight at 128x4096x4096) where they
    cover the output in one wave of programs, 0.96-1.04x cuBLAS against 0.88-0.95 at eight
    64-deep stages; else 64x128 tiles on six stages.  At most THIN_SWAP_ROWS rows and K >= 1024
    (session 24, bench/NOTES.md) take the swapped product instead (`accumulate_tiles`' `swap_ab`)
    on 16- or 32-row tiles of A and 64 columns of B, five 256-deep stages of 40 KB (four of 48 KB
    for 32 rows): 16x8192x8192 0.98 (64x128 tiles, unswapped) -> 0.99-1.02x cuBLAS, 16x4096x4096
    1.02 -> 1.09-1.12x, M = 1 and 8 0.92-0.95 -> 0.99-1.02x, as cuBLAS's own small-M kernel
    (nvjet 64x16, 16 stages) swaps them.  CUDA, fp32: the GEMM runs on FMA units
    (exact fp32, no TF32), where a 64x64 tile keeps the accumulator in registers."""
    if device_type != "cuda" or dtype == torch.float32:
        return dict(block_M=64, block_N=64, block_K=32, num_stages=2, threads=128)
    if M is not None and K is not None and M <= THIN_SWAP_ROWS and K >= 1024:
        rows = 16 if M <= 16 else 32
        return dict(block_M=rows, block_N=64, block_K=256, num_stages=5 if rows == 16 else 4, threads=128,
                    swap_ab=True)
    if M is not None and N is not None and K is not None and M <= 128 and K >= 4096:
        tiles = -(-M // 64) * -(-N // 64)
        if tiles <= SINGLE_WAVE_PROGRAMS:  # (thinner A, M <= 16, took the swapped tiles above)
            return dict(block_M=64, block_N=64, block_K=128, num_stages=6, threads=128)
        return dict(block_M=64, block_N=128, block_K=64, num_stages=6, threads=128)
    if M is not None and N is not None and M <= 256:
        if M > 64 and -(-M // 128) * -(-N // 64) >= 120:
            return dict(block_M=128, block_N=64, block_K=64, num_stages=6, threads=128)
        if M <= 64 and -(-N // 128) >= 64:
            return dict(block_M=64, block_N=128, block_K=64, num_stages=6, threads=128)
        return dict(block_M=64, block_N=64, block_K=64, num_stages=8, threads=128)
    return dict(block_M=128, block_N=256, block_K=64, num_stages=3, threads=256)
