"""Per-thread (SIMT) kernels: `T.get_thread_binding(d)` used as a value (an index, arithmetic
stored somewhere), `T.alloc_local` / `T.alloc_var` private to each thread, serial loops
(TileLang's examples/gemv/example_gemv.py).  tritile rewrites such a body by lockstep
vectorization (tritile/frontend/per_thread.py): each statement that uses a varying value runs in
a `T.Parallel` over the thread dims, per-thread locals are fragments with the thread dims in
front, a varying `if` masks its statements, serial loops stay outside, atomics into shared memory
become a reduction.  The interpreter and Triton's interpreter of the triton.language kernel
against torch on fresh random inputs, sm_90 PTX, GPU variants, and the CompileErrors."""
import pytest
import torch

import tritile
import tritile.ir.printer as printer
import tritile.language as T
from tritile.errors import CompileError
from tritile.ir import nodes as ir
from tritile.ir.transform import walk

BACKENDS = ["auto", "triton"]  # on CPU tensors: tritile's interpreter / Triton's interpreter


def naive_gemv(N, K, block_N, block_K):
    """C = B @ A with one thread per row of the block: the thread index picks B's row in shared
    memory, a per-thread accumulator in a serial loop; A's tile is loaded by a uniform statement."""

    @T.prim_func
    def main(A: T.Tensor((K,), T.float16), B: T.Tensor((N, K), T.float16), C: T.Tensor((N,), T.float16)):
        with T.Kernel(T.ceildiv(N, block_N), threads=block_N) as bn:
            row = T.get_thread_binding(0)
            a_tile = T.alloc_shared((block_K,), T.float16)
            b_tile = T.alloc_shared((block_N, block_K), T.float16)
            acc = T.alloc_local((1,), T.float32)
            T.clear(acc)
            for ko in T.serial(T.ceildiv(K, block_K)):
                for kk in T.serial(block_K):
                    a_tile[kk] = A[ko * block_K + kk]
                    b_tile[row, kk] = B[bn * block_N + row, ko * block_K + kk]
                T.sync_threads()
                for kk in T.serial(block_K):
                    acc[0] += T.cast(a_tile[kk], T.float32) * T.cast(b_tile[row, kk], T.float32)
                T.sync_threads()
            C[bn * block_N + row] = acc[0]

    return main


def splitk_gemv(N, K, block_N, reduce_threads, tile_K):
    """A 2-D thread grid (rows x split-K lanes): each thread a per-thread slice of K in local
    arrays, its partial sum added atomically into a shared row total that one lane per row zeroed."""
    block_K = reduce_threads * tile_K

    @T.prim_func
    def main(A: T.Tensor((K,), T.float16), B: T.Tensor((N, K), T.float16), C: T.Tensor((N,), T.float16)):
        with T.Kernel(T.ceildiv(N, block_N), threads=(block_N, reduce_threads)) as bn:
            r = T.get_thread_binding(0)
            lane = T.get_thread_binding(1)
            a_part = T.alloc_local((tile_K,), T.float16)
            b_part = T.alloc_local((tile_K,), T.float16)
            total = T.alloc_shared((block_N,), T.float32)
            part = T.alloc_local((1,), T.float32)
            if lane == 0:
                total[r] = 0
            T.clear(part)
            for ko in T.serial(T.ceildiv(K, block_K)):
                for k in T.serial(tile_K):
                    a_part[k] = A[ko * block_K + lane * tile_K + k]
                    b_part[k] = B[bn * block_N + r, ko * block_K + lane * tile_K + k]
                for k in T.serial(tile_K):
                    part[0] += a_part[k].astype(T.float32) * b_part[k].astype("float32")  # TVM's astype
            T.atomic_add(total[r], part[0])
            C[bn * block_N + r] = total[r]

    return main


