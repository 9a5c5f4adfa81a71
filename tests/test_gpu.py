"""Gluon backend on a real GPU: the kernels of test_codegen.py launched and compared with torch.

Marked `gpu`; skipped on machines without CUDA.  The target is the current device's
compute capability (sm_90 -> TMA + wgmma, sm_80/89 -> cp.async + mma.sync).
"""
from __future__ import annotations

import pytest
import torch

from test_codegen import (PIPELINE_CASES, compile_for, pipeline_program, pipelined_gemm, register_operand_gemm,
                          scan_and_atomics, shared_operand_two_gemms, softmax_rows)
from tritile.ir import dtypes as dt
from tritile.runtime.target import Target

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def device_target() -> Target:
    major, minor = torch.cuda.get_device_capability()
    return Target("cuda", major * 10 + minor)


def close(out, ref, rel):
    torch.testing.assert_close(out.float(), ref.float(), rtol=rel, atol=rel * ref.float().abs().max().item())


@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("stages", [2, 3])
def test_pipelined_gemm(transpose_b, stages):
    func = pipelined_gemm(M=256, N=256, K=512, S=stages, transpose_b=transpose_b)
    k = compile_for(func, device_target())
    a = torch.randn(256, 512, device="cuda", dtype=torch.float16)
    b = torch.randn(256, 512, device="cuda", dtype=torch.float16)
    if not transpose_b:
        b = b.T.contiguous()  # stored (K, N)
    out = torch.empty(256, 256, device="cuda", dtype=torch.float16)
    k.launch([a, b, out], {})
    ref = a.float() @ (b.float().T if transpose_b else b.float())
    close(out, ref, 1e-2)


def test_pipelined_gemm_dynamic_m_with_ragged_edge():
    func = pipelined_gemm(N=128, K=256, BN=64, S=3, dynamic_m=True)
    k = compile_for(func, device_target())
    m = 200  # not a multiple of the 128-row tile: TMA zero-fill / masked stores
    a = torch.randn(m, 256, device="cuda", dtype=torch.float16)
    b = torch.randn(256, 128, device="cuda", dtype=torch.float16)
    out = torch.full((m, 128), float("nan"), device="cuda", dtype=torch.float16)
    k.launch([a, b, out], {func.dynamic_vars[0]: m})
    close(out, a.float() @ b.float(), 1e-2)


def test_float32_gemm_fma_path():
    func = pipelined_gemm(M=128, N=128, K=128, BM=64, BN=64, BK=32, S=2, dtype=dt.float32)
    k = compile_for(func, device_target())
    a = torch.randn(128, 128, device="cuda")
    b = torch.randn(128, 128, device="cuda")
    out = torch.empty(128, 128, device="cuda")
    k.launch([a, b, out], {})
    close(out, a @ b, 1e-4)


