"""The FlashAttention backward's schedule on sm_90 and the general rules behind it:

* 1-D tiles of a global tensor's last dim (the backward's per-query LSE and Delta) are TMA
  copies (`instructions.tma_row_vector`): a (1, n) block of the tensor's rows view into a 1-D
  NVMMA shared tile viewed as (1, n), so a pipelined loop that also loads such a tile waits on
  its mbarriers alone - no cp.async group and no CTA-wide barrier per step.  The copy's values
  are checked on the `device` fixture against torch (a ragged last tile: TMA zero-fills past
  the row's end, as the masked copy does).
* A register-staged wgmma operand (dS^T, stored from registers for dQ = dS K) gets a version
  per pipelined step (`buffer_versioning.staged_operands`); every stage of the backward planned
  for sm_90 still computes torch's gradients (the interpreter runs each stage).
* No producer warp where the fragments exceed the registers setmaxnreg leaves the consumers.
"""
from __future__ import annotations

import re

import pytest
import torch

import tritile
import tritile.language as T
from tritile.ir.printer import format_func
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
    return JITKernel(flashattn_bwd.fn(4, 32, 4096, dim, causal, **tile_config("cuda", dim, causal)["bwd"]),
                     target=H100)


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

    block_N = tile_config("cuda", dim, causal)["bwd"]["block_N"]
    lse_copy = rf"tma\.async_copy_global_to_shared\(LSE_desc, .*lse\.index\(.*\)\.reshape\(\[1, {block_N}\]\)\)"
    assert re.search(lse_copy, loop)
    assert "tma.async_copy_global_to_shared(Delta_desc, [(bz) * 32 + by, " in loop


@pytest.mark.parametrize("dim, causal", [(128, False), (128, True), (64, False), (64, True)])
def test_backward_adds_dq_by_one_tma_reduce_a_step(dim, causal, monkeypatch):
    """dQ's tile atomic per step is one TMA reduce of the float32 dq tile staged in shared
    memory (codegen/gluon/tma_reduce.py: 0.90 -> 1.00x cuDNN at 4x32x4096x128 on the H100,
    bench/NOTES.md session 22): its rows, head and batch stay inside dQ (block indices below the
    grid; the causal loop's rows ``(first + j_t - 1) * 64`` for j_t < 64 - first,
    `NonNegative.upper_bound`), which the rows view of dQ needs.  No atomic per element, no
    conversion of the wgmma accumulator; in the PTX one `cp.reduce.async.bulk.tensor` per
    reduce statement (the steady loop, and the last step where it is peeled)."""
    kernel = flash_bwd_kernel(dim, causal, monkeypatch)
    source = kernel.get_source("gluon")
    reduces = re.findall(r"async_reduce_add\(dQ_desc, \[\(\(bz\) \* 32 \+ by\) \* 4096 \+ .*\], _stage\d+\)", source)
    assert reduces and "atomic_add(" not in source.replace("async_reduce_add(", ""), source
    ops = re.findall(r"cp\.reduce\.async\.bulk\.tensor\.2d\.global\.shared::cta\.add", kernel.get_source("ptx"))
    assert len(ops) == len(reduces)


def test_backward_reduce_staging_outlives_the_epilogue_buffers():
    """A kernel that is neither persistent nor warp specialized (grouped-query attention's) ends
    its loop with a reduce still reading the staging tile, then allocates the dK / dV epilogue's
    tiles: the staging tile's last use comes after them (a wait, then a store into it), so
    Triton's allocator cannot give them its bytes - it did, and dQ came out wrong on the H100
    (test_attention_on_the_gpu, head dim 128 with 4 K/V heads)."""
    from tritile.ops.attention import flashattn_bwd, tile_config

    kernel = JITKernel(flashattn_bwd.fn(2, 16, 1024, 128, False, groups=4, **tile_config("cuda", 128, False)["bwd"]),
                       target=H100, backend="gluon")
    body = kernel.get_source("gluon")
    body = body[body.index("def main("):body.index("def tritile_launch(")]
    stage = re.search(r"async_reduce_add\(dQ_desc, \[.*\], (_stage\d+)\)", body).group(1)
    last_use = body.rindex(f"{stage}.store(gl.zeros(")
    assert body.rindex("tma.store_wait(0)", 0, last_use) > body.rindex("gl.allocate_shared_memory(") > body.rindex(
        "async_reduce_add(")


