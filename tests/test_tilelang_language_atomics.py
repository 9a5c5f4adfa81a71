"""TileLang's element atomics that return or read values, in kernels written as TileLang's
testing/python/language/test_tilelang_language_atomic.py writes them, against torch:

* `T.atomic_add` / `T.atomic_max` / `T.atomic_min(..., return_prev=True)`: the element's value
  before the update, per lane inside `T.Parallel` (a counter bumped by many lanes hands each
  one a different slot: the atomic runs once however often its value is used);
* `T.atomic_load` / `T.atomic_store` with TileLang's memory orders (and its ValueError for an
  order the operation does not take);
* one value into every element of a region (`T.atomic_add(A[0:M, 0:N], 1.0)`);
* an element atomic inside `T.Parallel` runs once per lane, also where its address and value
  are the same on every lane;
* 16-bit float max / min / store (a compare-and-swap loop on the GPU).

Each kernel runs on the `device` fixture's tensors (CPU: the tile-IR interpreter; CUDA: the GPU
kernel) and, on CPU, through the triton backend in Triton's interpreter; every kernel is
compiled for sm_90 by both backends.
"""
import pytest
import torch

import tritile
import tritile.language as T
from tritile.ir.printer import format_func

BACKENDS = ["auto", "triton"]  # on CPU tensors: tritile's interpreter / Triton's interpreter


def _run(func, backend, device, *args, out_idx=None):
    if backend == "triton" and device != "cpu":
        pytest.skip("the triton backend's CPU check (Triton's interpreter)")
    return tritile.compile(func, out_idx=out_idx, backend=backend)(*args)


def _compiles_for_hopper(func):
    """Both backends generate sm_90 PTX with a global atomic (no GPU needed)."""
    for backend in ("gluon", "triton"):
        ptx = tritile.compile(func, target="cuda:90", backend=backend).get_source("ptx")
        assert "atom.global" in ptx, backend


# ------------------------------------------------------------------------------ return_prev


def atomic_return_prev(M, N, block_M, block_N, dtype):
    """TileLang's atomic_return_prev_program: the old values of B saved while A is added."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), old_vals: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, block_M), T.ceildiv(N, block_N), threads=32) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                idx_i = bx * block_M + i
                idx_j = by * block_N + j
                if idx_i < M and idx_j < N:
                    old_vals[idx_i, idx_j] = T.atomic_add(B[idx_i, idx_j], A[idx_i, idx_j], return_prev=True)

    return main


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [T.float32, T.float16, T.bfloat16])
def test_atomic_add_return_prev_per_lane(dtype, backend, device):
    M, N = 40, 24  # blocks past the edges: the guard's lanes neither add nor return
    if backend == "triton" and dtype == T.bfloat16 and device == "cpu":
        pytest.skip("Triton's interpreter has no bfloat16 atomics (numpy has no bfloat16)")
    torch_dtype = getattr(torch, dtype)
    a = torch.randn(M, N, device=device).to(torch_dtype)
    b = torch.randn(M, N, device=device).to(torch_dtype)
    old = torch.randn(M, N, device=device).to(torch_dtype)
    initial = b.clone()
    _run(atomic_return_prev(M, N, 16, 16, dtype), backend, device, a, b, old)
    torch.testing.assert_close(old, initial, rtol=0, atol=0)
    torch.testing.assert_close(b, (initial.float() + a.float()).to(torch_dtype), rtol=0, atol=0)


def compact_positive(n, block):
    """TileLang's compaction program: every positive x[i] takes the next free slot of `out`
    from a counter; the slot is used twice (bound check, store index), the atomic runs once."""

    @T.prim_func
    def main(x: T.Tensor((n,), T.float32), out: T.Tensor((n,), T.int32), counter: T.Tensor((1,), T.int32)):
        with T.Kernel(T.ceildiv(n, block), threads=128) as bx:
            for t in T.Parallel(block):
                i = bx * block + t
                if i < n and x[i] > 0:
                    pos = T.atomic_add(counter[0], 1, return_prev=True)
                    if pos < n:
                        out[pos] = i

    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_atomic_add_return_prev_hands_out_distinct_slots(backend, device):
    n = 200
    x = torch.randn(n, device=device)
    out = torch.full((n,), -1, dtype=torch.int32, device=device)
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    func = compact_positive(n, 64)
    assert format_func(func).count("return_prev=True") == 1
    _run(func, backend, device, x, out, counter)
    positive = torch.nonzero(x > 0).flatten().to(torch.int32)
    assert counter.item() == positive.numel()
    taken = out[:positive.numel()]
    assert torch.equal(taken.sort().values, positive), "each positive index in exactly one slot"
    assert (out[positive.numel():] == -1).all(), "no slot past the count written"


def extremum_return_prev(op_name, value):
    """TileLang's atomic_scalar_return_prev_program: one element, outside any T.Parallel."""
    op = getattr(T, op_name)

    @T.prim_func
    def main(Dst: T.Tensor((1,), T.float32), Prev: T.Tensor((1,), T.float32)):
        with T.Kernel(1, threads=1):
            Prev[0] = op(Dst[0], value, return_prev=True)

    return main


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op_name", ["atomic_max", "atomic_min", "atomic_add"])
def test_atomic_return_prev_of_one_element(op_name, backend, device):
    start, value = torch.randn(2).tolist()
    dst = torch.tensor([start], device=device)
    prev = torch.zeros(1, device=device)
    _run(extremum_return_prev(op_name, value), backend, device, dst, prev)
    combine = {"atomic_max": max, "atomic_min": min, "atomic_add": lambda x, y: x + y}[op_name]
    assert prev.item() == torch.tensor(start).item()
    torch.testing.assert_close(dst, torch.tensor([combine(start, value)], device=device))


