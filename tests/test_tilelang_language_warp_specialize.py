"""TileLang's explicit warp specialization (`T.alloc_barrier`, `T.ws`, `T.tma_copy`,
`T.barrier_arrive` / `T.barrier_wait`, also under TileLang's names `T.mbarrier_arrive` /
`T.mbarrier_wait_parity`): TileLang's producer / consumer GEMMs (warp group 0
copies and 1 computes, and the reverse; `num_stages` 0 and 2; a two-slot ring of barriers
indexed by the loop counter) run through the interpreter (its mbarrier model on the frontend's
IR, and the serialized program of `lowering/warp_group_serialization.py`), through the
triton.language backend (Triton's interpreter on CPU) and compile for sm_90 with Gluon; a
barrier protocol that program order does not satisfy is a CompileError at the user's line."""
import pytest
import torch

import tritile
import tritile.language as T
from tritile.interpreter import execute


@tritile.jit
def ws_gemm(A, B, block_M, block_N, block_K, producer=0, num_stages=0, dtype=T.float16, accum_dtype=T.float32):
    """TileLang's example_warp_specialize_gemm_copy_0_gemm_1 (producer=0) / copy_1_gemm_0."""
    M, N, K = T.const("M, N, K")
    A: T.Tensor((M, K), dtype)
    B: T.Tensor((K, N), dtype)
    C = T.empty((M, N), dtype)
    consumer = 1 - producer
    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
        A_shared = T.alloc_shared((block_M, block_K), dtype)
        B_shared = T.alloc_shared((block_K, block_N), dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
        data_is_ready = T.alloc_barrier(arrive_count=128)
        compute_is_done = T.alloc_barrier(arrive_count=128)
        with T.ws(consumer):
            T.clear(C_local)
        for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
            with T.ws(producer):
                T.barrier_wait(compute_is_done, (ko + 1) % 2)
                T.tma_copy(A[by * block_M, ko * block_K], A_shared, barrier=data_is_ready)
                T.tma_copy(B[ko * block_K, bx * block_N], B_shared, barrier=data_is_ready)
                T.barrier_arrive(data_is_ready)
            with T.ws(consumer):
                T.barrier_wait(data_is_ready, ko % 2)
                T.gemm(A_shared, B_shared, C_local)
                T.barrier_arrive(compute_is_done)
        with T.ws(consumer):
            T.copy(C_local, C[by * block_M, bx * block_N])
    return C


@tritile.jit
def ring_gemm(A, B, block_M, block_N, block_K, dtype=T.float16, accum_dtype=T.float32):
    """TileLang's example_warp_specialize_gemm_barrierpipe_stage2: two slots, each with a
    "full" and an "empty" mbarrier, indexed and phased by the loop counter."""
    M, N, K = T.const("M, N, K")
    A: T.Tensor((M, K), dtype)
    B: T.Tensor((K, N), dtype)
    C = T.empty((M, N), dtype)
    slots = 2
    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
        A_shared = T.alloc_shared((slots, block_M, block_K), dtype)
        B_shared = T.alloc_shared((slots, block_K, block_N), dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
        mbars = T.alloc_barrier([128, 128] * slots)  # full[0], full[1], empty[0], empty[1]
        with T.ws(0):
            T.clear(C_local)
        for ko in range(T.ceildiv(K, block_K)):
            with T.ws(1):
                T.barrier_wait(mbars[ko % slots + slots], ((ko // slots) % 2) ^ 1)
                T.tma_copy(A[by * block_M, ko * block_K], A_shared[ko % slots, :, :], barrier=mbars[ko % slots])
                T.tma_copy(B[ko * block_K, bx * block_N], B_shared[ko % slots, :, :], barrier=mbars[ko % slots])
                T.barrier_arrive(mbars[ko % slots])
            with T.ws(0):
                T.barrier_wait(mbars[ko % slots], (ko // slots) % 2)
                T.gemm(A_shared[ko % slots, :, :], B_shared[ko % slots, :, :], C_local)
                T.barrier_arrive(mbars[ko % slots + slots])
        with T.ws(0):
            T.copy(C_local, C[by * block_M, bx * block_N])
    return C


@tritile.jit
def ring_gemm_mbarrier_names(A, B, block_M, block_N, block_K, dtype=T.float16, accum_dtype=T.float32):
    """example_warp_specialize_gemm_barrierpipe_stage2 word for word: TileLang's
    `T.mbarrier_wait_parity(mbarrier=, parity=)` / `T.mbarrier_arrive(mbarrier=)` names."""
    M, N, K = T.const("M, N, K")
    A: T.Tensor((M, K), dtype)
    B: T.Tensor((K, N), dtype)
    C = T.empty((M, N), dtype)
    num_stages = 2
    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
        A_shared = T.alloc_shared((num_stages, block_M, block_K), dtype)
        B_shared = T.alloc_shared((num_stages, block_K, block_N), dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
        mbars = T.alloc_barrier([128, 128] * num_stages)
        with T.ws(0):
            T.clear(C_local)
        for ko in range(T.ceildiv(K, block_K)):
            with T.ws(1):
                T.mbarrier_wait_parity(mbarrier=mbars[ko % num_stages + num_stages],
                                       parity=((ko // num_stages) % num_stages) ^ 1)
                T.tma_copy(A[by * block_M:(by + 1) * block_M, ko * block_K:(ko + 1) * block_K],
                           A_shared[ko % num_stages, :, :], barrier=mbars[ko % num_stages])
                T.tma_copy(B[ko * block_K:(ko + 1) * block_K, bx * block_N:(bx + 1) * block_N],
                           B_shared[ko % num_stages, :, :], barrier=mbars[ko % num_stages])
                T.mbarrier_arrive(mbarrier=mbars[ko % num_stages])
            with T.ws(0):
                T.mbarrier_wait_parity(mbarrier=mbars[ko % num_stages], parity=(ko // num_stages) % num_stages)
                T.gemm(A_shared[ko % num_stages, :, :], B_shared[ko % num_stages, :, :], C_local)
                T.mbarrier_arrive(mbarrier=mbars[ko % num_stages + num_stages])
        with T.ws(0):
            T.copy(C_local, C[by * block_M, bx * block_N])
    return C


def _ws_gemm_with(**fixed):
    return lambda a, b, block_M, block_N, block_K: ws_gemm(a, b, block_M, block_N, block_K, **fixed)


# TileLang's examples/warp_specialize programs, each called as (A, B, block_M, block_N, block_K)
PROGRAMS = {"copy_0_gemm_1": _ws_gemm_with(producer=0), "copy_1_gemm_0": _ws_gemm_with(producer=1),
            "softpipe_stage2": _ws_gemm_with(producer=1, num_stages=2), "barrierpipe_stage2": ring_gemm,
            "barrierpipe_stage2_mbarrier_names": ring_gemm_mbarrier_names}


def _operands(M, N, K, device="cpu"):
    torch.manual_seed(0)
    return (torch.randn(M, K, dtype=torch.float16, device=device),
            torch.randn(K, N, dtype=torch.float16, device=device))


def _reference(a, b):
    return (a.float() @ b.float()).half()


@pytest.mark.parametrize("program", list(PROGRAMS))
def test_warp_specialized_gemm_matches_torch(program, device, assert_close, gluon_backend):
    a, b = _operands(96, 64, 160, device)  # a partial tile in M and in K, five K steps
    assert_close(PROGRAMS[program](a, b, 64, 32, 32), _reference(a, b))


def test_every_stage_matches_torch(assert_close):
    """The frontend's IR (warp groups in program order, exact mbarriers) and the serialized
    program (no barriers left) compute the same GEMM."""
    kernel = ring_gemm.compile(M=96, N=64, K=160, block_M=64, block_N=32, block_K=32)
    stages = dict(kernel.stages)
    serialized = kernel.get_source("warp_group_serialization")
    assert "T.ws" not in serialized and "barrier" not in serialized and "T.gemm" in serialized
    a, b = _operands(96, 64, 160)
    for name in ("tile", "warp_group_serialization", "accumulator_init"):
        c = torch.empty(96, 64, dtype=torch.float16)
        execute(stages[name], [a, b, c], {})
        assert_close(c, _reference(a, b))


@pytest.mark.parametrize("program", list(PROGRAMS))
def test_triton_backend_runs_it(program, monkeypatch, assert_close):
    monkeypatch.setenv("TRITILE_BACKEND", "triton")  # CPU tensors: Triton's interpreter of the generated kernel
    a, b = _operands(64, 64, 96)
    assert_close(PROGRAMS[program](a, b, 32, 32, 32), _reference(a, b))


@pytest.mark.parametrize("num_stages", [0, 2])
def test_gluon_compiles_it_for_sm90(num_stages, gluon_backend):
    kernel = ws_gemm.compile(M=256, N=256, K=256, block_M=128, block_N=128, block_K=64, producer=1,
                             num_stages=num_stages)  # CPU kernels compile their code stages for sm_90
    ptx = kernel.get_source("ptx")
    assert "wgmma.mma_async" in ptx
    if num_stages:  # the serialized loop is pipelined by tritile's passes: TMA loads on mbarriers
        assert "cp.async.bulk.tensor" in ptx and "mbarrier.try_wait" in ptx


def test_gluon_compiles_the_ring_of_slots_for_sm90(gluon_backend):
    """barrierpipe_stage2's `A_shared[ko % 2, :, :]`: a versioned buffer (lowering/shared_slots.py),
    each slot's encoding of rank 2."""
    kernel = ring_gemm.compile(M=96, N=64, K=160, block_M=64, block_N=32, block_K=32)
    source = kernel.get_source("gluon")
    assert "A_shared = gl.allocate_shared_memory(gl.float16, [2, 64, 32], A_shared_layout)" in source
    assert "A_shared.index((ko % 2)).store(" in source and "rank=3" not in source
    assert "wgmma.mma_async" in kernel.get_source("ptx")


def test_the_serialized_kernel_keeps_the_blocks_threads():
    kernel = ws_gemm.compile(M=128, N=128, K=128, block_M=128, block_N=128, block_K=64)
    assert "T.Kernel(1, 1, threads=256)" in kernel.get_source("warp_group_serialization")
    assert "num_warps=8" in kernel.get_source("ttgir") or '"ttg.num-warps" = 8' in kernel.get_source("ttgir")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["gluon", "triton"])
@pytest.mark.parametrize("program", list(PROGRAMS))
def test_warp_specialized_gemm_on_the_gpu(program, backend, monkeypatch, assert_close):
    monkeypatch.setenv("TRITILE_BACKEND", backend)
    a, b = _operands(1024, 1024, 1024, "cuda")  # TileLang's example sizes and tiles
    assert_close(PROGRAMS[program](a, b, 128, 128, 64), _reference(a, b))


# ------------------------------------------------------------------ the mbarrier protocol


def _one_barrier_kernel(wait_parity, arrive_count, arrive_groups):
    @T.prim_func
    def main(A: T.Tensor((128,), T.float32), B: T.Tensor((128,), T.float32)):
        with T.Kernel(1, threads=256) as bx:
            bar = T.alloc_barrier(arrive_count)
            tile = T.alloc_shared((128,), T.float32)
            with T.ws(*arrive_groups):
                T.copy(A[0], tile)
                T.barrier_arrive(bar)
            T.barrier_wait(bar, wait_parity)
            T.copy(tile, B[0])

    return main


def test_barrier_phase_completes_after_all_groups_arrive(assert_close):
    kernel = tritile.compile(_one_barrier_kernel(0, 256, (0, 1)), out_idx=[1])
    a = torch.randn(128)
    assert_close(kernel(a), a)
    execute(kernel.stages[0][1], [a, b := torch.empty(128)], {})  # the frontend's IR, barriers and all
    assert_close(b, a)


def test_wait_that_never_returns_is_reported_at_the_users_line():
    with pytest.raises(tritile.CompileError, match="never returns") as err:
        tritile.compile(_one_barrier_kernel(0, 256, (0,)), out_idx=[1])  # 128 of 256 arrivals
    assert "T.barrier_wait(bar, wait_parity)" in str(err.value)


def test_too_many_arrivals_are_reported():
    with pytest.raises(tritile.CompileError, match="256 threads arrive"):
        tritile.compile(_one_barrier_kernel(0, 128, (0, 1)), out_idx=[1])


def test_swapped_parities_deadlock_names_the_iteration():
    @T.prim_func
    def main(A: T.Tensor((4, 128), T.float32), B: T.Tensor((4, 128), T.float32)):
        with T.Kernel(1, threads=256) as bx:
            full = T.alloc_barrier(128)
            tile = T.alloc_shared((128,), T.float32)
            for i in range(4):
                with T.ws(0):
                    T.copy(A[i, 0], tile)
                    T.barrier_arrive(full)
                with T.ws(1):
                    T.barrier_wait(full, (i + 1) % 2)  # should be i % 2
                    T.copy(tile, B[i, 0])

    with pytest.raises(tritile.CompileError, match=r"never returns.*\(at i = 0\)") as err:
        tritile.compile(main, out_idx=[1])
    assert "T.barrier_wait(full, (i + 1) % 2)" in str(err.value)


def test_runtime_trip_count_around_barriers_is_a_compile_error():
    @T.prim_func
    def main(A: T.Tensor((T.dynamic("n"), 128), T.float32), B: T.Tensor((T.dynamic("n"), 128), T.float32)):
        with T.Kernel(1, threads=256) as bx:
            full = T.alloc_barrier(128)
            tile = T.alloc_shared((128,), T.float32)
            for i in range(A.shape[0]):
                with T.ws(0):
                    T.copy(A[i, 0], tile)
                    T.barrier_arrive(full)
                with T.ws(1):
                    T.barrier_wait(full, i % 2)
                    T.copy(tile, B[i, 0])

    with pytest.raises(tritile.CompileError, match="known at compile time.*depends on n") as err:
        tritile.compile(main, out_idx=[1])
    assert "for i in range(A.shape[0]):" in str(err.value)


def test_barrier_under_an_if_is_a_compile_error():
    @T.prim_func
    def main(A: T.Tensor((128,), T.float32), B: T.Tensor((128,), T.float32)):
        with T.Kernel(2, threads=256) as bx:
            bar = T.alloc_barrier(128)
            with T.ws(0):
                if bx == 0:
                    T.barrier_arrive(bar)
            T.copy(A[0], B[0])

    with pytest.raises(tritile.CompileError, match="inside an if"):
        tritile.compile(main, out_idx=[1])


def test_printed_ir_shows_the_warp_groups():
    text = ring_gemm.compile(M=64, N=32, K=96, block_M=32, block_N=16, block_K=32).get_source("tile")
    assert "with T.ws(1):" in text and "T.alloc_barrier([128, 128, 128, 128])" in text
    assert "T.barrier_wait(mbars[ko % 2 + 2], " in text and "T.barrier_arrive(mbars[ko % 2])" in text


def test_ws_group_outside_the_kernel_threads():
    with pytest.raises(tritile.CompileError, match="no warp group 2"):
        @T.prim_func
        def main(A: T.Tensor((128,), T.float32)):
            with T.Kernel(1, threads=256) as bx:
                with T.ws(2):
                    T.fill(A[0:128], 1.0)


def test_barrier_wait_needs_a_barrier():
    with pytest.raises(tritile.CompileError, match="expected a barrier"):
        @T.prim_func
        def main(A: T.Tensor((128,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                tile = T.alloc_shared((128,), T.float32)
                T.barrier_wait(tile, 0)


def test_mbarrier_arrive_at_a_peer_cta_is_a_compile_error():
    with pytest.raises(tritile.CompileError, match=r"T.mbarrier_arrive: cta_id="):
        @T.prim_func
        def peer(A: T.Tensor((16,), T.float32)):
            with T.Kernel(1, threads=128) as _:
                bar = T.alloc_barrier(128)
                T.mbarrier_arrive(bar, cta_id=1)


@tritile.jit
def hinted_gemm(A, B, producer_registers, block_M=128, block_N=128, block_K=32):
    """A pipelined GEMM of two consumer warp groups under TileLang's register hints
    (examples/linear_attention/example_mamba_chunk_scan.py's `T.no_set_max_nreg()`)."""
    M, N, K = T.const("M, N, K")
    A: T.Tensor((M, K), T.float16)
    B: T.Tensor((K, N), T.float16)
    C = T.empty((M, N), T.float32)
    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
        A_shared = T.alloc_shared((block_M, block_K), T.float16)
        B_shared = T.alloc_shared((block_K, block_N), T.float16)
        C_local = T.alloc_fragment((block_M, block_N), T.float32)
        T.no_set_max_nreg()
        T.disable_warp_group_reg_alloc()
        T.annotate_producer_reg_dealloc(producer_registers)
        T.annotate_consumer_reg_alloc(240)
        T.clear(C_local)
        for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
            T.copy(A[by * block_M, ko * block_K], A_shared)
            T.copy(B[ko * block_K, bx * block_N], B_shared)
            T.gemm(A_shared, B_shared, C_local)
        T.copy(C_local, C[by * block_M, bx * block_N])
    return C


def test_register_hints_change_no_result(device, assert_close, gluon_backend):
    A = torch.randn(128, 96, dtype=torch.float16, device=device)
    B = torch.randn(96, 256, dtype=torch.float16, device=device)
    assert_close(hinted_gemm(A, B, 24), A.float() @ B.float())
    ptx = hinted_gemm.compile(M=128, N=256, K=96, producer_registers=24, target="cuda:90").get_source("ptx")
    assert "wgmma.mma_async" in ptx


def test_register_hint_takes_a_compile_time_count():
    A = torch.randn(128, 64, dtype=torch.float16)
    B = torch.randn(64, 128, dtype=torch.float16)
    with pytest.raises(tritile.CompileError, match="annotate_producer_reg_dealloc: reg_count must be a compile-time integer"):
        hinted_gemm(A, B, 1.5)