@pytest.mark.parametrize("dim, causal", [(128, False), (128, True), (64, True)])
def test_backward_without_tma_reduce_adds_dq_by_16_byte_atomics_without_masks(dim, causal, monkeypatch):
    """Under `TRITILE_TMA_REDUCE=0` (the per-element path other tile atomics keep): no mask (the
    indices stay inside dQ, as above), the wgmma accumulator (64 x 128 or 128 x 64 float32, 2
    contiguous a thread) converted to the coalesced layout: 8 `atom...v4.f32` a thread per step
    at head dim 128 (16 in the PTX: the loop and its last step; 4 and 8 for 64 x 64 causal at
    head dim 64), all unpredicated - where the kernel had 16 v2 ones a step, each behind a
    branch on `bz < 4 & by < 32`.  The conversion's scratch (32 KB) fits beside the buffers."""
    monkeypatch.setenv("TRITILE_TMA_REDUCE", "0")
    kernel = flash_bwd_kernel(dim, causal, monkeypatch)
    atomics = [line.strip() for line in kernel.get_source("gluon").splitlines() if "gl.atomic_add(" in line]
    assert len(atomics) == 2 and all("mask=" not in a and "gl.convert_layout(dq" in a for a in atomics), atomics
    ptx = kernel.get_source("ptx")
    ops = re.findall(r"(?:@(%p\d+)\s+)?((?:atom|red)\.global\S*)", ptx)
    from tritile.ops.attention import tile_config

    config = tile_config("cuda", dim, causal)["bwd"]
    per_step = config["block_N"] * dim // (config["threads"] * 4)  # 4 float32 an atomic
    assert [op for _, op in ops] == ["atom.global.gpu.relaxed.add.v4.f32"] * (2 * per_step), ops
    always = set(re.findall(r"mov\.pred\s+(%p\d+), -1;", ptx))
    assert all(not pred or pred in always for pred, _ in ops), ops
    assert kernel._codegen(H100).metadata.shared <= H100.shared_memory_limit


def test_backward_keeps_its_warps_when_its_fragments_exceed_the_consumer_registers(monkeypatch):
    """With every copy of its loop a TMA copy the backward qualifies for a producer warp, but
    its fragments (256 registers a thread at head dim 128, 288 at 64) exceed the 240 setmaxnreg
    leaves two consumer warpgroups: by default it keeps all 255 (under 240, head dim 64 spilled
    448 bytes, 16 without the producer).  128 x 32 tiles (192 registers) get the producer."""
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


def bwd_reference(q, k, v, do, causal):
    """(LSE in base 2, Delta, dq, dk, dv) of SDPA at float32."""
    q32, k32, v32 = (t.float().requires_grad_() for t in (q, k, v))
    scores = q32 @ k32.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(scores, -1) * 1.44269504
    out = torch.softmax(scores, -1) @ v32
    out.backward(do.float())
    delta = (out * do.float()).sum(-1)
    return lse.detach(), delta.detach(), q32.grad, k32.grad, v32.grad