def test_return_prev_of_a_tile_is_a_compile_error():
    with pytest.raises(tritile.CompileError, match=r"T.atomic_add\(return_prev=True\) needs one element"):
        @T.prim_func
        def main(A: T.Tensor((16,), T.float32), B: T.Tensor((16,), T.float32)):
            with T.Kernel(1, threads=32):
                T.atomic_add(B[0:16], A[0:16], return_prev=True)


# ------------------------------------------------------------------------------ atomic_load / atomic_store


def atomic_load_store(M, N, block_M, block_N, dtype, load_order, store_order):
    """TileLang's atomic_load_store_program, with the orders given."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, block_M), T.ceildiv(N, block_N), threads=32) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                idx_i = bx * block_M + i
                idx_j = by * block_N + j
                if idx_i < M and idx_j < N:
                    val = T.atomic_load(A[idx_i, idx_j], memory_order=load_order)
                    T.atomic_store(B[idx_i, idx_j], val, memory_order=store_order)

    return main


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, load_order, store_order", [
    (T.float32, "seq_cst", "seq_cst"), (T.float32, "acquire", "release"), (T.int32, "relaxed", "relaxed"),
    (T.int64, "consume", "seq_cst"), (T.float64, "relaxed", "release")])
def test_atomic_load_store_copy(dtype, load_order, store_order, backend, device):
    M, N = 40, 24
    torch_dtype = getattr(torch, dtype)
    if torch_dtype.is_floating_point:
        a = torch.randn(M, N, device=device).to(torch_dtype)
        a[0, 0] = -0.0  # a load adds -0.0: the sign of zero survives
    else:
        a = torch.randint(-2**30, 2**30, (M, N), device=device).to(torch_dtype)
    b = torch.randn(M, N, device=device).to(torch_dtype)
    _run(atomic_load_store(M, N, 16, 16, dtype, load_order, store_order), backend, device, a, b)
    assert torch.equal(b, a)
    if torch_dtype.is_floating_point:
        assert torch.signbit(b[0, 0])


def flag_handoff(n):
    """One element: the old value read with `T.atomic_load`, a new one written with
    `T.atomic_store`, outside any T.Parallel (whole-buffer operands, as TileLang allows)."""

    @T.prim_func
    def main(Flag: T.Tensor((1,), T.int32), Seen: T.Tensor((1,), T.int32)):
        with T.Kernel(1, threads=1):
            Seen[0] = T.atomic_load(Flag, memory_order="acquire")
            T.atomic_store(Flag, n, memory_order="release")

    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_atomic_load_store_one_element(backend, device):
    start = int(torch.randint(-1000, 1000, ()))
    flag = torch.tensor([start], dtype=torch.int32, device=device)
    seen = torch.zeros(1, dtype=torch.int32, device=device)
    _run(flag_handoff(77), backend, device, flag, seen)
    assert seen.item() == start and flag.item() == 77


def _load(memory_order):
    @T.prim_func
    def main(source: T.Tensor((1,), T.int32), output: T.Tensor((1,), T.int32)):
        with T.Kernel(1, threads=1):
            output[0] = T.atomic_load(source[0], memory_order=memory_order)

    return main


def _store(memory_order):
    @T.prim_func
    def main(destination: T.Tensor((1,), T.int32)):
        with T.Kernel(1, threads=1):
            T.atomic_store(destination[0], 1, memory_order=memory_order)

    return main


@pytest.mark.parametrize("memory_order", ["release", "acq_rel", "invalid"])
def test_atomic_load_rejects_orders_as_tilelang(memory_order):
    # TileLang raises ValueError; tritile's CompileError (one class) also names the line
    with pytest.raises(ValueError, match="atomic_load does not support memory_order") as err:
        _load(memory_order)
    assert isinstance(err.value, tritile.CompileError) and "test_tilelang_language_atomics.py" in str(err.value)


@pytest.mark.parametrize("memory_order", ["consume", "acquire", "acq_rel", "invalid"])
def test_atomic_store_rejects_orders_as_tilelang(memory_order):
    with pytest.raises(ValueError, match="atomic_store does not support memory_order") as err:
        _store(memory_order)
    assert isinstance(err.value, tritile.CompileError)


@pytest.mark.parametrize("memory_order, sem", [("relaxed", "relaxed"), ("consume", "acquire"), ("acquire", "acquire"),
                                               ("seq_cst", "acq_rel")])
def test_atomic_load_order_is_tritons_sem(memory_order, sem):
    for backend in ("gluon", "triton"):
        source = tritile.compile(_load(memory_order), target="cuda:90", backend=backend).get_source(backend)
        assert f"atomic_add(source + 0, " in source and f"sem={sem!r}" in source


@pytest.mark.parametrize("memory_order, sem", [("relaxed", "relaxed"), ("release", "release"), ("seq_cst", "acq_rel")])
def test_atomic_store_order_is_tritons_sem(memory_order, sem):
    for backend in ("gluon", "triton"):
        source = tritile.compile(_store(memory_order), target="cuda:90", backend=backend).get_source(backend)
        assert "atomic_xchg(destination + 0, " in source and f"sem={sem!r}" in source


# ------------------------------------------------------------------------------ one value, many elements


def region_update(M, N, block_M, block_N, op_name, value):
    """TileLang's tile_atomic_add_expr / tile_atomic_max_expr programs."""
    op = getattr(T, op_name)

    @T.prim_func
    def main(A: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(M, block_M), T.ceildiv(N, block_N), threads=32) as (bx, by):
            op(A[bx * block_M:(bx + 1) * block_M, by * block_N:(by + 1) * block_N], value)

    return main


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op_name", ["atomic_add", "atomic_max", "atomic_min"])
def test_one_value_into_a_region(op_name, backend, device):
    M, N, value = 48, 40, 0.25  # blocks past the edges: those elements are not written
    a = torch.randn(M, N, device=device)
    ref = {"atomic_add": a + value, "atomic_max": a.clamp(min=value), "atomic_min": a.clamp(max=value)}[op_name]
    _run(region_update(M, N, 32, 32, op_name, value), backend, device, a)
    torch.testing.assert_close(a, ref, rtol=0, atol=0)


