"""TileLang's hand-split thread ranges: `tx = T.get_thread_binding()` read in `if` conditions
(`if tx < 128:` / `elif 128 <= tx < 256:` / `else:`; examples/deepseek_mhc/example_mhc_pre.py,
deepseek_mla/example_mla_decode_ws.py): branches of whole warp groups are `T.ws` sections (their
mbarrier protocol checked and serialized), other branches run in program order; the interpreter
and Triton's interpreter of the triton.language kernel against torch, sm_90 PTX of both backends,
and CompileErrors at the user's line for what has no tile meaning."""
import pytest
import torch

import tritile
import tritile.language as T
from tritile.errors import CompileError

BACKENDS = ["auto", "triton"]  # on CPU tensors: tritile's interpreter / Triton's interpreter


def split_rows(n, h, threads=96):
    """example_mhc_pre's shape: the first threads compute a small result, the others stream rows
    (a branch of 32 of 96 threads: not a warp group)."""

    @T.prim_func
    def main(x: T.Tensor((n, h), T.float32), a: T.Tensor((n, 4), T.float32), y: T.Tensor((n, h), T.float32),
             s: T.Tensor((n, 4), T.float32)):
        with T.Kernel(n, threads=threads) as i:
            m = T.alloc_shared(4, T.float32)
            T.copy(a[i, 0], m)
            tx = T.get_thread_binding()
            if tx < 32:
                f = T.alloc_fragment(4, T.float32)
                for j in T.Parallel(4):
                    f[j] = T.sigmoid(m[j])
                T.copy(f, s[i, 0])
            else:
                for k in T.Pipelined(h // 32, num_stages=2):
                    t = T.alloc_fragment(32, T.float32)
                    T.copy(x[i, k * 32], t)
                    for j in T.Parallel(32):
                        t[j] = t[j] * a[i, 0] + a[i, 1]
                    T.copy(t, y[i, k * 32])

    return main


def producer_consumer(M, N, K, block_M=64, block_N=32, block_K=32):
    """TileLang's warp-specialized GEMM with `if tx < 128:` / `else:` instead of `T.ws`."""

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16), C: T.Tensor((M, N), T.float16)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), T.float16)
            B_shared = T.alloc_shared((block_K, block_N), T.float16)
            C_local = T.alloc_fragment((block_M, block_N), T.float32)
            data_is_ready = T.alloc_barrier(arrive_count=128)
            compute_is_done = T.alloc_barrier(arrive_count=128)
            tx = T.get_thread_binding()
            if tx >= 128:
                T.clear(C_local)
            for ko in T.serial(T.ceildiv(K, block_K)):
                if tx < 128:
                    T.barrier_wait(compute_is_done, (ko + 1) % 2)
                    T.tma_copy(A[by * block_M, ko * block_K], A_shared, barrier=data_is_ready)
                    T.tma_copy(B[ko * block_K, bx * block_N], B_shared, barrier=data_is_ready)
                    T.barrier_arrive(data_is_ready)
                else:
                    T.barrier_wait(data_is_ready, ko % 2)
                    T.gemm(A_shared, B_shared, C_local)
                    T.barrier_arrive(compute_is_done)
            if not tx < 128:
                T.copy(C_local, C[by * block_M, bx * block_N])

    return main


def three_groups(n):
    """An `elif` chain over three warp groups, and a nested branch of 64 threads."""

    @T.prim_func
    def main(X: T.Tensor((n, 64), T.float32), Y: T.Tensor((3, n, 64), T.float32)):
        with T.Kernel(n, threads=384) as i:
            tx = T.get_thread_binding()
            warp = tx // 32
            if tx < 128:
                for j in T.Parallel(64):
                    Y[0, i, j] = X[i, j] + 1.0
            elif tx >= 128 and tx < 256:
                for j in T.Parallel(64):
                    Y[1, i, j] = X[i, j] * 2.0
            elif 0 <= warp % 12 - 8 and (tx % 128 < 64 or tx % 128 >= 64):
                if tx < 320:
                    for j in T.Parallel(64):
                        Y[2, i, j] = X[i, j] - 3.0

    return main


@pytest.mark.parametrize("threads", [96, 128])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_branch_of_some_threads_runs_in_program_order(backend, threads):
    torch.manual_seed(0)
    n, h = 3, 128
    x, a = torch.randn(n, h), torch.randn(n, 4)
    y, s = torch.zeros(n, h), torch.zeros(n, 4)
    tritile.compile(split_rows(n, h, threads), backend=backend)(x, a, y, s)
    torch.testing.assert_close(y, x * a[:, :1] + a[:, 1:2])
    torch.testing.assert_close(s, a.sigmoid())