def test_softmax_rows():
    k = compile_for(softmax_rows(M=256, N=64, BM=64), device_target())
    x = torch.randn(256, 64, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    k.launch([x, y], {})
    close(y, torch.softmax(x.float(), dim=1), 1e-2)


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_seed003_shared_tile_feeding_two_gemm_transposes(order):
    k = compile_for(shared_operand_two_gemms(order=order), device_target())
    a, x, y = (torch.randn(64, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    o1 = torch.empty(64, 64, device="cuda")
    o2 = torch.empty(64, 64, device="cuda")
    k.launch([a, x, y, o1, o2], {})
    close(o1, a.float() @ x.float().T, 1e-2)
    close(o2, y.float() @ x.float(), 1e-2)


def test_register_operand_gemm():
    k = compile_for(register_operand_gemm(), device_target())
    q, kk, v = (torch.randn(64, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    o = torch.empty(64, 64, device="cuda")
    k.launch([q, kk, v, o], {})
    p = (0.125 * (q.float() @ kk.float().T)).half().float()
    close(o, p @ v.float(), 1e-2)


@pytest.mark.parametrize("name", sorted(PIPELINE_CASES))
def test_pipeline_pass_programs(name):
    prog = pipeline_program(name)
    k = compile_for(prog.func, device_target())
    args = [t.cuda() for t in prog.make_args(int(torch.randint(0, 2**31 - 1, ()).item()))]
    k.launch(args, prog.dims)
    c_ref, d_ref = prog.reference([t.cpu() for t in args])
    close(args[3].cpu(), c_ref, 1e-2)
    if prog.read_after:
        close(args[4].cpu(), d_ref, 1e-2)


def test_cumsum_and_atomics():
    k = compile_for(scan_and_atomics(), device_target())
    x = torch.randn(64, 64, device="cuda")
    y = torch.empty_like(x)
    z0 = torch.randn(64, 64, device="cuda")
    w0 = torch.randn(1, device="cuda")
    z, w = z0.clone(), w0.clone()
    k.launch([x, y, z, w], {})  # grid of 2 blocks: each adds once
    close(y, torch.cumsum(x, dim=1), 1e-4)
    close(z, z0 + 2 * x, 1e-4)
    close(w, w0 + 2, 1e-4)


def test_example_gemm_cuda_config_on_ragged_shape():
    """examples/gemm.py's CUDA config (wide tiles, 8 warps, panel rasterisation, TMA-store
    epilogue) on a shape that is a multiple of no tile dim: TMA zero-fill and store clipping."""
    from examples.gemm import matmul, tile_config

    a = torch.randn(320, 200, device="cuda", dtype=torch.float16)
    b = torch.randn(200, 392, device="cuda", dtype=torch.float16)
    out = matmul(a, b, **tile_config("cuda"))
    close(out, a.float() @ b.float(), 1e-2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dim", [64, 128])
def test_example_flash_attention_cuda_config(causal, dim):
    """K/V through TMA over the [B*H*S, D] rows view, 2-stage ring, 8 warps."""
    from examples.flash_attention import ref_program, tritile_attention

    q, k, v = (torch.randn(2, 2, 256, dim, device="cuda", dtype=torch.float16) for _ in range(3))
    close(tritile_attention(q, k, v, causal), ref_program(q, k, v, causal), 1e-2)


@pytest.mark.parametrize("causal", [False, True])
def test_example_flash_attention_several_tiles_per_program(causal):
    """The persistent split kernel with 256 tiles on 132 programs: each consumer's TMA store
    of O from its O_shared slot drains under the next tile, whose epilogue waits for it."""
    from examples.flash_attention import ref_program, tritile_attention

    q, k, v = (torch.randn(4, 8, 1024, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    close(tritile_attention(q, k, v, causal), ref_program(q, k, v, causal), 1e-2)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_three_consumers_on_a_ragged_row_count(causal):
    """192-row tiles split over three consumer warpgroups, S = 1024 (not a multiple of 192):
    the last row block of a head lies partly past S, so Q and O must not go through the
    [B*H*S, D] TMA view, whose clipping would let that block read and write the next head."""
    from examples.flash_attention import flashattn, ref_program

    q, k, v = (torch.randn(2, 4, 1024, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    kernel = flashattn(2, 4, 1024, 1024, 64, causal, block_M=192, block_N=128, num_stages=2, threads=384)
    close(kernel(q, k, v), ref_program(q, k, v, causal), 1e-2)


def test_persistent_shared_epilogue_gemm_forced(monkeypatch):
    """TileLang's quickstart epilogue (C through C_shared) on persistent tiles, 4 x 3 tiles on
    5 programs of a ragged shape: the TMA store from C_shared drains under the next tile."""
    monkeypatch.setenv("TRITILE_PERSISTENT", "0")
    from test_codegen import lowered, shared_epilogue_gemm
    from tritile.codegen.gluon import compile_kernel
    from tritile.lowering.persistent_tiles import persist

    func = shared_epilogue_gemm(200, 136, 72, False)
    k = compile_kernel(persist(lowered(func, device_target()), 5), device_target())
    a = torch.randn(200, 72, device="cuda", dtype=torch.float16)
    b = torch.randn(72, 136, device="cuda", dtype=torch.float16)
    c = torch.full((200, 136), float("nan"), device="cuda", dtype=torch.float16)
    k.launch([a, b, c], {})
    close(c, a.float() @ b.float(), 1e-2)


@pytest.mark.parametrize("M,N,K", [(16, 1000, 512), (128, 4096, 256), (1100, 4104, 192)])
def test_example_gemm_shape_aware_configs(M, N, K):
    """tritile_matmul picks its config by shape (small M: one warpgroup, narrow tiles; large:
    128x256 tiles, 9 x 17 = 153 of them here).
    Row strides stay multiples of 16 bytes, as TMA requires."""
    from examples.gemm import tritile_matmul

    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    close(tritile_matmul(a, b), a.float() @ b.float(), 1e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_persistent_gemm_forced_on_a_ragged_shape(dtype, monkeypatch):
    """Persistent tiles with few programs (each runs several tiles: the mbarrier phase continues
    across tiles and the TMA store drains under the next tile) on a ragged shape."""
    monkeypatch.setenv("TRITILE_PERSISTENT", "0")  # lowered on one CTA per tile, then persisted here
    import tritile.language as T
    from examples.gemm import matmul, tile_config
    from test_codegen import lowered
    from tritile.codegen.gluon import compile_kernel
    from tritile.frontend import parse_kernel
    from tritile.lowering.persistent_tiles import persist

    t_dtype = T.bfloat16 if dtype == torch.bfloat16 else T.float16
    func = parse_kernel(matmul.fn, dict(M=700, N=1304, K=328, dtype=t_dtype, **tile_config("cuda")))
    k = compile_kernel(persist(lowered(func, device_target()), 5), device_target())  # 6 x 6 tiles on 5 programs
    a = torch.randn(700, 328, device="cuda", dtype=dtype)
    b = torch.randn(328, 1304, device="cuda", dtype=dtype)
    c = torch.full((700, 1304), float("nan"), device="cuda", dtype=dtype)
    k.launch([a, b, c], {})
    close(c, a.float() @ b.float(), 1e-2)