def counted_lanes(N, valid):
    """An atomic whose address and value are the same on every lane: once per lane that runs."""

    @T.prim_func
    def main(Count: T.Tensor((2,), T.float32)):
        with T.Kernel(3, threads=32):
            for i in T.Parallel(N):
                T.atomic_add(Count[0], 1.0)
                if i < valid:
                    T.atomic_add(Count[1], 2.0)

    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_element_atomic_runs_once_per_lane(backend, device):
    start = torch.randn(2, device=device)
    count = start.clone()
    _run(counted_lanes(24, 10), backend, device, count)  # 24 lanes: padded to 32, pad lanes add nothing
    torch.testing.assert_close(count, start + torch.tensor([3 * 24.0, 3 * 2.0 * 10], device=device))


# ------------------------------------------------------------------------------ 16-bit floats


def half_extrema(K, M, N, block, dtype):
    """K slices folded into C (max, old values kept), D (min) and the contended E[0] (max over
    every lane and block), and written to F by `T.atomic_store`: a compare-and-swap loop on the
    GPU, Triton's atomics taking only add of 16-bit floats."""

    @T.prim_func
    def main(A: T.Tensor((K, M, N), dtype), C: T.Tensor((M, N), dtype), P: T.Tensor((K, M, N), dtype),
             D: T.Tensor((M, N), dtype), E: T.Tensor((1,), dtype), F: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, block), T.ceildiv(N, block), K, threads=32) as (bx, by, bk):
            for i, j in T.Parallel(block, block):
                r = bx * block + i
                c = by * block + j
                if r < M and c < N:
                    P[bk, r, c] = T.atomic_max(C[r, c], A[bk, r, c], return_prev=True)
                    T.atomic_min(D[r, c], A[bk, r, c], memory_order="release")
                    T.atomic_max(E[0], A[bk, r, c])
                    if bk == 0:
                        T.atomic_store(F[r, c], A[bk, r, c])

    return main


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [T.float16, T.bfloat16])
def test_16bit_float_max_min_store(dtype, backend, device):
    if backend == "triton" and dtype == T.bfloat16 and device == "cpu":
        pytest.skip("Triton's interpreter has no bfloat16 atomics (numpy has no bfloat16)")
    K, M, N = 3, 20, 12
    torch_dtype = getattr(torch, dtype)
    a = torch.randn(K, M, N, device=device).to(torch_dtype)
    c, d, f = (torch.randn(M, N, device=device).to(torch_dtype) for _ in range(3))
    e = torch.full((1,), -100.0, device=device).to(torch_dtype)
    p = torch.randn(K, M, N, device=device).to(torch_dtype)
    c0, d0 = c.clone(), d.clone()
    _run(half_extrema(K, M, N, 16, dtype), backend, device, a, c, p, d, e, f)
    assert torch.equal(c, torch.maximum(c0, a.amax(0)))
    assert torch.equal(d, torch.minimum(d0, a.amin(0)))
    assert torch.equal(e, a.amax().reshape(1))
    assert torch.equal(f, a[0])
    # each block's old value: C's start or another block's value, never above the final max
    before = (p == c0) | (p[:, None] == a[None]).any(1)
    assert before.all() and (p <= c).all()


