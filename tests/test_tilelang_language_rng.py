"""TileLang's `T.rng_init` / `T.rng_rand` / `T.get_thread_binding` (tritile/frontend/random.py):
cuRAND's Philox4_32_10 stream of `curand_init(seed, seq, off)`, drawn by one thread (threads=1)
in T.Parallel's row-major order.  The kernel of TileLang's examples/rand/rand_uint.py bit for bit
against Triton's own `tl.randint4x` (run in Triton's interpreter, a subprocess: tests/test_philox.py)
and against tritile/interpreter/philox.py; several draws per element, draws outside T.Parallel,
the default `seq` and an unaligned offset against philox.curand_draws.  On the interpreter and on
the triton backend's kernel in Triton's interpreter (CPU tensors), compiled for sm_90 by both
backends; the refusals quote the user's line.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import tritile
import tritile.language as T
from tritile.interpreter import philox

BACKENDS = [None, "triton"]  # None: the interpreter (CPU tensors); triton: its kernel in Triton's interpreter


def rand_uint(M, seed, num_per_thread=128):
    """TileLang's examples/rand/rand_uint.py, as written there (threads=1)."""
    threads = 1
    blk_M = num_per_thread * threads

    @T.prim_func
    def main(A: T.Tensor((M,), T.uint32)):
        with T.Kernel(T.ceildiv(M, threads * num_per_thread), threads=threads) as bx:
            tx = T.get_thread_binding()
            T.rng_init(seed, 0, bx * blk_M + tx * num_per_thread)
            for i, j in T.Parallel(threads, num_per_thread):
                offsets = (bx * threads + i) * num_per_thread
                idx = offsets + j
                if idx < M:
                    A[idx] = T.rng_rand()

    return main


def _as_words(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.int64) & philox.MASK  # uint32 -> its values


_TRITON = textwrap.dedent("""
    import sys
    import torch, triton, triton.language as tl

    @triton.jit
    def rand(X, seed, M, N: tl.constexpr):  # rand_uint.py's triton_rand_1d
        offset = tl.program_id(0) * N + tl.arange(0, N)
        r0, r1, r2, r3 = tl.randint4x(seed, offset)
        i = offset * 4
        tl.store(X + i, r0, mask=i < M)
        tl.store(X + i + 1, r1, mask=i + 1 < M)
        tl.store(X + i + 2, r2, mask=i + 2 < M)
        tl.store(X + i + 3, r3, mask=i + 3 < M)

    seed, M = (int(a) for a in sys.argv[1:3])
    x = torch.empty(M, dtype=torch.uint32)
    rand[(triton.cdiv(M, 128),)](x, seed, M, 32)
    torch.save(x, sys.argv[3])
""")


def _triton_randint4x(tmp_path, seed, m):
    script, out = tmp_path / "rand.py", tmp_path / f"rand_{seed}.pt"
    script.write_text(_TRITON)
    env = dict(os.environ, TRITON_INTERPRET="1")
    subprocess.run([sys.executable, str(script), str(seed), str(m), str(out)], check=True, env=env, timeout=300)
    return _as_words(torch.load(out))