@pytest.mark.parametrize("causal", [False, True])
def test_every_sm90_stage_of_the_backward_computes_torchs_gradients(causal):
    """dS^T versioned by the loop (`staged=['dsT_shared']`): the interpreter runs each stage of
    the sm_90 pass list (128 keys x 64 queries on two warpgroups, head dim 64, 192 queries so the
    loop alternates versions an odd number of times) against torch."""
    from tritile.interpreter import execute
    from tritile.lowering import run_passes
    from tritile.ops.attention import flashattn_bwd

    batch, heads, seq, dim = 1, 2, 192, 64
    torch.manual_seed(7 + causal)
    q, k, v, do = (torch.randn(batch, heads, seq, dim, dtype=torch.float16) for _ in range(4))
    lse, delta, dq_ref, dk_ref, dv_ref = bwd_reference(q, k, v, do, causal)
    frontend = flashattn_bwd.fn(batch, heads, seq, dim, causal, block_M=128, block_N=64, num_stages=2, threads=256)
    stages = run_passes(frontend, H100)
    assert "staged=['dsT_shared']" in format_func(dict(stages)["buffer_versioning"])
    for name, func in stages:
        dq = torch.zeros(batch, heads, seq, dim)
        dk, dv = torch.empty_like(q), torch.empty_like(q)
        execute(func, [q, k, v, do, lse, delta, dq, dk, dv], {})
        for got, want in ((dq, dq_ref), (dk, dk_ref), (dv, dv_ref)):
            torch.testing.assert_close(got.float(), want, rtol=5e-3, atol=5e-3, msg=lambda m: f"after {name}: {m}")


def test_staged_operands_are_versioned_only_for_wgmma():
    """On sm_80 (mma.sync reads its shared operands synchronously) dS^T keeps one tile."""
    from tritile.lowering import run_passes
    from tritile.ops.attention import flashattn_bwd

    frontend = flashattn_bwd.fn(1, 2, 192, 64, False, block_M=128, block_N=64, num_stages=2, threads=256)
    for target, versions in ((H100, "[2, 128, 64]"), (Target("cuda", 80), None)):
        text = format_func(dict(run_passes(frontend, target, stop_after="buffer_versioning"))["buffer_versioning"])
        alloc = next(line for line in text.splitlines() if "dsT_shared = T.alloc_shared(" in line)
        assert (versions in alloc) if versions else "[128, 64]" in alloc and "staged=" not in text, alloc


@tritile.jit(out_idx=[3])
def staged_chain(blocks, transposed, dtype="float16"):
    """D = sum_j op(fp16(X_j Y)) W, op(S) = S^T when `transposed`: S is stored from registers
    into shared memory for the second gemm of each step."""

    @T.prim_func
    def main(X: T.Tensor([blocks * 64, 64], dtype), Y: T.Tensor([64, 64], dtype), W: T.Tensor([64, 64], dtype),
             D: T.Tensor([64, 64], "float32")):
        with T.Kernel(1, threads=128) as bx:
            x = T.alloc_shared([64, 64], dtype)
            y = T.alloc_shared([64, 64], dtype)
            w = T.alloc_shared([64, 64], dtype)
            s_shared = T.alloc_shared([64, 64], dtype)
            s = T.alloc_fragment([64, 64], "float")
            s_cast = T.alloc_fragment([64, 64], dtype)
            acc = T.alloc_fragment([64, 64], "float")
            T.copy(Y, y)
            T.copy(W, w)
            T.clear(acc)
            for j in T.Pipelined(blocks, num_stages=2):
                T.copy(X[j * 64:(j + 1) * 64, :], x)
                T.clear(s)
                T.gemm(x, y, s)
                T.copy(s, s_cast)
                T.copy(s_cast, s_shared)
                T.gemm(s_shared, w, acc, transpose_A=transposed)
            T.copy(acc, D)

    return main


@pytest.mark.parametrize("transposed", [True, False])
def test_a_staged_operand_is_versioned_unless_it_is_an_untransposed_a(transposed):
    """Read as a transposed A (dS^T in the backward) the staged tile gets a version per step and
    every sm_90 stage still computes torch's result; read as an untransposed A it is a row buffer
    (consumer_partitions splits those by rows) and keeps one tile."""
    from tritile.interpreter import execute
    from tritile.lowering import run_passes

    blocks = 3
    torch.manual_seed(11)
    x, y, w = (torch.randn(*shape, dtype=torch.float16) / 4 for shape in ((blocks * 64, 64), (64, 64), (64, 64)))
    stages = run_passes(staged_chain.fn(blocks, transposed), H100)
    assert ("staged=['s_shared']" in format_func(dict(stages)["buffer_versioning"])) == transposed
    ref = sum(((x[j * 64:(j + 1) * 64].float() @ y.float()).half().float().T if transposed else
               (x[j * 64:(j + 1) * 64].float() @ y.float()).half().float()) @ w.float() for j in range(blocks))
    for name, func in stages:
        d = torch.empty(64, 64)
        execute(func, [x, y, w, d], {})
        torch.testing.assert_close(d, ref, rtol=1e-3, atol=1e-3, msg=lambda m: f"after {name}: {m}")


