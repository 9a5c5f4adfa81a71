"""TileLang's `T.Persistent(domain, wave_size, index, group_size=8)` (tritile/frontend/persistent.py):
TileLang's persistent GEMM (examples/gemm/example_gemm_persistent.py) at small sizes, tile counts
that `sm_num` does not divide and group sizes that do not divide the last extent, against torch
on the `device` fixture's tensors and through the triton backend; which program takes which tile
in which wave, against TileLang's PersistentFor (src/ir.cc); a Gluon compile check for sm_90."""
import math
import re

import pytest
import torch

import tritile
import tritile.language as T


@tritile.jit
def matmul_persistent(A, B, block_M, block_N, block_K, sm_num, group_size=8, threads=128, num_stages=2,
                      dtype=T.float16, accum_dtype=T.float32):
    M, N, K = T.const("M, N, K")
    A: T.Tensor((M, K), dtype)
    B: T.Tensor((K, N), dtype)
    C = T.empty((M, N), dtype)
    with T.Kernel(sm_num, threads=threads) as (block_id):
        A_shared = T.alloc_shared((block_M, block_K), dtype)
        B_shared = T.alloc_shared((block_K, block_N), dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
        C_shared = T.alloc_shared((block_M, block_N), dtype)
        for bx, by in T.Persistent([T.ceildiv(M, block_M), T.ceildiv(N, block_N)], sm_num, block_id, group_size):
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[bx * block_M, k * block_K], A_shared)
                T.copy(B[k * block_K, by * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C_shared)
            T.copy(C_shared, C[bx * block_M, by * block_N])
    return C


def _operands(M, N, K, device="cpu"):
    torch.manual_seed(0)
    return (torch.randn(M, K, dtype=torch.float16, device=device),
            torch.randn(K, N, dtype=torch.float16, device=device))


def test_gluon_compiles_it_for_sm90(gluon_backend):
    kernel = matmul_persistent.compile(M=1000, N=1000, K=256, block_M=128, block_N=128, block_K=64, sm_num=132)
    assert "for w in range(0, 1):" in kernel.get_source("gluon")  # 64 tiles on 132 programs: one wave
    ptx = kernel.get_source("ptx")
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx


# (M, N, K, sm_num, group_size): 5 x 7 tiles of 32 on 3 programs (35 tiles, 45 with the last group's
# padding to 3), 2 x 3 tiles on 4 programs (fewer tiles than programs), 4 x 4 on 5 (group 8 > 4)
CASES = [(160, 224, 64, 3, 3), (64, 96, 96, 4, 8), (128, 128, 32, 5, 8), (160, 224, 64, 3, 1)]


@pytest.mark.parametrize("M, N, K, sm_num, group_size", CASES)
def test_persistent_gemm_matches_torch(M, N, K, sm_num, group_size, device, assert_close, gluon_backend):
    a, b = _operands(M, N, K, device)
    c = matmul_persistent(a, b, 32, 32, 32, sm_num, group_size)
    assert_close(c, (a.float() @ b.float()).half())


def tilelang_schedule(domain, wave_size, group_size=8):
    """{tile coordinates: (program, wave)} as TileLang's PersistentFor (src/ir.cc) assigns them."""
    last = domain[-1]
    group = max(1, min(group_size, last))
    grouped = [-(-last // group), *domain[:-1], group]
    padded = 1
    for extent in grouped:
        padded *= extent
    schedule = {}
    for wave in range(-(-padded // wave_size)):
        for program in range(wave_size):
            rest, digits = wave * wave_size + program, []
            for extent in reversed(grouped[1:]):
                digits.insert(0, rest % extent)
                rest //= extent
            coords = (*digits[:-1], rest * group + digits[-1])
            if coords[-1] < last:
                assert coords not in schedule
                schedule[coords] = (program, wave)
    return schedule


def _schedule_kernel(domain, wave_size, group_size):
    """Per tile (flattened, row-major): the program that ran it, how many tiles that program ran
    before it, and how often it was run."""
    shape, tiles = tuple(domain), math.prod(domain)

    @T.macro
    def record(Program, Wave, Visits, tile, block_id, done):
        Program[tile] = block_id
        Wave[tile] = done
        T.atomic_add(Visits[tile], 1)

    @T.prim_func
    def main(Program: T.Tensor((tiles,), T.int32), Wave: T.Tensor((tiles,), T.int32),
             Visits: T.Tensor((tiles,), T.int32)):
        with T.Kernel(wave_size, threads=128) as (block_id):
            done = T.alloc_var(T.int32, init=0)
            if len(shape) == 1:
                for i in T.Persistent(list(shape), wave_size, block_id, group_size):
                    record(Program, Wave, Visits, i, block_id, done)
                    done = done + 1
            elif len(shape) == 2:
                for i, j in T.Persistent(list(shape), wave_size, block_id, group_size):
                    record(Program, Wave, Visits, i * shape[1] + j, block_id, done)
                    done = done + 1
            else:
                for i, j, k in T.Persistent(list(shape), wave_size, block_id, group_size):
                    record(Program, Wave, Visits, (i * shape[1] + j) * shape[2] + k, block_id, done)
                    done = done + 1

    return main


@pytest.mark.parametrize("domain, wave_size, group_size", [((5, 7), 3, 3), ((4, 6), 4, 8), ((3, 2, 5), 4, 2),
                                                           ((10,), 3, 4)])
def test_tile_order_is_tilelangs(domain, wave_size, group_size):
    """Every tile exactly once, on TileLang's program; the waves a program runs are in order."""
    kernel = tritile.compile(_schedule_kernel(domain, wave_size, group_size), out_idx=[0, 1])
    visits = torch.zeros(math.prod(domain), dtype=torch.int32)
    program, wave = (t.reshape(domain) for t in kernel(visits))
    visits = visits.reshape(domain)
    assert torch.equal(visits, torch.ones(domain, dtype=torch.int32))
    for coords, (want_program, want_wave) in tilelang_schedule(list(domain), wave_size, group_size).items():
        assert program[coords].item() == want_program, coords
        # the kernel counts the tiles a program ran; TileLang's wave index counts skipped ones too
        earlier = [c for c, (p, w) in tilelang_schedule(list(domain), wave_size, group_size).items()
                   if p == want_program and w < want_wave]
        assert wave[coords].item() == len(earlier), coords


def test_printed_ir_is_the_wave_loop():
    text = matmul_persistent.compile(M=160, N=224, K=64, block_M=32, block_N=32, block_K=32, sm_num=3,
                                     group_size=3).get_source("tile")
    assert "for w in T.serial(0, 15):" in text  # ceildiv(3 groups * 5 rows * 3, 3 programs)
    assert re.search(r"tile_id = w \* 3 \+ block_id\n\s+bx = tile_id // 3 % 5\n", text), text
    assert "by = tile_id // 3 // 5 * 3 + tile_id % 3" in text and "if by < 7:" in text


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_persistent_gemm_on_the_gpu(backend, monkeypatch, assert_close):
    from tritile.carver.arch import driver

    monkeypatch.setenv("TRITILE_BACKEND", backend)
    a, b = _operands(4096 + 128, 4096 - 64, 1024, "cuda")  # 33 x 31 tiles of 128: not a multiple of the SMs
    c = matmul_persistent(a, b, 128, 128, 64, driver.get_num_sms(), threads=256, num_stages=3)
    assert_close(c, (a.float() @ b.float()).half())


def test_names_must_match_the_domain():
    with pytest.raises(tritile.CompileError, match="domain of 2 dimensions but the loop binds 1"):
        @T.prim_func
        def main(A: T.Tensor((4, 4), T.float32)):
            with T.Kernel(2, threads=128) as (block_id):
                for (t,) in T.Persistent([2, 2], 2, block_id):
                    A[t, 0] = 1.0


def test_wave_size_must_be_positive():
    with pytest.raises(tritile.CompileError, match="wave_size must be positive"):
        @T.prim_func
        def main(A: T.Tensor((4, 4), T.float32)):
            with T.Kernel(2, threads=128) as (block_id):
                for i, j in T.Persistent([2, 2], 0, block_id):
                    A[i, j] = 1.0


def test_bare_persistent_is_an_error():
    with pytest.raises(tritile.CompileError, match="must be used as a `for` iterator"):
        @T.prim_func
        def main(A: T.Tensor((4, 4), T.float32)):
            with T.Kernel(2, threads=128) as (block_id):
                T.Persistent([2, 2], 2, block_id)


@pytest.mark.parametrize("M, N, K, sm_num, group_size", CASES[:2])
def test_triton_backend_runs_it(M, N, K, sm_num, group_size, monkeypatch, assert_close):
    monkeypatch.setenv("TRITILE_BACKEND", "triton")  # CPU tensors: Triton's interpreter of the generated kernel
    a, b = _operands(M, N, K)
    assert_close(matmul_persistent(a, b, 32, 32, 32, sm_num, group_size), (a.float() @ b.float()).half())