def local_array(threads=128, width=4):
    """A per-thread local array filled in a loop then reduced into a T.alloc_var; a name bound to
    a memory read (stored per thread); a varying if/else on it; `if tx == 5` (one thread); a
    varying if on the parity; uniform statements (a store, run once) and an atomic every thread
    does; T.sync_threads()."""

    @T.prim_func
    def main(x: T.Tensor((threads * width,), T.float32), y: T.Tensor((threads,), T.float32),
             z: T.Tensor((threads,), T.float32), counts: T.Tensor((2,), T.int32)):
        with T.Kernel(1, threads=threads) as bx:
            tx = T.get_thread_binding()
            vals = T.alloc_local((width,), T.float32)
            total = T.alloc_var(T.float32)
            base = tx * width
            for i in T.serial(width):
                vals[i] = (x[base + i] * (i + 1)).astype(T.float32)
            total = 0.0
            for i in T.serial(width):
                total += vals[i]
            first = x[base]
            if first > 0:
                y[tx] = total
            else:
                y[tx] = -total
            if tx == 5:
                z[0] = 42.0
            if tx % 2 == 1:
                z[tx] = first
            counts[1] = 7
            T.sync_threads()
            T.atomic_add(counts[0], 1)

    return main


def local_array_reference(x, threads=128, width=4):
    rows = x.view(threads, width)
    total = (rows * torch.arange(1, width + 1, dtype=x.dtype, device=x.device)).sum(1)
    first = rows[:, 0]
    y = torch.where(first > 0, total, -total)
    z = torch.zeros(threads, device=x.device)
    z[1::2] = first[1::2]
    z[0] = 42.0
    return y, z, torch.tensor([threads, 7], dtype=torch.int32, device=x.device)


def branch_writes_condition(threads=(32, 4)):
    """A varying condition that reads what its branches write (evaluated once, at the `if`); a
    pinned thread dim given by a runtime scalar (`if ty == pick`, range-checked); a 2-D block whose
    kernel names only threadIdx.x and threadIdx.y."""
    X, Y = threads

    @T.prim_func
    def main(v: T.Tensor((Y, X), T.float32), w: T.Tensor((X,), T.float32), pick: T.int32):
        with T.Kernel(1, threads=threads) as bx:
            tx = T.get_thread_binding(0)
            ty = T.get_thread_binding(1)
            if v[ty, tx] > 0:
                v[ty, tx] = -v[ty, tx]
            else:
                v[ty, tx] = v[ty, tx] * 2 + 100
            if ty == pick:
                w[tx] = v[ty, tx]

    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_naive_gemv(backend):
    N, K = 256, 192
    kernel = tritile.compile(naive_gemv(N, K, block_N=128, block_K=64), backend=backend)
    a, b = torch.randn(K).half(), torch.randn(N, K).half()
    c = torch.zeros(N, dtype=torch.float16)
    kernel(a, b, c)
    torch.testing.assert_close(c.float(), b.float() @ a.float(), rtol=1e-2, atol=1e-2)


def test_naive_gemv_is_tile_code():
    """The per-thread accumulator is a fragment of one element per thread, updated by a
    T.Parallel of the block's 128 threads inside the serial loops; the barriers are gone."""
    func = naive_gemv(256, 192, block_N=128, block_K=64)
    kinds = [type(n).__name__ for n in walk(func.kernel.body)]
    assert "ThreadBarrier" not in kinds
    allocs = {n.buffer.name: n.buffer for n in walk(func.kernel.body) if isinstance(n, ir.Alloc)}
    acc = next(b for name, b in allocs.items() if name.startswith("acc"))
    assert acc.scope == "fragment" and acc.shape == (128,)
    assert all(n.extents == (128,) for n in walk(func.kernel.body) if isinstance(n, ir.Parallel))
    assert "T.Parallel(128)" in printer.format_func(func)