def test_narrow_integer_atomics_are_a_compile_error():
    @T.prim_func
    def main(A: T.Tensor((16,), T.int16)):
        with T.Kernel(1, threads=32):
            for i in T.Parallel(16):
                T.atomic_add(A[i], 1)

    for backend in ("gluon", "triton"):
        with pytest.raises(tritile.CompileError, match=r"atomics.py:\d+: T.atomic_add of int16 is not supported"):
            tritile.compile(main, target="cuda:90", backend=backend).get_source("ptx")
    with pytest.raises(tritile.CompileError, match=r"(?s)no backend compiles.*gluon: .*int16.*triton: .*int16"):
        tritile.compile(main, target="cuda:90", backend="auto").get_source("ptx")


# ------------------------------------------------------------------------------ code generation


def test_atomics_compile_for_hopper():
    _compiles_for_hopper(atomic_return_prev(40, 24, 16, 16, T.float32))
    _compiles_for_hopper(atomic_return_prev(40, 24, 16, 16, T.bfloat16))
    _compiles_for_hopper(compact_positive(200, 64))
    _compiles_for_hopper(extremum_return_prev("atomic_max", 1.5))
    _compiles_for_hopper(atomic_load_store(40, 24, 16, 16, T.float32, "acquire", "release"))
    _compiles_for_hopper(flag_handoff(7))
    _compiles_for_hopper(region_update(48, 40, 32, 32, "atomic_min", 0.25))
    _compiles_for_hopper(counted_lanes(24, 10))
    _compiles_for_hopper(half_extrema(3, 20, 12, 16, T.bfloat16))
