"""ir/shared_lifetimes.py and codegen/gluon/shared_lifetimes.py: shared buffers allocated at their first use, so that
Triton's liveness-based allocator reuses bytes of buffers that are never live together."""
from __future__ import annotations

import re

import pytest
import torch

import tritile
import tritile.language as T
from tritile.ir import nodes as ir
from tritile.runtime.kernel import JITKernel
from tritile.runtime.target import Target

pytestmark = pytest.mark.usefixtures("gluon_backend")  # the Gluon backend's own code

H100 = Target("cuda", 90)


@tritile.jit(out_idx=[3])
def product_plus_tile(M, N, block=64):
    """C = A @ B + D for A of `block` columns: one top-level gemm, then D's tile staged through
    shared memory while that gemm may still be in flight."""

    @T.prim_func
    def main(A: T.Tensor((M, block), "float16"), B: T.Tensor((block, N), "float16"), D: T.Tensor((M, N), "float16"),
             C: T.Tensor((M, N), "float16")):
        with T.Kernel(N // block, M // block, threads=128) as (bx, by):
            A_shared = T.alloc_shared((block, block), "float16")
            B_shared = T.alloc_shared((block, block), "float16")
            D_shared = T.alloc_shared((block, block), "float16")
            acc = T.alloc_fragment((block, block), "float")
            T.copy(A[by * block, 0], A_shared)
            T.copy(B[0, bx * block], B_shared)
            T.gemm(A_shared, B_shared, acc, clear_accum=True)
            T.copy(D[by * block, bx * block], D_shared)
            for i, j in T.Parallel(block, block):
                acc[i, j] += D_shared[i, j]
            T.copy(acc, C[by * block, bx * block])

    return main


def gluon_for(func):
    kernel = JITKernel(func, target=H100)
    return kernel._codegen(H100)


def line_of(source: str, pattern: str) -> int:
    return next(i for i, line in enumerate(source.splitlines()) if re.search(pattern, line))


def test_plan_defers_to_the_first_use_and_keeps_gemm_operands_on_top():
    from tritile.ir.shared_lifetimes import lifetimes
    from tritile.ir.transform import top_level

    func = product_plus_tile.fn(256, 256)
    top = top_level(func.kernel.body)
    spans = {s.buffer.name: s for s in lifetimes(func.kernel.body, keep_on_top=False)}
    gemm_at = next(i for i, s in enumerate(top) if isinstance(s, ir.Gemm))
    for name in ("A_shared", "B_shared"):  # operands: allocated before the first statement
        assert (spans[name].first, spans[name].last, spans[name].deferred) == (0, gemm_at, True)
    d = spans["D_shared"]  # from its copy to the T.Parallel reading it, after the gemm
    assert d.deferred and gemm_at < d.first < d.last and isinstance(top[d.last], ir.Parallel)
    on_top = lifetimes(func.kernel.body, keep_on_top=True)
    assert not any(s.deferred for s in on_top)
    assert [s.first for s in on_top] == [top.index(a) for a in top if isinstance(a, ir.Alloc)
                                         and a.buffer.scope == "shared"]


def test_budget_counts_the_bytes_live_at_once():
    from tritile.lowering import run_passes

    func = run_passes(product_plus_tile.fn(256, 256), H100, stop_after="shared_memory_budget")[-1][1]
    tile = 64 * 64 * 2
    assert func.attrs["shared_buffers"] == {"A_shared": tile, "B_shared": tile, "D_shared": tile}
    assert func.attrs["shared_bytes"] == 2 * tile  # D's tile is live only after the gemm's operands


def test_attention_epilogue_tile_reuses_the_q_tile_bytes():
    from examples.flash_attention import flashattn

    for block_N, most in ((64, 41 * 1024), (128, 73 * 1024)):  # Q + K and V rings; O reuses Q
        gluon = gluon_for(flashattn.fn(16, 16, 1024, 1024, 64, False, block_M=64, block_N=block_N,
                                       num_stages=2, threads=128))
        assert gluon.metadata.shared <= most
        source = gluon.source
        assert line_of(source, r"O_shared = gl.allocate_shared_memory") > line_of(source, r"for k_t in range")


def test_product_plus_tile_shares_bytes_without_waiting_needlessly():
    gluon = gluon_for(product_plus_tile.fn(256, 256))
    assert gluon.metadata.shared < 3 * 64 * 64 * 2  # D's tile reuses A's or B's bytes
    assert "warpgroup_mma_wait(" not in gluon.source  # the top-level gemm is synchronous


def test_a_deferred_allocation_first_retires_wgmmas_still_in_flight():
    """The generated kernels retire their wgmmas before the next top-level statement; this
    checks the rule for a state where one is still in flight."""
    from tritile.codegen.gluon import shared_lifetimes
    from tritile.codegen.gluon.emitter import Emitter
    from tritile.ir.transform import walk
    from tritile.lowering import run_passes

    func = run_passes(product_plus_tile.fn(256, 256), H100)[-1][1]
    em = Emitter(func, H100)
    shared_lifetimes.plan(em, func)
    buffers = {n.buffer.name: n.buffer for n in walk(func.kernel.body) if isinstance(n, ir.Alloc)}
    first_use_of_d = next(stmt for stmt in walk(func.kernel.body) if buffers["D_shared"] in
                          em.deferred_allocs.get(id(stmt), ()))
    em.inflight.add(buffers["acc"])
    em.issued = [(buffers["acc"], None)]
    shared_lifetimes.emit_before(em, first_use_of_d)
    emitted = [line.strip() for line in em.lines]
    assert emitted[0].startswith("acc = warpgroup_mma_wait(num_outstanding=0")
    assert emitted[-1].startswith("D_shared = gl.allocate_shared_memory")
    assert not em.inflight


def test_warp_specialized_and_persistent_kernels_keep_allocations_on_top():
    from examples.flash_attention import flashattn

    source = gluon_for(flashattn.fn(1, 2, 1024, 1024, 128, False, block_M=128, block_N=128, num_stages=2,
                                    threads=256)).source
    assert "warp_specialize(" in source
    kernel_body = source[source.rindex("@gluon.jit"):]
    allocations = [line for line in kernel_body.splitlines() if "gl.allocate_shared_memory(gl.float16" in line]
    fork = line_of(kernel_body, r"gl\.warp_specialize\(")
    assert allocations and all(line_of(kernel_body, re.escape(a)) < fork for a in allocations)


@pytest.mark.gpu
def test_product_plus_tile_is_exact_on_the_gpu():
    a, b, d = (torch.randn(256, size, device="cuda", dtype=torch.float16) for size in (64, 256, 256))
    b = b[:64]
    out = product_plus_tile(256, 256)(a, b, d)
    torch.testing.assert_close(out.float(), a.float() @ b.float() + d.float(), rtol=1e-2, atol=5e-2)


def test_product_plus_tile_on_the_interpreter():
    a, b, d = torch.randn(128, 64, dtype=torch.float16), torch.randn(64, 128, dtype=torch.float16), torch.randn(
        128, 128, dtype=torch.float16)
    out = product_plus_tile(128, 128)(a, b, d)
    torch.testing.assert_close(out.float(), a.float() @ b.float() + d.float(), rtol=1e-2, atol=5e-2)


# pipeline replay program 1056 (bench/NOTES.md, session 16): a 1-stage GEMM loop, then a 2-stage
# one whose 64-byte swizzled A tile took the bytes of the first loop's 128-byte swizzled B tile
PROGRAM_1056 = ("GemmChain(tiles=(128, 64, 32), threads=128, stages=(1, 2), m=256, n=64, k_sizes=(128, 192), "
                "reduce='max', use='init', relu=True, staged_store=True, policy='FullRow')")


def test_gemm_operands_of_sibling_loops_never_share_bytes():
    import pipeline_kernels as PK
    from tritile.codegen.gluon import emit_module

    spec = eval(PROGRAM_1056, vars(PK))
    source = emit_module(PK.lower(spec, H100)[-1][1], H100).source
    first_loop = line_of(source, r"for k_t in range")
    for name in ("A_shared", "B_shared", "A2_shared", "B2_shared"):
        assert line_of(source, rf"{name} = gl.allocate_shared_memory") < first_loop, name
    assert line_of(source, r"C_shared = gl.allocate_shared_memory") > first_loop  # the epilogue tile still reuses


@pytest.mark.gpu
def test_program_1056_is_right_on_the_gpu():
    import pipeline_kernels as PK
    from tritile.codegen.gluon import compile_kernel

    spec = eval(PROGRAM_1056, vars(PK))
    compiled = compile_kernel(PK.lower(spec, H100)[-1][1], H100)
    args = PK.program_args(spec, 37884, "cuda")
    compiled.launch(args, PK.program_dims(spec, args))
    (want, rtol, atol), = PK.program_expected(spec, args)
    torch.testing.assert_close(PK.program_outputs(spec, args)[0], want, rtol=rtol, atol=atol)
