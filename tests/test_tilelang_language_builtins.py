"""TileLang's smaller `T` builtins in tritile, each in a kernel written as TileLang's examples
write it, against torch:

* expressions: `T.clamp` (the fp8 quantisation of examples/cast), `T.Select`, `T.isnan` /
  `T.isinf` / `T.isfinite`, `T.shift_left` / `T.shift_right`, `T.bitwise_*`;
* loops and allocations: `T.vectorized`, `T.alloc_buffer(scope=...)`;
* `T.any_of` / `T.all_of` of a block mask (TileLang's block-sparse GEMM), `T.align_up`,
  `T.annotate_safe_value` (what out-of-bounds element reads of a tensor give);
* atomics: `T.atomic_max` / `T.atomic_min` (element and tile forms), `T.atomic_addx2` / `x4`;
* reducers: `T.alloc_reducer` updated in `T.Parallel`, `T.reducer_init` / `T.reducer_update`,
  `T.finalize_reducer`;
* statements without effect on values: `T.assume`, `T.device_assert` (the interpreter raises
  on a false one), `T.annotate_pass_configs` / `T.annotate_compile_flags`;

On the `device` fixture's tensors (CPU: the tile-IR interpreter, or Triton's interpreter under
TRITILE_BACKEND=triton; CUDA: the GPU kernel), and compiled for sm_90 by both backends on CPU.
"""
import pytest
import torch

import tritile
import tritile.language as T
from tritile.ir.printer import format_func


def _compiles_for_hopper(func, out_idx, backends=("gluon", "triton")):
    """The backends generate PTX for sm_90 from `func` (no GPU needed)."""
    for backend in backends:
        kernel = tritile.compile(func, out_idx=out_idx, target="cuda:90", backend=backend)
        assert ".target sm_90" in kernel.get_source("ptx")


# ------------------------------------------------------------------------------ expressions


def per_token_cast_to_fp8(M, N, blk_m):
    """examples/cast/example_per_token_cast_to_fp8.py at small sizes: T.clamp to fp8's range."""
    fp8_min, fp8_max = -448.0, 448.0

    @T.prim_func
    def main(X: T.Tensor((M, N), T.float32), Y: T.Tensor((M, N), T.float8_e4m3fn), S: T.Tensor((M,), T.float32)):
        with T.Kernel(T.ceildiv(M, blk_m), threads=128) as bx:
            y_local = T.alloc_fragment((blk_m, N), T.float32)
            y_amax = T.alloc_fragment((blk_m,), T.float32)
            y_s = T.alloc_fragment((blk_m,), T.float32)
            y_q = T.alloc_fragment((blk_m, N), T.float8_e4m3fn)
            T.copy(X[bx * blk_m, 0], y_local)
            T.reduce_absmax(y_local, y_amax, dim=1)
            for i in T.Parallel(blk_m):
                y_amax[i] = T.max(y_amax[i], 1e-4)
                y_s[i] = y_amax[i] / fp8_max
            for i, j in T.Parallel(blk_m, N):
                # twice the scale's range: the clamp is what keeps the values inside fp8's
                y_q[i, j] = T.clamp(y_local[i, j] / y_s[i] * 2.0, fp8_min, fp8_max)
            T.copy(y_q, Y[bx * blk_m, 0])
            T.copy(y_s, S[bx * blk_m])

    return main


def test_clamp_per_token_cast_to_fp8(device):
    M, N = 32, 64
    x = torch.randn(M, N, device=device)
    y, s = tritile.compile(per_token_cast_to_fp8(M, N, 16), out_idx=[1, 2])(x)
    ref_s = x.abs().amax(dim=1).clamp(min=1e-4) / 448.0
    ref_y = (x / ref_s[:, None] * 2.0).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    torch.testing.assert_close(s, ref_s)
    torch.testing.assert_close(y.float(), ref_y.float(), rtol=0.07, atol=0.0)
    assert T.clamp(5, 0, 3) == 3 and T.clamp(-1.5, min_val=0.0, max_val=1.0) == 0.0