@pytest.mark.parametrize("backend", BACKENDS)
def test_warp_group_branches_are_ws_sections(backend):
    torch.manual_seed(1)
    M, N, K = 96, 64, 160
    A, B = torch.randn(M, K).half(), torch.randn(K, N).half()
    C = torch.zeros(M, N).half()
    tritile.compile(producer_consumer(M, N, K), backend=backend)(A, B, C)
    torch.testing.assert_close(C, (A.float() @ B.float()).half(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_elif_chain_of_warp_groups(backend):
    torch.manual_seed(2)
    X = torch.randn(4, 64)
    Y = torch.zeros(3, 4, 64)
    tritile.compile(three_groups(4), backend=backend)(X, Y)
    torch.testing.assert_close(Y, torch.stack([X + 1, X * 2, X - 3]))


def test_thread_branches_compile_for_hopper():
    for func in (split_rows(3, 128, 128), producer_consumer(96, 64, 160)):
        for backend in ("gluon", "triton"):
            ptx = tritile.compile(func, target="cuda:90", backend=backend).get_source("ptx")
            assert ".target sm_90" in ptx, backend
    # 96 and 384 threads (example_mhc_pre, example_mla_decode_ws): the Gluon backend's layouts need a
    # power of two of warps; the triton.language backend runs the power of two below, and the
    # default backend falls back to it
    for func in (split_rows(3, 128), three_groups(4)):
        for backend in ("triton", None):
            ptx = tritile.compile(func, target="cuda:90", backend=backend).get_source("ptx")
            assert ".target sm_90" in ptx, backend


def _kernel(body_line):
    src = f'''
def make():
    @T.prim_func
    def main(A: T.Tensor((256,), T.float32), n: T.int32):
        with T.Kernel(1, threads=256) as bx:
            tx = T.get_thread_binding()
            bar = T.alloc_barrier(arrive_count=32)
            {body_line}
    return main
'''
    return src


# (a thread index used as a value - `A[tx] = 1.0`, `1.0 if tx < 32 else 2.0` - makes the body per-thread
# code: tests/test_tilelang_language_per_thread.py)
@pytest.mark.parametrize("line, message", [
    ("if tx < n:\n                A[0] = 1.0", "not a comparison with a compile-time integer"),
    ("if tx < 32:\n                T.barrier_arrive(bar)", r"threads \[0, 32\) is not whole warp groups"),
    ("if (tx < 32) + 1 > 1:\n                A[0] = 1.0", "only be an `if` statement's condition"),
])
def test_other_uses_of_the_thread_index_are_compile_errors(tmp_path, line, message):
    import importlib.util

    path = tmp_path / "kernel_src.py"
    path.write_text("import tritile.language as T\n" + _kernel(line))
    spec = importlib.util.spec_from_file_location("kernel_src", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(CompileError, match=message) as info:
        module.make()
    assert "kernel_src.py" in str(info.value)


def wgmma_consumer(M, N, K):
    """TileLang's hand-made warp specialization names (example_warp_specialize_flashmla):
    `T.set_max_nreg` per branch, `T.fence_proxy_async` in the producer, `T.wgmma_gemm` +
    `T.wait_wgmma` in the consumer."""

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((N, K), T.float16), C: T.Tensor((M, N), T.float32)):
        with T.Kernel(1, threads=256) as bx:
            A_s = T.alloc_shared((M, K), T.float16)
            B_s = T.alloc_shared((N, K), T.float16)
            acc = T.alloc_fragment((M, N), T.float32)
            ready = T.alloc_barrier(arrive_count=128)
            tx = T.get_thread_binding()
            if tx >= 128:
                T.set_max_nreg(40, 0)
                T.copy(A, A_s)
                T.copy(B, B_s)
                T.fence_proxy_async()
                T.barrier_arrive(ready)
            else:
                T.set_max_nreg(232, 1)
                T.barrier_wait(ready, 0)
                T.clear(acc)
                T.wgmma_gemm(A_s[:, : K // 2], B_s[:, : K // 2], acc, transpose_B=True)
                T.wgmma_gemm(A_s[:, K // 2 :], B_s[:, K // 2 :], acc, transpose_B=True)
                T.wait_wgmma(0)
                T.copy(acc, C)

    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_wgmma_gemm_wait_wgmma_and_set_max_nreg(backend):
    torch.manual_seed(3)
    A, B = torch.randn(64, 64).half(), torch.randn(64, 64).half()
    C = torch.zeros(64, 64)
    tritile.compile(wgmma_consumer(64, 64, 64), backend=backend)(A, B, C)
    torch.testing.assert_close(C, A.float() @ B.float().T, rtol=1e-3, atol=1e-3)


def test_wgmma_gemm_compiles_for_hopper():
    for backend in ("gluon", "triton"):
        ptx = tritile.compile(wgmma_consumer(64, 64, 64), target="cuda:90", backend=backend).get_source("ptx")
        assert ".target sm_90" in ptx, backend
