"""A user's ring of shared tiles, `T.alloc_shared((slots, M, K))` used one slot at a time:
`lowering/shared_slots.py` makes it a versioned buffer for the Gluon backend (alone, and merged
with the stage dim of a `T.Pipelined` loop that versions it too), `codegen/triton/slot_tiles.py`
gives the triton.language backend one register tile per slot.  Every stage runs through the
interpreter, the triton backend through Triton's interpreter; Gluon compiles for sm_90."""
import pytest
import torch

import tritile
import tritile.language as T
from tritile.codegen.triton.slot_tiles import split_slots
from tritile.interpreter import execute
from tritile.ir import nodes as ir
from tritile.ir.transform import walk


@tritile.jit
def pipelined_ring(A, B, block_M, block_N, block_K, slots=3, num_stages=2, dtype=T.float16, accum_dtype=T.float32):
    """A ring of `slots` tiles inside a T.Pipelined loop, which versions it once more."""
    M, N, K = T.const("M, N, K")
    A: T.Tensor((M, K), dtype)
    B: T.Tensor((K, N), dtype)
    C = T.empty((M, N), dtype)
    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
        A_shared = T.alloc_shared((slots, block_M, block_K), dtype)
        B_shared = T.alloc_shared((slots, block_K, block_N), dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
        T.clear(C_local)
        for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
            T.copy(A[by * block_M, ko * block_K], A_shared[ko % slots, :, :])
            T.copy(B[ko * block_K, bx * block_N], B_shared[ko % slots, :, :])
            T.gemm(A_shared[ko % slots, :, :], B_shared[ko % slots, :, :], C_local)
        T.copy(C_local, C[by * block_M, bx * block_N])
    return C


@tritile.jit
def previous_tile_sum(X, block=32):
    """Out[tile t] = X[tile t] + X[tile t - 1]: each slot is read one iteration after it is
    written, elementwise inside a T.Parallel (a load / store at a slot index)."""
    M, N = T.const("M, N")
    X: T.Tensor((M, N), T.float32)
    Out = T.empty((M, N), T.float32)
    with T.Kernel(1, threads=128) as bx:
        ring = T.alloc_shared((2, block, N), T.float32)
        acc = T.alloc_fragment((block, N), T.float32)
        for i, j in T.Parallel(block, N):
            ring[1, i, j] = 0.0
        for t in range(T.ceildiv(M, block)):
            T.copy(X[t * block, 0], ring[t % 2, :, :])
            for i, j in T.Parallel(block, N):
                acc[i, j] = ring[t % 2, i, j] + ring[(t + 1) % 2, i, j]
            T.copy(acc, Out[t * block, 0])
    return Out


def _gemm_operands(M, N, K, device="cpu"):
    torch.manual_seed(0)
    return (torch.randn(M, K, dtype=torch.float16, device=device),
            torch.randn(K, N, dtype=torch.float16, device=device))


def _previous_tile_reference(x, block=32):
    prev = torch.cat([torch.zeros(block, x.shape[1]), x[:-block]])
    return x + prev


def test_every_stage_of_a_pipelined_ring_matches_torch(assert_close):
    kernel = _on_gluon(pipelined_ring.compile(M=128, N=128, K=256, block_M=64, block_N=64, block_K=32))
    text = kernel.get_source("shared_slots")
    assert "T.alloc_shared([6, 64, 32], float16)  # 6 versions of A_shared" in text
    assert "A_shared[ko % 2 * 3 + ko % 3, :, :]" in text  # stage * slots + slot
    a, b = _gemm_operands(128, 128, 256)
    for name, func in kernel.stages:
        c = torch.empty(128, 128, dtype=torch.float16)
        execute(func, [a, b, c], {})
        assert_close(c, (a.float() @ b.float()).half())


def _on_gluon(kernel):
    """`kernel`'s program compiled by the Gluon backend (which runs the whole pass list)."""
    return tritile.compile(kernel.stages[0][1], backend="gluon")


def test_a_ring_alone_becomes_versioned():
    func = _on_gluon(previous_tile_sum.compile(M=96, N=32)).stages[-1][1]
    ring = next(n.buffer for n in walk(func.kernel.body) if isinstance(n, ir.Alloc) and n.buffer.root.name == "ring")
    assert ring.num_versions == 2 and tuple(ring.shape) == (2, 32, 32) and ring.tile_shape == (32, 32)


def test_a_buffer_read_across_slots_is_no_ring():
    @T.prim_func
    def whole(A: T.Tensor((2, 64), T.float32), B: T.Tensor((2, 64), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            s = T.alloc_shared((2, 64), T.float32)
            T.copy(A[0, 0], s)  # both slots at once
            T.copy(s[1, :], B[0, :])
            T.copy(s[0, :], B[1, :])

    func = tritile.compile(whole, out_idx=[1], backend="gluon").stages[-1][1]
    assert all(n.buffer.num_versions == 1 for n in walk(func.kernel.body) if isinstance(n, ir.Alloc))


@pytest.mark.parametrize("num_stages", [0, 2])
def test_gluon_compiles_a_ring_for_sm90(num_stages):
    kernel = _on_gluon(pipelined_ring.compile(M=256, N=256, K=512, block_M=128, block_N=128, block_K=64,
                                              num_stages=num_stages))
    source = kernel.get_source("gluon")
    assert "gl.allocate_shared_memory(gl.float16, [" + ("6" if num_stages else "3") + ", 128, 64]" in source
    assert "rank=3" not in source  # the encoding is one slot's
    ptx = kernel.get_source("ptx")
    assert "wgmma.mma_async" in ptx
    if num_stages:
        assert "cp.async.bulk.tensor" in ptx


def test_gluon_compiles_a_ring_read_in_a_parallel():
    kernel = _on_gluon(previous_tile_sum.compile(M=96, N=32))
    assert "ring.index(((t + 1) % 2)).load(" in kernel.get_source("gluon")
    assert "ld.shared" in kernel.get_source("ptx")


def test_triton_backend_gives_each_slot_a_register_tile():
    func = split_slots(pipelined_ring.compile(M=128, N=128, K=256, block_M=64, block_N=64,
                                              block_K=32).stages[3][1])
    shared = [n.buffer for n in walk(func.kernel.body) if isinstance(n, ir.Alloc) and n.buffer.scope == "shared"]
    assert [b.name for b in shared] == ["A_shared_0", "A_shared_1", "A_shared_2", "B_shared_0", "B_shared_1",
                                        "B_shared_2"]
    gemm_branches = [n for n in walk(func.kernel.body) if isinstance(n, ir.If)
                     and isinstance(n.then_body.stmts[0], ir.Gemm)]
    assert len(gemm_branches) == 2  # ko % 3 == 0, == 1, else: both operands in one branch each


@pytest.mark.parametrize("program", ["pipelined_ring", "previous_tile_sum"])
def test_triton_backend_runs_a_ring(program, assert_close):
    if program == "pipelined_ring":
        a, b = _gemm_operands(96, 64, 160)
        program = pipelined_ring.compile(M=96, N=64, K=160, block_M=64, block_N=32, block_K=32)
        args, expected = (a, b), (a.float() @ b.float()).half()
    else:
        torch.manual_seed(1)
        x = torch.randn(96, 32)
        program = previous_tile_sum.compile(M=96, N=32)
        args, expected = (x,), _previous_tile_reference(x)
    kernels = [tritile.compile(program.stages[0][1], backend=backend) for backend in ("auto", "triton")]
    for kernel in kernels:  # the tile-IR interpreter, then Triton's interpreter of the generated code
        assert_close(kernel(*args), expected)
    assert ".entry" in kernels[1].get_source("ptx")  # and Triton compiles it for sm_90


def test_triton_backend_reads_a_ring_slot_into_a_let():
    """A ring read into a `Let` is left whole (slot_tiles.py); its rows are then selected at the
    runtime slot index from the one register tile (codegen/semantics.py's `selected_text`)."""
    @T.prim_func
    def main(A: T.Tensor((2, 64), T.float32), B: T.Tensor((64,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            s = T.alloc_shared((2, 64), T.float32)
            T.copy(A[0, 0], s[0, :])
            T.copy(A[1, 0], s[1, :])
            for k in range(2):
                x = s[k, 3]
                T.fill(B[0:64], x)

    a = torch.randn(2, 64)
    kernel = tritile.compile(main, out_idx=[1], backend="triton", target="cuda:90")
    assert torch.equal(kernel(a), a[1, 3].expand(64))  # Triton's interpreter of the generated code
    assert ".entry" in kernel.get_source("ptx")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["gluon", "triton"])
@pytest.mark.parametrize("num_stages", [0, 2])
def test_pipelined_ring_on_the_gpu(backend, num_stages, monkeypatch, assert_close):
    monkeypatch.setenv("TRITILE_BACKEND", backend)
    a, b = _gemm_operands(1000, 1024, 1000, "cuda")
    c = pipelined_ring(a, b, 128, 128, 64, num_stages=num_stages)
    assert_close(c, (a.float() @ b.float()).half())


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_ring_read_in_a_parallel_on_the_gpu(backend, monkeypatch, assert_close):
    monkeypatch.setenv("TRITILE_BACKEND", backend)
    torch.manual_seed(1)
    x = torch.randn(200, 32, device="cuda")
    assert_close(previous_tile_sum(x), _previous_tile_reference(x.cpu()).cuda())
