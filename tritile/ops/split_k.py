"""Split-K: a GEMM whose output has too few tiles to fill the GPU splits its K loop across
programs, and the last program of each tile to finish sums the partial products - one kernel.

A GEMM with few output tiles and a long K leaves most SMs idle with one program per output
tile: a weight gradient 1024 x 1024 summed over 16384 tokens has 32 tiles of 128 x 256 on 132
SMs, a decoding linear 16 x 4096 x 4096 64 tiles of 64 x 64.  Splitting K gives each (tile,
share of K) pair a program.  Each runs the ordinary T-language GEMM loop (tritile/ops/
gemm_loop.py's `accumulate_tiles`) over its range of K tiles, so the passes plan its pipeline,
layouts and TMA like any other GEMM, and stores its float32 partial product in a workspace.
The program that finds itself the tile's last to arrive sums the partials and runs the fused
epilogue: no second kernel, no launch or pass over the output between the two (what made the
two-kernel split lose at small M, bench/NOTES.md session 19).

Contract:
* `matmul_split_k(A, B, Bias, Residual, Pre, Workspace, Counters, splits=S, ...)` returns C
  (M, N) in `dtype`: the float32 sum, in split order 0, 1, .., S-1, of the S partial products
  (split s: A @ B over `k_tiles_per_split` consecutive K tiles of `block_K` from tile
  s * k_tiles_per_split; a share reaching past K reads zeros, as every tile copy clips at the
  matrix edges), then tritile/ops/epilogues.py's `apply_epilogue` (bias, activation, residual,
  the kept pre-activation into Pre), as the unsplit fused GEMM applies it.  The order is fixed,
  so the result is bit-identical whichever program arrives last.  Workspace (S, M, N) float32
  holds the partials after the call (Workspace[s] = split s's); Counters (tiles of M, tiles of
  N) int32 must be zero before the call and is zero again after it (the last program resets
  its tile's), so a kept pair needs no memset between calls.  `trans_A` / `trans_B` read
  transposed operands in place, as matmul's do.  Absent epilogue operands are placeholders,
  never read.
* The protocol, per program: store the partial (plain `st.global`), `T.sync_threads()`
  (`bar.sync 0`; in a warp-specialized kernel the consumer warps' `bar.sync 0, <their
  threads>`: the producer warp stores no partial), then one thread's `atom.global.gpu.acq_rel.add` on the tile's counter; the
  program whose atomic returns S - 1 re-reads the S partials with plain loads (`ld.global`,
  L1-cacheable, generated after the atomic's broadcast through shared memory and a second
  `bar.sync`), sums them, runs the epilogue, stores C and zeroes the counter.  Why the loads
  see every partial (PTX memory model, the pattern of CUTLASS's `GenericBarrier`
  (cutlass/barrier.h): `__syncthreads()` then thread 0's `red.release.gpu` to arrive, thread
  0's `ld.acquire.gpu` then `__syncthreads()` to wait): each writer's stores precede its
  program's bar.sync, which precedes thread 0's release (the atomic's release half, cumulative:
  it releases what the CTA barrier made visible to thread 0); the counter's atomics form one
  release sequence, so the last program's acquire synchronizes with every earlier program's
  release; its bar.sync then orders the acquire before every thread's loads.  The loads are
  thus causality-ordered after every partial's store, and a weak load may not return a value
  overwritten in causality order.  In hardware the acquire invalidates the SM's L1, so no stale
  line survives (not even one an earlier fixup on the same SM read: two tiles of a ragged N can
  share a line): ptxas's sm_90 SASS is `MEMBAR.ALL.GPU`, `ATOMG.E.ADD.STRONG.GPU`,
  `CCTL.IVALL`, `BAR.SYNC`, then the `LDG.E`s (tests/test_ops_split_k.py checks the PTX and
  this SASS on both backends).  A kernel boundary orders launches.  No program waits for another, so the kernel cannot
  deadlock whatever the residency.  Two launches sharing a workspace must not overlap (one
  stream: they do not).
* `SplitKGemm` is the kernel with its kept workspace and counters: `gemm(a, b)` -> C;
  `gemm(a, b, bias, residual, pre)` with the epilogue's operands; `gemm.prepare(a, b, ...)` the
  same with its kernel's checks run once, for calls of those operands' kind.
  `SplitKGemm.build(a, b, config, ...)` compiles it for one call's operands (what tritile.mm /
  tritile.linear remember per call signature, prepared) and takes the workspace of its (device,
  shape) from `split_k_workspace`, allocated once (counters zeroed) and kept.
* `split_k_config(device_type, M, N, K, dtype, num_sms, tiles=None, splits=None)` is the plan:
  the kernel's tiles with `splits`, or None when the GEMM should not split (the rule, measured
  on an H100 with the two-kernel split, is in its docstring).  `tiles` and `splits` name a
  candidate instead (bench/gemm_split_k_h100.py's sweep).  `TRITILE_SPLIT_K`
  (tritile/switches.py): `auto` (default) follows the rule on CUDA; `on` splits wherever K has
  2 tiles or more, with tile_config's tiles (CPU included: the tests' way to run this path
  through the interpreter); `off` never.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Optional, Union

import torch

import tritile
import tritile.language as T
from tritile.ops.epilogues import apply_epilogue
from tritile.ops.gemm_loop import accumulate_tiles, tile_config
from tritile.runtime.kernel import JITKernel, PreparedCall
from tritile.switches import schedule_switch

# The measured rule (H100, bench/gemm_split_k_h100.py, bench/NOTES.md session 19, measured with
# the split then made of two kernels: partials, then a reduction): splitting pays for a GEMM of
# few output tiles and both M and N wide, over a long K (a weight gradient 1024 x 1024 summed over
# 16384 tokens: 128x128 tiles in 2 splits, 0.90x cuBLAS against 0.38x unsplit); it lost wherever
# M <= 128 (decoding's linears, M = 16 / 64 / 128: the unsplit narrow tiles were the fastest at
# every split count tried, the second kernel costing more than the SMs it fills) and for more
# splits than fill the SMs once.  The one-kernel split's sweep (session 20,
# gemm_split_k_fused_h100.json) kept it: the weight gradient 0.89x as with two kernels, M = 128
# 0.79-0.82x against 1.00-1.04 unsplit, 16 x 8192 x 8192 0.96-0.97 against 0.98; only M = 16 at
# N = K = 4096, where the unsplit tiles fill half the SMs, gained (THIN_ROWS).  Since tile_config
# swaps a thin GEMM's operands (session 24, gemm_thin_swap_h100.json), 16 x 4096 x 4096 runs unsplit
# (64 swapped programs 1.09-1.12x, in two shares 1.02-1.06x); a split still paid where the swapped
# tiles fill at most a quarter of the SMs (16 x 1024 x 4096: 16 programs, 1.01-1.11x -> 1.06-1.13x).
SPLIT_TILES = dict(block_M=128, block_N=128, block_K=64, num_stages=4, threads=256)
MIN_ROWS = 256  # M and N both at least this (narrower GEMMs keep tile_config's narrow tiles)
MIN_K_TILES_PER_SPLIT = 32  # each share a long pipelined loop (measured: 128 K tiles a share)
THIN_ROWS = 16  # at most this many rows: split in 2 where the narrow tiles leave 3/4 of the SMs idle
THIN_SPLIT_K = (2048, 4096)  # measured: K = 4096 gained; at 8192 (also 64 programs, of 64x128) every split lost


@tritile.jit
def matmul_split_k(A, B, Bias, Residual, Pre, Workspace, Counters, splits: int = 2, block_M: int = 64,
                   block_N: int = 64, block_K: int = 32, num_stages: int = 2, threads: int = 128,
                   dtype=T.float16, accum_dtype=T.float32, trans_A: bool = False, trans_B: bool = False,
                   has_bias: bool = False, activation: str = "none", has_residual: bool = False,
                   keep_pre: bool = False, swap_ab: bool = False):
    """C = act(A @ B + Bias) + Residual, K split in `splits` shares; one program per (tile, share)."""
    M, N, K = T.const("M, N, K")
    A: T.Tensor((K, M) if trans_A else (M, K), dtype)
    B: T.Tensor((N, K) if trans_B else (K, N), dtype)
    Bias: T.Tensor((N,) if has_bias else (1,), dtype)
    Residual: T.Tensor((M, N) if has_residual else (1, 1), dtype)
    Pre: T.Tensor((M, N) if keep_pre else (1, 1), dtype)
    Workspace: T.Tensor((splits, M, N), accum_dtype)
    Counters: T.Tensor((T.ceildiv(M, block_M), T.ceildiv(N, block_N)), T.int32)
    C = T.empty((M, N), dtype)
    k_tiles_per_split = T.ceildiv(T.ceildiv(K, block_K), splits)

    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), splits, threads=threads) as (bx, by, bz):
        A_shared = T.alloc_shared((block_K, block_M) if trans_A else (block_M, block_K), dtype)
        B_shared = T.alloc_shared((block_N, block_K) if trans_B else (block_K, block_N), dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
        partial = T.alloc_fragment((block_M, block_N), accum_dtype)

        accumulate_tiles(A, B, A_shared, B_shared, C_local, bx, by, K, block_M, block_N, block_K, num_stages,
                         trans_A, trans_B, k_first=bz * k_tiles_per_split, k_count=k_tiles_per_split,
                         swap_ab=swap_ab)
        T.copy(C_local, Workspace[bz, by * block_M, bx * block_N])
        T.sync_threads()  # every thread's partial stored before the count (one thread's atomic) releases them
        arrived = T.atomic_add(Counters[by, bx], 1, memory_order="acq_rel", return_prev=True)
        if arrived == splits - 1:  # the tile's last share: every partial is stored
            T.copy(Workspace[0, by * block_M, bx * block_N], C_local)
            for s in T.serial(1, splits):
                T.copy(Workspace[s, by * block_M, bx * block_N], partial)
                for i, j in T.Parallel(block_M, block_N):
                    C_local[i, j] += partial[i, j]
            apply_epilogue(C_local, C, Bias, Residual, Pre, bx, by, block_M, block_N, dtype, has_bias, activation,
                           has_residual, keep_pre)
            Counters[by, bx] = 0  # ready for the next call
    return C


@dataclass(frozen=True)
class SplitKGemm:
    """The split GEMM with its kept workspace and counters; `placeholders` stand for the epilogue
    operands (Bias, Residual, Pre) of a call that has none."""

    kernel: Union[JITKernel, PreparedCall]
    workspace: torch.Tensor
    counters: torch.Tensor
    placeholders: tuple

    def __call__(self, a: torch.Tensor, b: torch.Tensor, *epilogue_operands) -> torch.Tensor:
        return self.kernel(a, b, *(epilogue_operands or self.placeholders), self.workspace, self.counters)

    def prepare(self, a: torch.Tensor, b: torch.Tensor, *epilogue_operands) -> "SplitKGemm":
        """This GEMM with its kernel prepared (`JITKernel.prepare`: checked once) for calls with
        operands of the kind of these."""
        kernel = self.kernel.prepare(a, b, *(epilogue_operands or self.placeholders), self.workspace, self.counters)
        return dataclasses.replace(self, kernel=kernel)

    @classmethod
    def build(cls, a: torch.Tensor, b: torch.Tensor, config: dict, dtype, trans_A: bool = False,
              trans_B: bool = False, epilogue_operands: tuple = (), split_gemm=None, **epilogue) -> "SplitKGemm":
        """The kernel for operands `a`, `b` (as the kernel takes them: transposed ones already
        swapped back) with `config` (split_k_config's), the epilogue's flags (`has_bias`,
        `activation`, `has_residual`, `keep_pre`) and its operands (Bias, Residual, Pre; none:
        placeholders), and the (device, shape)'s workspace and counters.  `split_gemm` builds
        the kernel instead of `matmul_split_k` (the same function on one backend:
        bench/bench_h100.py)."""
        M, N = (a.shape[1] if trans_A else a.shape[0]), (b.shape[0] if trans_B else b.shape[1])
        workspace, counters = split_k_workspace(a.device, config["splits"], M, N, -(-M // config["block_M"]),
                                                -(-N // config["block_N"]))
        placeholders = (a.new_empty(1), a.new_empty((1, 1)), a.new_empty((1, 1)))
        kernel = (split_gemm or matmul_split_k).kernel_for(a, b, *(epilogue_operands or placeholders), workspace,
                                                           counters, dtype=dtype, trans_A=trans_A, trans_B=trans_B,
                                                           **config, **epilogue)
        return cls(kernel, workspace, counters, placeholders)


@functools.lru_cache(maxsize=None)
def split_k_workspace(device: torch.device, splits: int, M: int, N: int, tile_rows: int, tile_cols: int) -> tuple:
    """(Workspace (splits, M, N) float32, Counters (tile_rows, tile_cols) int32 zeros) of a split
    GEMM on `device`: allocated once and kept, shared by the split GEMMs of that shape (each call
    leaves the counters at zero; calls on one stream run one after the other)."""
    return (torch.empty((splits, M, N), dtype=torch.float32, device=device),
            torch.zeros((tile_rows, tile_cols), dtype=torch.int32, device=device))


def split_k_config(device_type: str, M: int, N: int, K: int, dtype: torch.dtype = torch.float16,
                   num_sms: int = 132, tiles: Optional[dict] = None, splits: Optional[int] = None) -> Optional[dict]:
    """The kernel's config ({block_M, block_N, block_K, num_stages, threads, splits}) for this
    GEMM, or None: leave it unsplit.

    Rule (auto: CUDA, half precision): M at most THIN_ROWS (decoding's rows), where tile_config's
    tiles give at most a quarter of the SMs a program, splits in 2 on those tiles (16 x 1024 x
    4096: 16 swapped programs become 32, 1.01-1.11 -> 1.06-1.13x cuBLAS, session 24; at 16 x 4096
    x 4096 the 64 swapped programs now beat their split; at 16 x 8192 x 8192 every split lost, as
    at M = 128: K within THIN_SPLIT_K).  Else M and N both at least MIN_ROWS, and SPLIT_TILES's output
    tiles fill at most half the SMs; then K splits into the largest power of two of shares that
    keeps one program per SM at most and MIN_K_TILES_PER_SPLIT K tiles per share (None if that is
    1).  `on` splits any GEMM of 2 K tiles or more, with tile_config's tiles.

    A candidate instead of the rule (the sweep's, whatever TRITILE_SPLIT_K says): `tiles` (the
    tile config: block_M, block_N, block_K, num_stages, threads) and `splits`, any count from 2
    to K's tiles (ValueError otherwise, naming the argument)."""
    if tiles is not None or splits is not None:
        if tiles is None or splits is None:
            raise ValueError("split_k_config: a candidate needs both 'tiles' and 'splits'")
        k_tiles = -(-K // tiles["block_K"])
        if not 2 <= splits <= k_tiles:
            raise ValueError(f"split_k_config: argument 'splits' is {splits}; K = {K} has {k_tiles} tiles of "
                             f"{tiles['block_K']}, so 2 to {k_tiles} shares")
        return dict(tiles, splits=splits)
    mode = schedule_switch("TRITILE_SPLIT_K")
    if mode == "off" or (mode == "auto" and (device_type != "cuda" or dtype == torch.float32)):
        return None
    if mode == "on":
        config = tile_config(device_type, M, N, K, dtype)
        k_tiles = -(-K // config["block_K"])
        return dict(config, splits=min(k_tiles, max(2, num_sms // output_tiles(M, N, config)))) if k_tiles > 1 else None
    if M <= THIN_ROWS:
        config = tile_config(device_type, M, N, K, dtype)
        halves = 4 * output_tiles(M, N, config) <= num_sms and THIN_SPLIT_K[0] <= K <= THIN_SPLIT_K[1]
        return dict(config, splits=2) if halves else None
    tile_count, k_tiles, shares = output_tiles(M, N, SPLIT_TILES), K // SPLIT_TILES["block_K"], 1
    if min(M, N) < MIN_ROWS or 2 * tile_count > num_sms:
        return None
    while tile_count * shares * 2 <= num_sms and k_tiles // (shares * 2) >= MIN_K_TILES_PER_SPLIT:
        shares *= 2
    return dict(SPLIT_TILES, splits=shares) if shares > 1 else None


def output_tiles(M: int, N: int, config: dict) -> int:
    return -(-M // config["block_M"]) * -(-N // config["block_N"])


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """The number of SMs of a CUDA device (the plan's program budget); 132 (an H100) elsewhere."""
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count