@pytest.mark.parametrize("backend", BACKENDS)
def test_splitk_gemv_2d_threads_and_shared_atomic(backend):
    N, K = 48, 320  # N not a multiple of block_N, K of block_K: out-of-range reads give 0
    kernel = tritile.compile(splitk_gemv(N, K, block_N=16, reduce_threads=8, tile_K=4), backend=backend)
    a, b = torch.randn(K).half(), torch.randn(N, K).half()
    c = torch.zeros(N, dtype=torch.float16)
    kernel(a, b, c)
    torch.testing.assert_close(c.float(), b.float() @ a.float(), rtol=1e-2, atol=1e-2)


def test_splitk_shared_atomic_is_a_reduction():
    """The 8 split-K lanes' atomics into total[r] are one T.reduce_sum over the lane dim, then one
    store per row; the per-thread arrays are fragments (rows, lanes, tile_K)."""
    func = splitk_gemv(48, 320, block_N=16, reduce_threads=8, tile_K=4)
    body = func.kernel.body
    reduces = [n for n in walk(body) if isinstance(n, ir.Reduce)]
    assert len(reduces) == 1 and reduces[0].kind == "sum" and reduces[0].src.buffer.shape == (16, 8)
    assert not any(isinstance(n, ir.AtomicAdd) for n in walk(body))
    shapes = {n.buffer.shape for n in walk(body) if isinstance(n, ir.Alloc) and n.buffer.scope == "fragment"}
    assert (16, 8, 4) in shapes and (16, 8) in shapes


@pytest.mark.parametrize("backend", BACKENDS)
def test_local_array_branches_and_uniform_statements(backend):
    x = torch.randn(128 * 4)
    y, z, counts = torch.zeros(128), torch.zeros(128), torch.zeros(2, dtype=torch.int32)
    tritile.compile(local_array(), backend=backend)(x, y, z, counts)
    want_y, want_z, want_counts = local_array_reference(x)
    torch.testing.assert_close(y, want_y)
    torch.testing.assert_close(z, want_z)
    assert torch.equal(counts, want_counts)  # every thread's atomic, the uniform store once


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pick", [0, 2, 7, -1])
def test_condition_read_by_branch_and_pinned_dim(backend, pick):
    v = torch.randn(4, 32)
    w = torch.full((32,), -5.0)
    want_v = torch.where(v > 0, -v, v * 2 + 100)
    want_w = want_v[pick].clone() if 0 <= pick < 4 else w.clone()
    tritile.compile(branch_writes_condition(), backend=backend)(v, w, pick)
    torch.testing.assert_close(v, want_v)
    torch.testing.assert_close(w, want_w)