def test_rand_uint_is_tritons_randint4x_bit_for_bit(tmp_path):
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    for m in (512, 384):
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
        expected = _triton_randint4x(tmp_path, seed, m)
        reference = torch.stack(philox.randint4x(seed, torch.arange(m // 4)), -1).reshape(-1)
        assert torch.equal(reference, expected), seed
        for backend in BACKENDS:
            got = tritile.compile(rand_uint(m, seed), out_idx=[0], backend=backend)()
            assert got.dtype == torch.uint32
            assert torch.equal(_as_words(got), expected), (backend, seed, m)


def streams(M, N, seed, off):
    """Draws outside T.Parallel, two per element of a 2-D T.Parallel, the default `seq` (bx) and an
    offset that is not a multiple of 4; a 64-bit seed."""

    @T.prim_func
    def main(A: T.Tensor((2, M, N), T.uint32), B: T.Tensor((2, 3), T.uint32)):
        with T.Kernel(2, threads=1) as bx:
            T.rng_init(seed, off=off + bx)
            B[bx, 0] = T.rng_rand()
            for i, j in T.Parallel(M, N):
                A[bx, i, j] = T.rng_rand() ^ (T.rng_rand() >> 1)
            B[bx, 1] = T.rng_rand()
            B[bx, 2] = T.rng_rand()

    return main


def test_draw_order_of_several_draws_per_element(tmp_path):
    M, N, seed, off = 4, 8, 0x1234_5678_9ABC_DEF1, 5
    # draw numbers: B[.., 0] 0; element n: 1 + 2n and 2 + 2n; B[.., 1] / B[.., 2]: 1 + 2MN, 2 + 2MN
    n = torch.arange(M * N)
    a, b = [], []
    for bx in range(2):
        def draw(k, bx=bx):
            return philox.curand_draws(seed, bx, off + bx, k)
        a.append((draw(1 + 2 * n) ^ (draw(2 + 2 * n) >> 1)).reshape(M, N))
        b.append(torch.stack([draw(torch.tensor(0)), draw(torch.tensor(1 + 2 * M * N)),
                              draw(torch.tensor(2 + 2 * M * N))]))
    a, b = torch.stack(a), torch.stack(b)
    for backend in BACKENDS:
        got_a, got_b = tritile.compile(streams(M, N, seed, off), out_idx=[0, 1], backend=backend)()
        assert torch.equal(_as_words(got_a), a), backend
        assert torch.equal(_as_words(got_b), b), backend


def test_rng_kernels_compile_for_hopper():
    for func, out_idx in ((rand_uint(512, 42), [0]), (streams(4, 8, 7, 5), [0, 1])):
        for backend in ("gluon", "triton"):
            kernel = tritile.compile(func, out_idx=out_idx, target="cuda:90", backend=backend)
            ptx = kernel.get_source("ptx")
            assert ".target sm_90" in ptx and "mul.hi.u32" in ptx, backend


def _serial_loop():
    @T.prim_func
    def main(A: T.Tensor((64,), T.uint32)):
        with T.Kernel(1, threads=1) as bx:
            T.rng_init(1, 0, 0)
            for k in T.serial(4):
                A[k] = T.rng_rand()


def _runtime_extent():
    @T.prim_func
    def main(A: T.Tensor((64,), T.uint32), n: T.int32):
        with T.Kernel(1, threads=1) as bx:
            T.rng_init(1, 0, 0)
            for k in T.Parallel(n):
                A[k] = T.rng_rand()


def _nested_parallel():
    @T.prim_func
    def main(A: T.Tensor((64,), T.uint32)):
        with T.Kernel(1, threads=1) as bx:
            T.rng_init(1, 0, 0)
            for k in T.Parallel(4):
                for m in T.Parallel(4):
                    A[k * 4 + m] = T.rng_rand()


def _init_under_if():
    @T.prim_func
    def main(A: T.Tensor((64,), T.uint32), n: T.int32):
        with T.Kernel(1, threads=1) as bx:
            if n > 0:
                T.rng_init(2, 0, 0)


def _draw_before_init():
    @T.prim_func
    def main(A: T.Tensor((64,), T.uint32)):
        with T.Kernel(1, threads=1) as bx:
            A[0] = T.rng_rand()


def _thread_binding_of_128_threads():  # per-thread code (frontend/per_thread.py) draws no numbers either
    @T.prim_func
    def main(A: T.Tensor((64,), T.uint32)):
        with T.Kernel(1, threads=128) as bx:
            tx = T.get_thread_binding()
            T.rng_init(1, tx, 0)
            A[tx] = T.rng_rand()


def _init_with_128_threads():
    @T.prim_func
    def main(A: T.Tensor((64,), T.uint32)):
        with T.Kernel(1, threads=128) as bx:
            T.rng_init(1, 0, 0)


@pytest.mark.parametrize("kernel, message, line", [
    (_serial_loop, "inside a serial", "A[k] = T.rng_rand()"),
    (_runtime_extent, "runtime extent", "A[k] = T.rng_rand()"),
    (_nested_parallel, "nested", "A[k * 4 + m] = T.rng_rand()"),
    (_init_under_if, "inside an `if`", "T.rng_init(2, 0, 0)"),
    (_draw_before_init, "before T.rng_init", "A[0] = T.rng_rand()"),
    (_thread_binding_of_128_threads, "threads=128", "T.rng_init(1, tx, 0)"),
    (_init_with_128_threads, "threads=128", "T.rng_init(1, 0, 0)"),
])
def test_refusals_quote_the_line(kernel, message, line):
    with pytest.raises(tritile.CompileError) as info:
        kernel()
    text = str(info.value)
    assert message in text and line in text, text