def predicates_and_bits(N):
    @T.prim_func
    def main(A: T.Tensor((N,), T.float16), B: T.Tensor((N,), T.int32),
             F: T.Tensor((N,), T.float32), I: T.Tensor((N,), T.int32)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(N):
                x = A[i]
                F[i] = T.Select(T.isnan(x), -1.0, T.Select(T.isinf(x), -2.0, T.Select(T.isfinite(x), x * 2.0, -3.0)))
                b = B[i]
                I[i] = (T.shift_left(b, 3) + T.shift_right(b, 2) + T.bitwise_and(b, 0xF0)
                        + T.bitwise_or(b, 5) + T.bitwise_xor(b, 0x55) + T.bitwise_not(b))

    return main


def test_select_isnan_isinf_isfinite_shifts_bitwise(device):
    N = 64
    a = torch.randn(N, device=device).half()
    a[3], a[10], a[20] = float("nan"), float("inf"), -float("inf")
    b = torch.randint(-1000, 1000, (N,), dtype=torch.int32, device=device)
    f, i = tritile.compile(predicates_and_bits(N), out_idx=[2, 3])(a, b)
    ref_f = torch.where(a.isnan(), -1.0, torch.where(a.isinf(), -2.0, a.float() * 2.0))
    torch.testing.assert_close(f, ref_f)
    ref_i = (b << 3) + (b >> 2) + (b & 0xF0) + (b | 5) + (b ^ 0x55) + ~b
    torch.testing.assert_close(i, ref_i)
    assert T.Select(False, 1, 2) == 2 and T.isnan(float("nan")) and T.shift_left(1, 4) == 16


def test_predicates_of_integers_fold():
    @T.prim_func
    def main(B: T.Tensor((8,), T.int32), F: T.Tensor((8,), T.int32)):
        with T.Kernel(1, threads=32) as bx:
            for i in T.Parallel(8):
                F[i] = T.if_then_else(T.isfinite(B[i]) and not T.isnan(B[i]), 1, 0)

    b = torch.arange(8, dtype=torch.int32)
    torch.testing.assert_close(tritile.compile(main, out_idx=[1])(b), torch.ones(8, dtype=torch.int32))


def test_expressions_compile_for_hopper():
    _compiles_for_hopper(per_token_cast_to_fp8(32, 64, 16), [1, 2])
    _compiles_for_hopper(predicates_and_bits(64), [2, 3])


# ------------------------------------------------------------------------------ hints and asserts


def stepped_serial(N):
    """testing/python/language/test_tilelang_language_frontend_v2.py's stepped loops, with T.assume
    and T.device_assert, plus a lane-dependent assert inside T.Parallel under an `if`."""

    @T.prim_func
    def main(X: T.Tensor((N,), T.float32), A: T.Tensor((N,), T.int32)):
        with T.Kernel(1, threads=32) as _:
            for i in range(0, N, 2):
                T.assume(i >= 0 and i < N)
                T.device_assert(0 <= i < N and i % 2 == 0, "i out of range")
                A[i] = 1
            for i in range(N - 1, 0, -2):
                T.device_assert(1 <= i < N and i % 2 == 1, "i out of range")
                A[i] = 2
            for j in T.Parallel(N):
                if X[j] >= 0.0:
                    T.device_assert(X[j] < 10.0, "X too large")
                    A[j] = A[j] + 10

    return main


def test_assume_and_device_assert(device):
    N = 16
    x = torch.randn(N, device=device)
    got = tritile.compile(stepped_serial(N), out_idx=[1])(x)
    ref = torch.tensor([1, 2] * (N // 2), dtype=torch.int32, device=device) + 10 * (x >= 0).int()
    torch.testing.assert_close(got, ref)


def test_false_device_assert_raises_with_its_message():
    x = torch.randn(16)
    x[5] = 50.0
    kernel = tritile.compile(stepped_serial(16), out_idx=[1], backend="gluon")  # the tile-IR interpreter
    with pytest.raises(tritile.errors.DeviceAssertError, match=r"lane \(5,\): X too large") as err:
        kernel(x)
    assert "test_tilelang_language_builtins.py" in str(err.value)
    x[5] = -50.0  # a lane the `if` leaves out may break it
    kernel(x)


def test_device_assert_is_triton_device_assert():
    func = stepped_serial(16)
    gluon = tritile.compile(func, out_idx=[1], target="cuda:90", backend="gluon").get_source("gluon")
    triton = tritile.compile(func, out_idx=[1], target="cuda:90", backend="triton").get_source("triton")
    assert gluon.count("gl.device_assert(") == 3 and triton.count("tl.device_assert(") == 3
    _compiles_for_hopper(func, [1])


def test_constant_false_device_assert_is_a_compile_error():
    with pytest.raises(tritile.CompileError, match="always fails: never"):
        @T.prim_func
        def main(A: T.Tensor((4,), T.int32)):
            with T.Kernel(1, threads=32) as _:
                T.device_assert(1 > 2, "never")


def test_annotate_pass_configs_and_compile_flags():
    from tritile.transform import PassConfigKey

    @T.prim_func
    def main(A: T.Tensor((64,), T.float32), B: T.Tensor((64,), T.float32)):
        T.annotate_pass_configs({PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True})
        T.annotate_compile_flags(["--use_fast_math"])
        with T.Kernel(1, threads=128) as _:
            for i in T.Parallel(64):
                B[i] = A[i] + 1.0

    kernel = tritile.compile(main, out_idx=[1])
    assert kernel.pass_configs == {"tl.disable_warp_specialized": True}
    assert kernel.compile_flags == ["--use_fast_math"]
    a = torch.randn(64)
    torch.testing.assert_close(kernel(a), a + 1.0)
    caller = tritile.compile(main, out_idx=[1], pass_configs={"tl.disable_warp_specialized": False})
    assert caller.pass_configs == {"tl.disable_warp_specialized": False}  # the caller's win


def last_arrival_sum(parts, N, block_N):
    """Each of `parts` programs per column block writes its rows' partial sum to Workspace, then
    counts itself in; the last to arrive sums the parts (in order) into Out and resets the count:
    `T.sync_threads` orders every thread's partial before the counting atomic."""

    @T.prim_func
    def main(X: T.Tensor((parts, 32, N), T.float32), Workspace: T.Tensor((parts, N), T.float32),
             Count: T.Tensor((N // block_N,), T.int32), Out: T.Tensor((N,), T.float32)):
        with T.Kernel(N // block_N, parts, threads=128) as (bx, part):
            rows = T.alloc_fragment((32, block_N), T.float32)
            partial = T.alloc_fragment((block_N,), T.float32)
            T.copy(X[part, 0:32, bx * block_N:(bx + 1) * block_N], rows)
            T.reduce_sum(rows, partial, dim=0)
            T.copy(partial, Workspace[part, bx * block_N])
            T.sync_threads()
            arrived = T.atomic_add(Count[bx], 1, memory_order="acq_rel", return_prev=True)
            if arrived == parts - 1:
                total = T.alloc_fragment((block_N,), T.float32)
                T.clear(total)
                for p in T.serial(parts):
                    T.copy(Workspace[p, bx * block_N], partial)
                    for j in T.Parallel(block_N):
                        total[j] += partial[j]
                T.copy(total, Out[bx * block_N])
                Count[bx] = 0

    return main


def test_sync_threads_orders_a_last_arrival_sum(device):
    parts, N = 3, 128
    func = last_arrival_sum(parts, N, 32)
    kernel = tritile.compile(func)
    x = torch.randn(parts, 32, N, device=device)
    count = torch.zeros(N // 32, dtype=torch.int32, device=device)
    for _ in range(2):  # the count is back at zero for the next call
        out, workspace = torch.empty(N, device=device), torch.empty(parts, N, device=device)
        kernel(x, workspace, count, out)
        torch.testing.assert_close(out, x.sum(dim=(0, 1)), rtol=1e-4, atol=1e-4)
        assert int(count.abs().sum()) == 0


def test_sync_threads_is_a_cta_barrier_before_the_atomic():
    func = last_arrival_sum(2, 64, 32)
    assert "gl.thread_barrier()" in tritile.compile(func, target="cuda:90", backend="gluon").get_source("gluon")
    assert "tl.debug_barrier()" in tritile.compile(func, target="cuda:90", backend="triton").get_source("triton")
    for backend in ("gluon", "triton"):
        ptx = tritile.compile(func, target="cuda:90", backend=backend).get_source("ptx")
        barrier, atomic = ptx.rfind("bar.sync", 0, ptx.find("atom.global")), ptx.find("atom.global")
        assert 0 <= barrier < atomic, backend


def test_sync_threads_inside_parallel_or_named_is_a_compile_error():
    with pytest.raises(tritile.CompileError, match="inside T.Parallel"):
        @T.prim_func
        def inside(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1, threads=128) as _:
                for i in T.Parallel(64):
                    T.sync_threads()
                    A[i] = 1.0
    with pytest.raises(tritile.CompileError, match="named barrier"):
        @T.prim_func
        def named(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1, threads=128) as _:
                T.sync_threads(1, 64)


# ------------------------------------------------------------------------------ loops and allocations


def scaled_scores(M, N, scale=0.5):
    """examples/aws/flash_attention.py's `for i in T.Parallel(M): for j in T.vectorized(N)`, buffers
    allocated with T.alloc_buffer by scope."""

    @T.prim_func
    def main(S: T.Tensor((M, N), T.float32), Out: T.Tensor((M, N), T.float32)):
        with T.Kernel(1, threads=128) as _:
            S_reg = T.alloc_buffer((M, N), T.float32, scope="local.fragment")
            S_shared = T.alloc_buffer((M, N), T.float32, scope="shared.dyn")
            row_max = T.alloc_buffer((M,), T.float32, scope="local.fragment")
            T.copy(S[0, 0], S_shared)
            T.copy(S_shared, S_reg)
            T.reduce_max(S_reg, row_max, dim=1)
            for i in T.Parallel(M):
                for j in T.vectorized(N):
                    S_reg[i, j] = S_reg[i, j] * scale + (-row_max[i] * scale)
            T.copy(S_reg, Out[0, 0])

    return main


def test_vectorized_inside_parallel_and_alloc_buffer(device):
    M, N = 16, 32
    s = torch.randn(M, N, device=device)
    kernel = tritile.compile(scaled_scores(M, N), out_idx=[1])
    torch.testing.assert_close(kernel(s), (s - s.amax(dim=1, keepdim=True)) * 0.5)
    assert "T.Parallel(16, 32)" in kernel.get_source("tile")  # one loop nest, as TileLang vectorizes it


def gemv_rows(N, K, block_K, micro_k):
    """examples/dequantize_gemm/example_dequant_gemv_fp16xint4.py's register staging, one row per
    block: `for v in T.vectorized(micro_k)` loads into a T.alloc_buffer(scope="local") array, a
    "local.var" accumulates."""

    @T.prim_func
    def main(A: T.Tensor((N, K), T.float16), X: T.Tensor((K,), T.float16), Y: T.Tensor((N,), T.float32)):
        with T.Kernel(N, threads=32) as by:
            a_local = T.alloc_buffer((micro_k,), T.float16, scope="local")
            x_local = T.alloc_buffer((micro_k,), T.float16, scope="local")
            acc = T.alloc_buffer((1,), T.float32, scope="local.var")
            acc = 0.0
            for ko in T.serial(K // micro_k):
                for v in T.vectorized(micro_k):
                    a_local[v] = A[by, ko * micro_k + v]
                for v in T.vectorized(0, micro_k):
                    x_local[v] = X[ko * micro_k + v]
                for v in T.serial(micro_k):
                    acc += T.cast(a_local[v], T.float32) * T.cast(x_local[v], T.float32)
            Y[by] = acc

    return main


def test_vectorized_serial_loops_and_local_alloc_buffer(device):
    N, K = 8, 32
    a = torch.randn(N, K, device=device).half()
    x = torch.randn(K, device=device).half()
    y = tritile.compile(gemv_rows(N, K, 32, 4), out_idx=[2])(a, x)
    torch.testing.assert_close(y, a.float() @ x.float(), rtol=1e-4, atol=1e-4)


def test_alloc_buffer_scopes_are_checked():
    with pytest.raises(tritile.CompileError, match="T.alloc_buffer: scope must be one of"):
        @T.prim_func
        def main(A: T.Tensor((4,), T.int32)):
            with T.Kernel(1, threads=32) as _:
                T.alloc_buffer((4,), T.int32, scope="local.tmem")
    with pytest.raises(tritile.CompileError, match=r"T.alloc_buffer\(data=...\)"):
        @T.prim_func
        def main2(A: T.Tensor((4,), T.int32)):
            with T.Kernel(1, threads=32) as _:
                T.alloc_buffer((4,), T.int32, data=A, scope="shared")


def test_loops_and_allocations_compile_for_hopper():
    _compiles_for_hopper(scaled_scores(16, 32), [1])
    _compiles_for_hopper(gemv_rows(8, 32, 32, 4), [2], backends=("triton",))  # Gluon: no T.alloc_local arrays yet


# ------------------------------------------------------------------------------ atomics


def atomic_max_min_elements(K, M, N, block_M, block_N):
    """testing/python/language/test_tilelang_language_atomic.py's element form: K slices folded
    into C (max) and D (min) by lanes of every block along K."""

    @T.prim_func
    def main(A: T.Tensor((K, M, N), T.float32), C: T.Tensor((M, N), T.float32), D: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(M, block_M), T.ceildiv(N, block_N), K, threads=32) as (bx, by, bk):
            for i, j in T.Parallel(block_M, block_N):
                idx_i = bx * block_M + i
                idx_j = by * block_N + j
                if idx_i < M and idx_j < N:
                    val = A[bk, idx_i, idx_j]
                    T.atomic_max(C[idx_i, idx_j], val, memory_order="relaxed")
                    T.atomic_min(D[idx_i, idx_j], val, memory_order="relaxed")

    return main


def atomic_max_min_tiles(K, M, N, block_M, block_N, kind):
    """The tile form: a shared tile folded into a global region (a head address)."""
    op = T.atomic_max if kind == "max" else T.atomic_min

    @T.prim_func
    def main(A: T.Tensor((K, M, N), T.float32), B: T.Tensor((M, N), T.float32)):
        with T.Kernel(M // block_M, N // block_N, K, threads=128) as (bx, by, bk):
            A_shared = T.alloc_shared((block_M, block_N), T.float32)
            T.copy(A[bk, bx * block_M:(bx + 1) * block_M, by * block_N:(by + 1) * block_N], A_shared)
            op(B[bx * block_M, by * block_N], A_shared)

    return main


def test_atomic_max_min_elements(device):
    K, M, N = 4, 24, 40
    a = torch.randn(K, M, N, device=device)
    c = torch.zeros(M, N, device=device)
    d = torch.full((M, N), float("inf"), device=device)
    tritile.compile(atomic_max_min_elements(K, M, N, 16, 16))(a, c, d)
    torch.testing.assert_close(c, torch.maximum(a.amax(0), torch.zeros(M, N, device=device)))
    torch.testing.assert_close(d, a.amin(0))


@pytest.mark.parametrize("kind", ["max", "min"])
def test_atomic_max_min_tiles(kind, device):
    K, M, N = 3, 64, 64
    a = torch.randn(K, M, N, device=device)
    b = torch.randn(M, N, device=device)
    ref = torch.maximum(b, a.amax(0)) if kind == "max" else torch.minimum(b, a.amin(0))
    tritile.compile(atomic_max_min_tiles(K, M, N, 32, 32, kind))(a, b)
    torch.testing.assert_close(b, ref)


def atomic_addx(M, N, block_M, block_N, lanes, dtype):
    """test_tilelang_language_atomic.py's atomic_addx2 / atomic_addx4 programs."""
    op = T.atomic_addx2 if lanes == 2 else T.atomic_addx4

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, block_M), T.ceildiv(N, block_N), threads=32) as (bx, by):
            for i, j in T.Parallel(block_M, block_N // lanes):
                idx_i = bx * block_M + i
                idx_j = by * block_N + j * lanes
                op(B[idx_i, idx_j], A[idx_i, idx_j])

    return main


def atomic_addx4_rows(N, M):
    """The sliced form `T.atomic_addx4(dst[idx[t], 0:4], val[t, 0:4])`, rows scattered by an index."""

    @T.prim_func
    def main(idx: T.Tensor((N,), T.int32), val: T.Tensor((N, 4), T.float32), dst: T.Tensor((M, 4), T.float32)):
        with T.Kernel(N, threads=32) as t:
            T.atomic_addx4(dst[idx[t], 0:4], val[t, 0:4])

    return main


@pytest.mark.parametrize("lanes, dtype", [(2, T.float16), (4, T.float32)])
def test_atomic_addx2_addx4(lanes, dtype, device):
    M, N = 32, 64
    a = torch.randn(M, N, device=device).to(getattr(torch, dtype))
    b = torch.randn(M, N, device=device).to(getattr(torch, dtype))
    ref = b + a
    tritile.compile(atomic_addx(M, N, 16, 32, lanes, dtype))(a, b)
    torch.testing.assert_close(b, ref)


def test_atomic_addx4_sliced_rows(device):
    N, M = 16, 5
    idx = torch.randint(0, M, (N,), dtype=torch.int32, device=device)
    val = torch.randn(N, 4, device=device)
    dst = torch.randn(M, 4, device=device)
    ref = dst.index_add(0, idx.long(), val)
    tritile.compile(atomic_addx4_rows(N, M))(idx, val, dst)
    torch.testing.assert_close(dst, ref)


def test_atomic_return_prev_is_a_compile_error():
    with pytest.raises(tritile.CompileError, match=r"T.atomic_addx2\(return_prev=True\) is not supported"):
        @T.prim_func
        def main(A: T.Tensor((4,), T.float16), B: T.Tensor((4,), T.float16)):
            with T.Kernel(1, threads=32) as _:
                T.atomic_addx2(B[0:2], A[0:2], return_prev=True)


def atomic_add_ordered(M, N, block_M, memory_order):
    """Rows of A summed into B by atomics in both forms (per lane, and a fragment tile), with
    `memory_order` given to each."""

    @T.prim_func
    def main(A: T.Tensor((M, N), T.float32), B: T.Tensor((N,), T.float32), C: T.Tensor((N,), T.float32)):
        with T.Kernel(M // block_M, threads=32) as bx:
            acc = T.alloc_fragment((N,), T.float32)
            T.clear(acc)
            for i in T.serial(block_M):
                for j in T.Parallel(N):
                    T.atomic_add(B[j], A[bx * block_M + i, j], memory_order=memory_order)
                    acc[j] += A[bx * block_M + i, j]
            T.atomic_add(C[0:N], acc, memory_order=memory_order)

    return main


@pytest.mark.parametrize("memory_order, sem", [(None, "relaxed"), ("relaxed", "relaxed"), ("consume", "acquire"),
                                               ("release", "release"), ("seq_cst", "acq_rel")])
def test_atomic_memory_order_is_tritons_sem(memory_order, sem, device):
    # TileLang's atomics are relaxed unless told (CUDA's atomicAdd): Triton's default, acq_rel,
    # made every dQ atomic of gqa_bwd a fenced one (half that kernel's time on the H100)
    M, N = 64, 32
    func = atomic_add_ordered(M, N, 16, memory_order)
    order_printed = "" if sem == "relaxed" else f", memory_order={sem!r})"
    assert order_printed in format_func(func)
    for backend in ("gluon", "triton"):
        kernel = tritile.compile(func, target="cuda:90", backend=backend)
        source = kernel.get_source(backend)
        assert source.count(f"sem={sem!r}") == 2 and "sem='acq_rel'" not in source.replace(f"sem={sem!r}", "")
        if sem == "relaxed":
            assert "atom.global.gpu.relaxed.add" in kernel.get_source("ptx")
    a = torch.randn(M, N, device=device)
    b, c = torch.randn(N, device=device), torch.randn(N, device=device)
    ref_b, ref_c = b + a.sum(0), c + a.sum(0)
    tritile.compile(func)(a, b, c)
    torch.testing.assert_close(b, ref_b, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(c, ref_c, rtol=1e-5, atol=1e-4)


def test_atomic_memory_order_unknown_is_a_compile_error():
    with pytest.raises(tritile.CompileError, match=r"T.atomic_add does not support memory_order='weak'; expected"):
        atomic_add_ordered(64, 32, 16, "weak")


def test_atomics_compile_for_hopper():
    _compiles_for_hopper(atomic_max_min_elements(4, 24, 40, 16, 16), [])
    _compiles_for_hopper(atomic_max_min_tiles(3, 64, 64, 32, 32, "min"), [])
    _compiles_for_hopper(atomic_addx(32, 64, 16, 32, 4, T.float32), [])
    _compiles_for_hopper(atomic_addx4_rows(16, 5), [])


# ------------------------------------------------------------------------------ reducers


def finalize_reducer_kernel(block_M, block_N, dtype, op):
    """test_tilelang_language_reduce.py's finalize_reducer program (v1 syntax)."""

    @T.prim_func
    def kernel(A: T.Tensor((block_M, block_N), dtype), B: T.Tensor((block_M,), dtype)):
        with T.Kernel(1, threads=256):
            o_reducer = T.alloc_reducer(block_M, dtype, op=op, replication="all")
            T.reducer_init(o_reducer)
            A_smem = T.alloc_shared((block_M, block_N), dtype)
            T.copy(A, A_smem)
            A_frag = T.alloc_fragment((block_M, block_N), dtype)
            T.copy(A_smem, A_frag)
            for i, j in T.Parallel(block_M, block_N):
                if op == "sum":
                    o_reducer[i] += A_frag[i, j]
                elif op == "max":
                    o_reducer[i] = T.max(o_reducer[i], A_frag[i, j])
                else:
                    o_reducer[i] = T.min(o_reducer[i], A_frag[i, j])
            T.finalize_reducer(o_reducer, batch=4)
            T.copy(o_reducer, B)

    return kernel


@pytest.mark.parametrize("op, dtype", [("sum", T.float32), ("max", T.float16), ("min", T.float32)])
def test_finalize_reducer(op, dtype, device):
    a = torch.randn(32, 64, device=device).to(getattr(torch, dtype))
    b = tritile.compile(finalize_reducer_kernel(32, 64, dtype, op), out_idx=[1])(a)
    ref = {"sum": a.float().sum(1), "max": a.float().amax(1), "min": a.float().amin(1)}[op]
    torch.testing.assert_close(b.float(), ref, rtol=1e-4, atol=1e-4)


@tritile.jit
def gemv_alloc_reducer(a, x, block_M=32, block_N=32, num_stages=2, threads=128, dtype=T.float16,
                       accum_dtype=T.float):
    """examples/gemv/example_gemv.py's gemv_alloc_reducer (eager style, pipelined K loop)."""
    M, N = T.const("M, N")
    a: T.Tensor((M, N), dtype)
    x: T.Tensor((N,), dtype)
    o = T.empty((M,), dtype)
    with T.Kernel(T.ceildiv(M, block_M), threads=threads) as i0_m:
        o_reducer = T.alloc_reducer(block_M, accum_dtype, replication="all")
        T.clear(o_reducer)
        for i0_n in T.Pipelined(T.ceildiv(N, block_N), num_stages=num_stages):
            a_smem = T.alloc_shared((block_M, block_N), dtype)
            T.copy(a[i0_m * block_M, i0_n * block_N], a_smem)
            a_frag = T.alloc_fragment((block_M, block_N), dtype)
            T.copy(a_smem, a_frag)
            x_frag = T.alloc_fragment(block_N, dtype)
            T.copy(x[i0_n * block_N], x_frag)
            for i1_m, i1_n in T.Parallel(block_M, block_N):
                o_reducer[i1_m] += a_frag[i1_m, i1_n] * x_frag[i1_n]
        T.finalize_reducer(o_reducer)
        T.copy(o_reducer, o[i0_m * block_M])
    return o


def test_gemv_alloc_reducer(device):
    a = torch.randn(64, 96, device=device).half()
    x = torch.randn(96, device=device).half()
    torch.testing.assert_close(gemv_alloc_reducer(a, x).float(), a.float() @ x.float(), rtol=1e-2, atol=1e-2)


def reducer_v2(M, K, BLOCK_K):
    """test_tilelang_language_reducer_v2.py's deferred sum across serial tiles, with an `if`."""

    @T.prim_func
    def kernel(A: T.Tensor((M, K), T.float32), B: T.Tensor((M,), T.float32)):
        with T.Kernel(1, threads=128):
            acc = T.alloc_reducer((M,), T.float32, op="sum")
            T.reducer_init(acc, 1.0)
            a_frag = T.alloc_fragment((M, BLOCK_K), T.float32)
            for k_tile in T.serial(T.ceildiv(K, BLOCK_K)):
                T.copy(A[0, k_tile * BLOCK_K], a_frag)
                for i, k in T.Parallel(M, BLOCK_K):
                    if a_frag[i, k] > 0.0:
                        T.reducer_update(acc[i], a_frag[i, k])
            result = T.alloc_fragment((M,), T.float32)
            T.finalize_reducer(acc, result)
            T.copy(result, B)

    return kernel


def test_reducer_update_and_init_across_tiles(device):
    a = torch.randn(32, 256, device=device)
    b = tritile.compile(reducer_v2(32, 256, 64), out_idx=[1])(a)
    torch.testing.assert_close(b, 1.0 + a.clamp(min=0).sum(1), rtol=1e-4, atol=1e-4)


def test_reducer_misuse_is_a_compile_error():
    with pytest.raises(tritile.CompileError, match="reducer o_reducer .op='max'. is updated only as"):
        @T.prim_func
        def main(A: T.Tensor((16, 16), T.float32), B: T.Tensor((16,), T.float32)):
            with T.Kernel(1, threads=128):
                o_reducer = T.alloc_reducer(16, T.float32, op="max")
                for i, j in T.Parallel(16, 16):
                    o_reducer[i] += A[i, j]


def test_reducers_compile_for_hopper():
    _compiles_for_hopper(finalize_reducer_kernel(32, 64, T.float32, "sum"), [1])
    _compiles_for_hopper(reducer_v2(32, 256, 64), [1])


@tritile.jit(out_idx=[-1])
def block_sparse_gemm(M, N, K, block_M, block_N, block_K, flags, source, reduce_op):
    """TileLang's test_tilelang_language_any_of.py: C = A @ B over the K blocks whose mask flags
    (`flags` of them per block) pass T.any_of / T.all_of, read from the global mask, a shared copy
    or a local array."""
    any_or_all = T.any_of if reduce_op == "any" else T.all_of

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16),
             BlockMask: T.Tensor((M // block_M, N // block_N, K // block_K, flags), "bool"),
             C: T.Tensor((M, N), T.float16)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), T.float16)
            B_shared = T.alloc_shared((block_K, block_N), T.float16)
            C_local = T.alloc_fragment((block_M, block_N), T.float32)
            mask_shared = T.alloc_shared((flags,), "bool")
            mask_local = T.alloc_local((flags,), "bool")
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                if source == "global":
                    take = any_or_all(BlockMask[by, bx, k, :])
                elif source == "shared":
                    for i in T.serial(flags):
                        mask_shared[i] = BlockMask[by, bx, k, i]
                    take = any_or_all(mask_shared)
                else:
                    for i in T.serial(flags):
                        mask_local[i] = BlockMask[by, bx, k, i]
                    take = any_or_all(mask_local[0:flags])
                if take:
                    T.copy(A[by * block_M, k * block_K], A_shared)
                    T.copy(B[k * block_K, bx * block_N], B_shared)
                    T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return main


@pytest.mark.parametrize("reduce_op", ["any", "all"])
@pytest.mark.parametrize("source", ["global", "shared", "local"])
def test_any_of_all_of_block_sparse_gemm(source, reduce_op, device, assert_close):
    M = N = 64
    K, block_K, flags = 128, 32, 2
    a = torch.randn(M, K, device=device).half()
    b = torch.randn(K, N, device=device).half()
    mask = torch.rand(2, 2, K // block_K, flags, device=device) > 0.4
    got = block_sparse_gemm(M, N, K, 32, 32, block_K, flags, source, reduce_op)(a, b, mask)
    take = mask.any(dim=-1) if reduce_op == "any" else mask.all(dim=-1)
    want = torch.zeros(M, N, device=device)
    for by in range(2):
        for bx in range(2):
            for k in range(K // block_K):
                if take[by, bx, k]:
                    want[by * 32:(by + 1) * 32, bx * 32:(bx + 1) * 32] += (
                        a[by * 32:(by + 1) * 32, k * block_K:(k + 1) * block_K].float()
                        @ b[k * block_K:(k + 1) * block_K, bx * 32:(bx + 1) * 32].float())
    assert_close(got, want.half())


def test_any_of_compiles_for_hopper():
    """Gluon writes no shared / local element outside T.Parallel yet: those masks are triton's."""
    for source in ("global", "shared", "local"):
        _compiles_for_hopper(block_sparse_gemm.fn(64, 64, 128, 32, 32, 32, 2, source, "any"), [-1],
                             backends=("gluon", "triton") if source == "global" else ("triton",))


def test_align_up():
    assert T.align_up(10, 4) == 12 and T.align_up(12, 4) == 12

    @T.prim_func
    def main(A: T.Tensor((T.dynamic("n"),), T.int32), B: T.Tensor((1,), T.int32)):
        with T.Kernel(1, threads=32) as _:
            B[0] = T.align_up(A[0], 16) + T.align_up(5, 8)

    b = torch.zeros(1, dtype=torch.int32)
    tritile.compile(main)(torch.tensor([33, 1], dtype=torch.int32), b)
    assert b.item() == 48 + 8


@tritile.jit(out_idx=[1])
def shifted_rows(M, N, block_M, shift, pad_value):
    """TileLang's test_tilelang_language_annotate_safe_value.py: B's row r is A's row r - shift,
    the rows before `shift` read out of A's bounds, which T.annotate_safe_value makes pad_value."""

    @T.prim_func
    def main(A: T.Tensor((M, N), T.float16), B: T.Tensor((M, N), T.float16)):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as by:
            A_shared = T.alloc_shared((block_M, N), T.float16)
            T.annotate_safe_value({A: pad_value})
            for i, j in T.Parallel(block_M, N):
                A_shared[i, j] = A[by * block_M + i - shift, j]
            for i, j in T.Parallel(block_M, N):
                B[by * block_M + i, j] = A_shared[i, j]

    return main


def test_annotate_safe_value(device):
    a = torch.randn(64, 32, device=device).half()
    want = torch.full_like(a, 10.0)
    want[5:] = a[:-5]
    torch.testing.assert_close(shifted_rows(64, 32, 16, 5, 10)(a), want, rtol=0, atol=0)
    _compiles_for_hopper(shifted_rows.fn(64, 32, 16, 5, 10), [1])