def mask_outside_ranges(rows, cols, threads=64, block=256):
    """TVM's launch-thread form `tx = T.thread_binding(0, threads, thread="threadIdx.x")`: each row's
    entries outside [lo, hi) set to -inf, a block of columns a step of a pipelined loop, each thread
    every `threads`-th column of it."""

    @T.prim_func
    def main(X: T.Tensor((rows, cols), T.float32), Lo: T.Tensor((rows,), T.int32), Hi: T.Tensor((rows,), T.int32)):
        with T.Kernel(rows, threads=threads) as bx:
            tx = T.thread_binding(0, threads, thread="threadIdx.x")
            lo = Lo[bx]
            hi = Hi[bx]
            for n in T.Pipelined(T.ceildiv(cols, block)):
                for k in T.serial(block // threads):
                    col = n * block + k * threads + tx
                    if col < lo or col >= hi:
                        X[bx, col] = -T.infinity(T.float32)

    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_thread_binding_launch_form(backend):
    x = torch.randn(6, 512)
    lo, hi = torch.randint(0, 256, (6,), dtype=torch.int32), torch.randint(256, 513, (6,), dtype=torch.int32)
    cols = torch.arange(512)
    want = torch.where((cols >= lo[:, None].long()) & (cols < hi[:, None].long()), x, torch.tensor(float("-inf")))
    tritile.compile(mask_outside_ranges(6, 512), backend=backend)(x, lo, hi)
    torch.testing.assert_close(x, want)


def test_thread_binding_must_span_its_dimension():
    with pytest.raises(CompileError, match=r"T.thread_binding\(0, 32, thread='threadIdx.x'\) in a kernel of "
                                           r"threads=64: it must span the dimension \(0 to 64\)"):
        @T.prim_func
        def main(X: T.Tensor((64,), T.float32)):
            with T.Kernel(1, threads=64) as bx:
                tx = T.thread_binding(0, 32, thread="threadIdx.x")
                X[tx] = 1.0


def suffix_sums_of_the_first_threads(threads=128, radix=64):
    """A Hillis-Steele suffix sum run by the first `radix` threads only, ordered by a named barrier
    of exactly those threads (deepseek_v32/topk_selector.py's histogram cumsum)."""

    @T.prim_func
    def main(X: T.Tensor((radix,), T.int32), Y: T.Tensor((radix,), T.int32)):
        with T.Kernel(1, threads=threads) as bx:
            tx = T.get_thread_binding()
            hist = T.alloc_shared((threads,), T.int32)
            val = T.alloc_var(T.int32)
            if tx < radix:
                hist[tx] = X[tx]
            else:
                hist[tx] = 0
            T.sync_threads()
            if tx < radix:
                for i in T.serial(6):
                    offset = 1 << i
                    T.sync_threads(3, radix)
                    if tx < radix - offset:
                        val = hist[tx] + hist[tx + offset]
                    T.sync_threads(3, radix)
                    if tx < radix - offset:
                        hist[tx] = val
                T.sync_threads(3, radix)
                Y[tx] = hist[tx]

    return main


def doubled_by_the_first_threads(threads=128, radix=64):
    """A named barrier of the `radix` threads that store and then read their shared elements."""

    @T.prim_func
    def main(X: T.Tensor((radix,), T.int32), Y: T.Tensor((radix,), T.int32)):
        with T.Kernel(1, threads=threads) as bx:
            tx = T.get_thread_binding()
            stage = T.alloc_shared((threads,), T.int32)
            if tx < radix:
                stage[tx] = X[tx] * 2
                T.sync_threads(1, radix)
                Y[tx] = stage[tx] + 1

    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_named_barrier_of_the_threads_that_reach_it(backend):
    x = torch.randint(-50, 50, (64,), dtype=torch.int32)
    y = torch.zeros(64, dtype=torch.int32)
    tritile.compile(doubled_by_the_first_threads(), backend=backend)(x, y)
    assert torch.equal(y, x * 2 + 1)


def test_named_barriers_of_a_shared_memory_scan():
    """The scan reads its neighbours' shared elements (`hist[tx + offset]`): tritile's interpreter
    runs it; the GPU backends have no shared-memory gather in T.Parallel and say so."""
    x = torch.randint(-50, 50, (64,), dtype=torch.int32)
    y = torch.zeros(64, dtype=torch.int32)
    tritile.compile(suffix_sums_of_the_first_threads())(x, y)
    assert torch.equal(y, x.flip(0).cumsum(0).flip(0).int())
    with pytest.raises(CompileError, match="no register gather"):
        tritile.compile(suffix_sums_of_the_first_threads(), target="cuda:90", backend="triton").get_source("ptx")


def test_named_barrier_must_count_the_threads_that_reach_it():
    with pytest.raises(CompileError, match=r"T.sync_threads\(barrier_id, 64\): the threads that reach it must be "
                                           r"exactly 64.*here: 32\)"):
        @T.prim_func
        def main(X: T.Tensor((128,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                tx = T.get_thread_binding()
                if tx < 32:
                    T.sync_threads(1, 64)
                    X[tx] = 1.0


def test_per_thread_kernels_compile_for_hopper():
    for func in (naive_gemv(256, 192, 128, 64), splitk_gemv(48, 320, 16, 8, 4), local_array(),
                 branch_writes_condition(), mask_outside_ranges(6, 512), doubled_by_the_first_threads()):
        ptx = tritile.compile(func, target="cuda:90", backend="triton").get_source("ptx")
        assert ".target sm_90" in ptx
        # auto: Gluon where it takes the program's element accesses, else the triton backend
        assert ".target sm_90" in tritile.compile(func, target="cuda:90", backend="auto").get_source("ptx")
    ptx = tritile.compile(local_array(), target="cuda:90", backend="gluon").get_source("ptx")
    assert ".target sm_90" in ptx


def test_thread_range_branches_stay_warp_groups():
    """A thread index read only in `if` conditions keeps thread_ranges.py's branches."""

    @T.prim_func
    def main(x: T.Tensor((128,), T.float32), y: T.Tensor((128,), T.float32)):
        with T.Kernel(1, threads=256) as bx:
            tx = T.get_thread_binding()
            if tx < 128:
                for i in T.Parallel(128):
                    y[i] = x[i] * 2

    assert any(isinstance(n, ir.WarpGroups) for n in walk(main.kernel.body))
    y = torch.zeros(128)
    x = torch.randn(128)
    tritile.compile(main)(x, y)
    torch.testing.assert_close(y, x * 2)


def _error(kind):
    @T.prim_func
    def main(x: T.Tensor((128,), T.float32), y: T.Tensor((128,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            tx = T.get_thread_binding()
            s = T.alloc_shared((64,), T.float32)
            if kind == "loop":
                for i in T.serial(tx):
                    y[tx] += x[i]
            elif kind == "while":
                n = T.alloc_var(T.int32)
                n = tx
                while n > 0:
                    n -= 1
            elif kind == "sync":
                if tx < 64:
                    T.sync_threads()
            elif kind == "shuffle":
                y[tx] = T.tvm_warp_shuffle(0xFFFFFFFF, x[tx], tx + 1, 32, 32)
            elif kind == "atomic":
                T.atomic_add(s[tx // 2], x[tx])
            elif kind == "parallel":
                for i in T.Parallel(4):
                    y[tx] = x[i]

    return main


@pytest.mark.parametrize("kind, line, message", [
    ("loop", "for i in T.serial(tx):", "a loop whose bounds vary by thread"),
    ("while", "while n > 0:", "a `while` loop whose condition varies by thread"),
    ("sync", "T.sync_threads()", "every thread of the block must reach the barrier"),
    ("shuffle", "T.tvm_warp_shuffle", "T.tvm_warp_shuffle in per-thread code is not supported"),
    ("atomic", "T.atomic_add(s[tx // 2], x[tx])", "each index must be uniform or one thread index plus"),
    ("parallel", "for i in T.Parallel(4):", "a T.Parallel loop in per-thread code"),
])
def test_unmappable_per_thread_code_is_a_compile_error(kind, line, message):
    with pytest.raises(CompileError) as info:
        tritile.compile(_error(kind))
    text = str(info.value)
    assert message in text and line in text and __file__.rsplit("/", 1)[-1] in text


@pytest.mark.gpu
def test_per_thread_gemv_gpu():
    N, K = 256, 192
    a, b = torch.randn(K, device="cuda").half(), torch.randn(N, K, device="cuda").half()
    want = b.float() @ a.float()
    for func in (naive_gemv(N, K, 128, 64), splitk_gemv(N, K, 16, 8, 4)):
        c = torch.zeros(N, dtype=torch.float16, device="cuda")
        tritile.compile(func)(a, b, c)
        torch.testing.assert_close(c.float(), want, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
def test_per_thread_branches_gpu():
    x = torch.randn(128 * 4, device="cuda")
    y, z = torch.zeros(128, device="cuda"), torch.zeros(128, device="cuda")
    counts = torch.zeros(2, dtype=torch.int32, device="cuda")
    tritile.compile(local_array())(x, y, z, counts)
    want_y, want_z, want_counts = local_array_reference(x)
    torch.testing.assert_close(y, want_y)
    torch.testing.assert_close(z, want_z)
    assert torch.equal(counts, want_counts)
