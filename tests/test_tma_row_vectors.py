"""1-D tiles of a global tensor's last dim (the FlashAttention backward's per-query LSE and Delta)
are TMA copies on sm_90 (`instructions.tma_row_vector`): a (1, n) block of the tensor's rows view
into a 1-D NVMMA shared tile viewed as (1, n), so a pipelined loop that also loads such a tile
waits on its mbarriers alone - no cp.async group and no CTA-wide barrier per step.

The copy's values are checked on the `device` fixture against torch (a ragged last tile: TMA
zero-fills past the row's end, as the masked copy does); the schedule by compiling for sm_90
on the CPU, with ptxas's register report.
"""
from __future__ import annotations

import re

import pytest
import torch

import tritile
import tritile.language as T
from tritile.runtime.kernel import JITKernel
from tritile.runtime.target import Target

pytestmark = pytest.mark.usefixtures("gluon_backend")  # the Gluon backend's own code

H100 = Target("cuda", 90)


@tritile.jit(out_idx=[1])
def scaled_row_tiles(rows, cols, block, dtype="float32"):
    """Out[r, c] = 2 * X[r, c] + X[r, c] (c within the tile) through a pipelined shared tile."""

    @T.prim_func
    def main(X: T.Tensor([rows, cols], dtype), Out: T.Tensor([rows, cols], dtype)):
        with T.Kernel(rows, threads=128) as bx:
            x = T.alloc_shared([block], dtype)
            y = T.alloc_fragment([block], dtype)
            for j in T.Pipelined(T.ceildiv(cols, block), num_stages=2):
                T.copy(X[bx, j * block:(j + 1) * block], x)
                for i in T.Parallel(block):
                    y[i] = x[i] * 3
                T.copy(y, Out[bx, j * block:(j + 1) * block])

    return main


def test_row_tiles_match_torch(device):
    x = torch.randn(6, 100, device=device)  # 100 columns: the second 64-column tile is ragged
    out = scaled_row_tiles(6, 100, 64)(x)
    torch.testing.assert_close(out, x * 3, rtol=1e-6, atol=1e-6)


def test_row_tiles_take_tma_descriptors():
    source = JITKernel(scaled_row_tiles.fn(6, 100, 64), target=H100).get_source("gluon")
    assert "cp.async_copy_global_to_shared" not in source
    assert re.search(r"tma\.async_copy_global_to_shared\(X_desc, \[bx, \(?j_t \* 64\)?\], .*\.reshape\(\[1, 64\]\)\)",
                     source), source
    assert "((1, 64), HOST_X_desc_layout)" in source
    assert "HOST_X_desc_layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2" in source


def flash_bwd_kernel(dim, causal, monkeypatch, warp_specialize="0"):
    from tritile.ops.attention import flashattn_bwd, tile_config

    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", warp_specialize)
    return JITKernel(flashattn_bwd.fn(4, 32, 4096, dim, causal, **tile_config("cuda", dim)["bwd"]), target=H100)


@pytest.mark.parametrize("dim, causal", [(128, False), (64, True)])
def test_flash_attention_backward_loads_lse_and_delta_by_tma(dim, causal, monkeypatch):
    """The backward's loop (Q, dO, LSE, Delta per query block) has only TMA copies: its steps
    wait on mbarriers, with no cp.async and no CTA barrier but the one before the dQ wgmma
    reads the dS^T tile the warps just stored."""
    kernel = flash_bwd_kernel(dim, causal, monkeypatch)
    source = kernel.get_source("gluon")
    loop = source[source.index("for j_t in range("):source.index("\n    mbarrier.wait(j_t_bars.index(")]
    assert "cp.async" not in source and "cp.wait_group" not in loop and "gl.thread_barrier()" not in loop
    from tritile.ops.attention import tile_config

    block_N = tile_config("cuda", dim)["bwd"]["block_N"]
    assert re.search(rf"tma\.async_copy_global_to_shared\(LSE_desc, .*lse\.index\(.*\)\.reshape\(\[1, {block_N}\]\)\)", loop)
    assert "tma.async_copy_global_to_shared(Delta_desc, [(bz) * 32 + by, " in loop


def test_backward_keeps_its_warps_when_its_fragments_exceed_the_consumer_registers(monkeypatch):
    """With every copy of its loop a TMA copy the backward qualifies for a producer warp, but
    its fragments (256 registers a thread at head dim 128, 288 at 64) exceed the 240 setmaxnreg
    leaves two consumer warpgroups: by default it keeps all 255 (under 240, head dim 64 spilled
    456 bytes, 12 without the producer).  128 x 32 tiles (192 registers) get the producer."""
    from tritile.lowering.warp_specialization import fragment_registers

    for dim in (128, 64):
        kernel = flash_bwd_kernel(dim, False, monkeypatch, warp_specialize="auto")
        assert fragment_registers(kernel.func.kernel) > 240
        assert "warp_specialization" not in kernel.func.attrs
    from tritile.ops.attention import flashattn_bwd

    small = JITKernel(flashattn_bwd.fn(4, 32, 4096, 128, False, block_M=128, block_N=32, num_stages=2, threads=256),
                      target=H100)
    assert fragment_registers(small.func.kernel) == 192
    assert "warp_specialization" in small.func.attrs


def test_a_row_tile_of_under_128_bytes_stays_cp_async():
    """Each version of a pipelined tile must start at a 128-byte aligned TMA destination: 16
    float32 (64 bytes) take cp.async."""
    source = JITKernel(scaled_row_tiles.fn(6, 100, 16), target=H100).get_source("gluon")
    assert "cp.async_copy_global_to_shared" in source and "X_desc" not in source