def test_a_versioned_staged_operand_compiles_for_sm90():
    kernel = JITKernel(staged_chain.fn(3, True), target=H100)
    source = kernel.get_source("gluon")
    assert "s_shared = gl.allocate_shared_memory(gl.float16, [2, 64, 64]" in source
    assert re.search(r"warpgroup_mma\(s_shared\.index\(.*\)\.permute\(\(1, 0\)\), w,", source), source
    assert "wgmma.mma_async" in kernel.get_source("ptx")


def test_a_staged_operand_keeps_one_tile_where_its_versions_would_not_fit():
    """128 x 128 tiles at head dim 128 take 225 KB of the H100's 227 with one dS^T tile: a
    second (32 KB) would not fit, so the kernel keeps one and still compiles."""
    from tritile.lowering import run_passes
    from tritile.ops.attention import flashattn_bwd

    frontend = flashattn_bwd.fn(1, 2, 512, 128, False, block_M=128, block_N=128, num_stages=2, threads=256)
    stages = run_passes(frontend, H100)
    assert "staged=" not in format_func(dict(stages)["buffer_versioning"])
    assert stages[-1][1].attrs["shared_bytes"] <= H100.shared_memory_limit


@pytest.mark.parametrize("dim, causal, groups", [(128, False, 1), (128, True, 1), (64, False, 1), (128, True, 4),
                                                 (64, False, 4)])
def test_the_backward_gets_a_producer_warp(dim, causal, groups):
    """The attention op's backward schedule (`BACKWARD_SWITCHES`): a producer warp, where the
    register bound of `auto` refuses it; at head dim 128 ptxas fits the kernel in the consumers'
    240 registers without a spill (measured 1.07-1.12x faster on the H100, bench/NOTES.md session
    21); at head dim 64 it spills a few bytes and still measured 1.10x faster (session 22).  GQA's
    one loop over its group's (head, query block) steps is a top-level pipelined loop: it gets the
    producer too, and its clamped head and block keep dQ's tile atomic a TMA reduce even causal,
    where the loop's trip count depends on the key block (session 23)."""
    from test_consumer_partitions import ptxas_advisories

    from tritile import switches
    from tritile.ops.attention import BACKWARD_SWITCHES, flashattn_bwd, tile_config

    with switches.overridden(BACKWARD_SWITCHES):
        kernel = JITKernel(flashattn_bwd.fn(4, 32, 4096, dim, causal, groups=groups,
                                            **tile_config("cuda", dim, causal)["bwd"]),
                           target=H100, backend="gluon")
        ptx = kernel.get_source("ptx")
    assert "warp_specialization" in kernel.func.attrs
    # its persistent tiles are bounded by the last tile, so dQ's tiles provably stay inside dQ: a TMA reduce
    assert "async_reduce_add(dQ_desc" in kernel.get_source("gluon")
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240;", ptx)
    if dim == 128:
        advisories = "\n".join(ptxas_advisories(ptx))
        assert "0 bytes spill stores" in advisories and "C75" not in advisories, advisories


def test_lazy_kernels_are_cached_per_schedule_override():
    """A kernel built under `switches.overridden` is not served to a call under other switches."""
    from tritile import switches
    from tritile.ops.attention import flashattn_bwd

    plain = flashattn_bwd(1, 2, 64, 128, True, block_M=32, block_N=32)
    with switches.overridden({"TRITILE_WARP_SPECIALIZE": "on"}):
        forced = flashattn_bwd(1, 2, 64, 128, True, block_M=32, block_N=32)
    assert forced is not plain and flashattn_bwd(1, 2, 64, 128, True, block_M=32, block_N=32) is plain

