"""The reference interpreter on hand-built tile IR (tests/irb.py), compared with torch.

Covers GEMM (all transpose combos, fp16/fp32), OOB zero-fill and dropped writes, vectorised
T.Parallel (broadcast, masked If, Let, While, integer semantics), reductions, cumsum,
atomic adds, control flow, versioned buffers, runtime dims, argument checks, and the async
model: a correct 2-slot pipeline runs clean, each kind of schedule bug raises HazardError.
"""
import pytest
import torch

import tritile
from tritile.ir import dtypes as dt
from tritile.ir import nodes as ir

from irb import (add, alloc, binop, block_vars, call, cast, copy, ex, fill, floordiv, for_, fragment, full,
                 gemm, global_buffer, if_, load, loc, lt, mod, mul, parallel, prim_func, region, run, seq,
                 shared, store, sub, var, var_buffer, while_)

TORCH = {dt.float16: torch.float16, dt.float32: torch.float32}
TOL = {dt.float16: 1e-2, dt.float32: 1e-4}


def ceildiv(a, b):
    return -(-a // b)


def close(actual, expected, dtype=dt.float32):
    tol = TOL.get(dtype, 1e-4)
    torch.testing.assert_close(actual.float(), expected.float(), rtol=tol, atol=tol)


# ------------------------------------------------------------------------------- GEMM

def _gemm_operands(M, N, K, BM, BN, BK, ta, tb, in_dtype, out_dtype):
    A = global_buffer("A", (K, M) if ta else (M, K), in_dtype)
    B = global_buffer("B", (N, K) if tb else (K, N), in_dtype)
    C = global_buffer("C", (M, N), out_dtype)
    A_s = shared("A_shared", (BK, BM) if ta else (BM, BK), in_dtype)
    B_s = shared("B_shared", (BN, BK) if tb else (BK, BN), in_dtype)
    C_f = fragment("C_local", (BM, BN), dt.float32)
    return A, B, C, A_s, B_s, C_f


def _tile_a(A, ta, by, k, BM, BK):
    return region(A, (mul(k, BK), BK), (mul(by, BM), BM)) if ta else region(A, (mul(by, BM), BM), (mul(k, BK), BK))


def _tile_b(B, tb, bx, k, BN, BK):
    return region(B, (mul(bx, BN), BN), (mul(k, BK), BK)) if tb else region(B, (mul(k, BK), BK), (mul(bx, BN), BN))


def gemm_func(M, N, K, BM=64, BN=64, BK=32, ta=False, tb=False, in_dtype=dt.float16, out_dtype=dt.float16,
              kind="pipelined"):
    """TileLang's canonical GEMM as the frontend would emit it."""
    A, B, C, A_s, B_s, C_f = _gemm_operands(M, N, K, BM, BN, BK, ta, tb, in_dtype, out_dtype)
    bx, by = block_vars(2)
    k = var("k")
    body = seq(
        alloc(A_s, B_s, C_f),
        fill(C_f, 0.0),
        for_(k, 0, ceildiv(K, BK),
             copy(_tile_a(A, ta, by, k, BM, BK), full(A_s)),
             copy(_tile_b(B, tb, bx, k, BN, BK), full(B_s)),
             gemm(A_s, B_s, C_f, ta, tb),
             kind=kind, num_stages=2 if kind == "pipelined" else 0),
        copy(full(C_f), region(C, (mul(by, BM), BM), (mul(bx, BN), BN))))
    return prim_func("matmul", [A, B, C], (ceildiv(N, BN), ceildiv(M, BM)), (bx, by), body)


def _gemm_inputs(M, N, K, ta, tb, dtype):
    a = torch.randn((K, M) if ta else (M, K)).to(dtype)
    b = torch.randn((N, K) if tb else (K, N)).to(dtype)
    ref = (a.float().t() if ta else a.float()) @ (b.float().t() if tb else b.float())
    return a, b, ref


@pytest.mark.parametrize("in_dtype", [dt.float16, dt.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["NN", "TN", "NT", "TT"])
def test_gemm_matches_torch(ta, tb, in_dtype):
    M, N, K = 128, 128, 96
    a, b, ref = _gemm_inputs(M, N, K, ta, tb, TORCH[in_dtype])
    c = torch.randn(M, N).to(TORCH[in_dtype])
    run(gemm_func(M, N, K, ta=ta, tb=tb, in_dtype=in_dtype, out_dtype=in_dtype), a, b, c)
    close(c, ref.to(c.dtype), in_dtype)


def test_gemm_padded_shape_zero_fills_reads_and_drops_writes():
    M, N, K = 100, 70, 72  # none a multiple of the 64x64x32 tiles
    a, b, ref = _gemm_inputs(M, N, K, False, False, torch.float32)
    guard = torch.randn(128, 128)
    c = guard[:M, :N]  # a view: dropped writes must not land in the surrounding memory
    before = guard.clone()
    run(gemm_func(M, N, K, in_dtype=dt.float32, out_dtype=dt.float32), a, b, c)
    close(c, ref)
    assert torch.equal(guard[M:, :], before[M:, :]) and torch.equal(guard[:, N:], before[:, N:])


def test_gemm_clear_accum_overwrites_and_default_accumulates():
    M = N = K = 64
    A, B, C, A_s, B_s, C_f = _gemm_operands(M, N, K, 64, 64, 64, False, False, dt.float32, dt.float32)
    bx, = block_vars(1)
    body = seq(alloc(A_s, B_s, C_f), copy(full(A), full(A_s)), copy(full(B), full(B_s)),
               copy(full(C), full(C_f)),
               gemm(A_s, B_s, C_f),  # C_f = c0 + A@B
               gemm(A_s, B_s, C_f),  # C_f = c0 + 2 A@B
               copy(full(C_f), full(C)))
    a, b, c = torch.randn(M, K), torch.randn(K, N), torch.randn(M, N)
    expected = c + 2 * (a @ b)
    run(prim_func("acc", [A, B, C], (1,), (bx,), body), a, b, c)
    close(c, expected)
    body_clear = seq(alloc(A_s, B_s, C_f), copy(full(A), full(A_s)), copy(full(B), full(B_s)),
                     copy(full(C), full(C_f)), gemm(A_s, B_s, C_f, clear_accum=True), copy(full(C_f), full(C)))
    run(prim_func("clear", [A, B, C], (1,), (bx,), body_clear), a, b, c)
    close(c, a @ b)


def test_parallel_body_runs_once_not_per_element(monkeypatch):
    """T.Parallel is vectorised: one store per statement for a whole 64x64 tile (a per-element
    Python loop would make every kernel test thousands of times slower)."""
    from tritile.interpreter.memory import Memory

    calls = []
    original = Memory.store
    monkeypatch.setattr(Memory, "store", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    X, Y = global_buffer("X", (128, 64), dt.float32), global_buffer("Y", (128, 64), dt.float32)
    bx, = block_vars(1)
    i, j = var("i"), var("j")
    body = parallel((i, j), (64, 64), store(Y, (add(mul(bx, 64), i), j), mul(load(X, add(mul(bx, 64), i), j), 3.0)))
    x, y = torch.randn(128, 64), torch.randn(128, 64)
    run(prim_func("scale", [X, Y], (2,), (bx,), body), x, y)
    close(y, 3 * x)
    assert len(calls) == 2  # one per block


def test_unwritten_fragment_reads_as_nan():
    X = global_buffer("X", (16, 16), dt.float32)
    F = fragment("F", (16, 16), dt.float32)
    bx, = block_vars(1)
    body = seq(alloc(F), copy(full(F), full(X)))
    x = torch.randn(16, 16)
    run(prim_func("f", [X], (1,), (bx,), body), x)
    assert torch.isnan(x).all()


# ------------------------------------------------------------------------------- T.Parallel

def test_parallel_elementwise_broadcast_masked_if_and_let():
    M, N = 96, 64
    X = global_buffer("X", (M, N), dt.float16)
    S = global_buffer("S", (N,), dt.float32)
    Bias = global_buffer("Bias", (M,), dt.float32)
    Y = global_buffer("Y", (M, N), dt.float16)
    X_f = fragment("X_f", (32, N), dt.float16)
    Y_f = fragment("Y_f", (32, N), dt.float32)
    bx, = block_vars(1)
    i, j, t = var("i"), var("j"), var("t", dt.float32)
    xv = cast(load(X_f, i, j), dt.float32)
    body = seq(
        alloc(X_f, Y_f),
        copy(region(X, (mul(bx, 32), 32), None), full(X_f)),
        parallel((i, j), (32, N),
                 ir.Let(t, mul(xv, load(S, j))),
                 if_(binop(">", t, 0.0),
                     store(Y_f, (i, j), add(call("exp", mul(t, -1.0)), load(Bias, add(mul(bx, 32), i)))),
                     store(Y_f, (i, j), call("if_then_else", lt(j, 32), mul(t, 2.0), call("tanh", t))))),
        copy(full(Y_f), region(Y, (mul(bx, 32), 32), None)))
    x, s, bias = torch.randn(M, N).half(), torch.randn(N), torch.randn(M)
    y = torch.randn(M, N).half()
    run(prim_func("ew", [X, S, Bias, Y], (M // 32,), (bx,), body), x, s, bias, y)
    tt = x.float() * s
    cols = torch.arange(N)
    expected = torch.where(tt > 0, torch.exp(-tt) + bias[:, None], torch.where(cols < 32, 2 * tt, torch.tanh(tt)))
    close(y, expected.half(), dt.float16)


def test_integer_semantics_match_in_scalar_and_vectorised_code():
    """// and % are floor ops, / on ints truncates toward zero, in both evaluation paths."""
    n = 16
    Out = global_buffer("Out", (3, n), dt.int32)
    Ser = global_buffer("Ser", (3, n), dt.int32)
    bx, = block_vars(1)
    i, s = var("i"), var("s")

    def ops(v):
        shifted = sub(v, 8)
        return [floordiv(shifted, 3), mod(shifted, -3), binop("/", shifted, 3)]

    body = seq(
        parallel((i,), (n,), *[store(Out, (r, i), e) for r, e in enumerate(ops(i))]),
        for_(s, 0, n, *[store(Ser, (r, s), e) for r, e in enumerate(ops(s))]))
    out, ser = torch.randint(-9, 9, (3, n), dtype=torch.int32), torch.randint(-9, 9, (3, n), dtype=torch.int32)
    run(prim_func("ints", [Out, Ser], (1,), (bx,), body), out, ser)
    v = torch.arange(n) - 8
    expected = torch.stack([torch.div(v, 3, rounding_mode="floor"), torch.remainder(v, -3),
                            torch.div(v, 3, rounding_mode="trunc")]).int()
    assert torch.equal(out, expected)
    assert torch.equal(ser, expected)


def test_parallel_while_runs_each_lane_its_own_number_of_iterations():
    n = 64
    X = global_buffer("X", (n,), dt.int32)
    Steps = global_buffer("Steps", (n,), dt.int32)
    v, c = fragment("v", (n,), dt.int32), fragment("c", (n,), dt.int32)
    bx, = block_vars(1)
    i = var("i")
    even = binop("==", mod(load(v, i), 2), 0)
    body = seq(
        alloc(v, c),
        parallel((i,), (n,),
                 store(v, (i,), load(X, i)), store(c, (i,), 0),
                 while_(binop("!=", load(v, i), 1),
                        if_(even, store(v, (i,), floordiv(load(v, i), 2)),
                            store(v, (i,), add(mul(load(v, i), 3), 1))),
                        store(c, (i,), add(load(c, i), 1)))),
        copy(full(c), full(Steps)))
    x = torch.randint(1, 40, (n,), dtype=torch.int32)
    steps = torch.randint(-5, 5, (n,), dtype=torch.int32)
    run(prim_func("collatz", [X, Steps], (1,), (bx,), body), x, steps)

    def collatz(value):
        count = 0
        while value != 1:
            value = value // 2 if value % 2 == 0 else 3 * value + 1
            count += 1
        return count

    assert steps.tolist() == [collatz(int(value)) for value in x]


def test_parallel_out_of_bounds_global_reads_zero_and_onchip_index_is_an_error():
    n = 48
    X = global_buffer("X", (n,), dt.float32)
    Y = global_buffer("Y", (64,), dt.float32)
    bx, = block_vars(1)
    i = var("i")
    body = parallel((i,), (64,), store(Y, (i,), add(load(X, i), 1.0)))
    x, y = torch.randn(n), torch.randn(64)
    run(prim_func("pad", [X, Y], (1,), (bx,), body), x, y)
    close(y, torch.cat([x + 1, torch.ones(64 - n)]))

    F = fragment("F", (32,), dt.float32)
    bad = ir.Store(F, (add(i, 1),), ex(1.0), loc=loc(7, "F[i + 1] = 1.0"))
    with pytest.raises(tritile.CompileError, match=r"test_kernel.py:7.*\n.*|out of bounds") as info:
        run(prim_func("bad", [X, Y], (1,), (bx,), seq(alloc(F), parallel((i,), (32,), bad))), x, y)
    assert "out of bounds" in str(info.value) and "test_kernel.py:7" in str(info.value)


def test_parallel_transposed_nested_and_lane_dependent_loops():
    """Transposed element access, a nested T.Parallel, a serial loop whose bound depends on
    the lane (prefix sums), and a dense scalar atomic_add inside T.Parallel."""
    R, Cn = 48, 64
    X = global_buffer("X", (R, Cn), dt.float32)
    Xt = global_buffer("Xt", (Cn, R), dt.float32)
    S = global_buffer("S", (Cn,), dt.float32)
    Outer = global_buffer("Outer", (R, Cn), dt.float32)
    Prefix = global_buffer("Prefix", (R,), dt.float32)
    Acc = global_buffer("Acc", (Cn, R), dt.float32)
    acc = fragment("acc", (R,), dt.float32)
    bx, = block_vars(1)
    i, j, s = var("i"), var("j"), var("s")
    t = var("t", dt.float32)
    body = seq(
        alloc(acc),
        parallel((i, j), (R, Cn), store(Xt, (j, i), load(X, i, j)),
                 ir.AtomicAdd(region(Acc, j, i), mul(load(X, i, j), 2.0))),
        parallel((i,), (R,), ir.Let(t, load(X, i, 0)),
                 parallel((j,), (Cn,), store(Outer, (i, j), mul(t, load(S, j))))),
        parallel((i,), (R,), store(acc, (i,), 0.0),
                 for_(s, 0, add(i, 1), store(acc, (i,), add(load(acc, i), load(X, s, 1))))),
        copy(full(acc), full(Prefix)))
    x, s_ = torch.randn(R, Cn), torch.randn(Cn)
    xt, outer, prefix, acc0 = torch.randn(Cn, R), torch.randn(R, Cn), torch.randn(R), torch.randn(Cn, R)
    expected_acc = acc0 + 2 * x.t()
    run(prim_func("lanes", [X, Xt, S, Outer, Prefix, Acc], (1,), (bx,), body), x, xt, s_, outer, prefix, acc0)
    assert torch.equal(xt, x.t())
    close(outer, x[:, :1] * s_)
    close(prefix, x[:, 1].cumsum(0))
    close(acc0, expected_acc)


# ------------------------------------------------------------------------------- reductions

_TORCH_REDUCE = {"max": lambda x, d: x.amax(d), "min": lambda x, d: x.amin(d), "sum": lambda x, d: x.sum(d),
                 "abssum": lambda x, d: x.abs().sum(d), "absmax": lambda x, d: x.abs().amax(d)}
_TORCH_COMBINE = {"max": torch.maximum, "min": torch.minimum, "sum": torch.add, "abssum": torch.add,
                  "absmax": torch.maximum}


@pytest.mark.parametrize("clear", [True, False])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("kind", ["max", "sum", "min", "abssum", "absmax"])
def test_reduce(kind, dim, clear):
    R, Cn = 64, 48
    out_shape = (1, Cn) if dim == 0 else (R,)  # kept-as-1 and removed forms
    X = global_buffer("X", (R, Cn), dt.float32)
    Init = global_buffer("Init", out_shape, dt.float32)
    Out = global_buffer("Out", out_shape, dt.float32)
    X_f, O_f = fragment("X_f", (R, Cn), dt.float32), fragment("O_f", out_shape, dt.float32)
    bx, = block_vars(1)
    body = seq(alloc(X_f, O_f), copy(full(X), full(X_f)), copy(full(Init), full(O_f)),
               ir.Reduce(kind, full(X_f), full(O_f), dim, clear, loc=loc(3)), copy(full(O_f), full(Out)))
    x, init, out = torch.randn(R, Cn), torch.randn(out_shape), torch.randn(out_shape)
    run(prim_func("red", [X, Init, Out], (1,), (bx,), body), x, init, out)
    expected = _TORCH_REDUCE[kind](x, dim).reshape(out_shape)
    if not clear:
        expected = _TORCH_COMBINE[kind](init, expected)
    close(out, expected)


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dim", [0, 1])
def test_cumsum(dim, reverse, in_place):
    R, Cn = 32, 48
    X, Y = global_buffer("X", (R, Cn), dt.float32), global_buffer("Y", (R, Cn), dt.float16)
    X_s, Y_s = shared("X_s", (R, Cn), dt.float32), shared("Y_s", (R, Cn), dt.float32)
    dst = X_s if in_place else Y_s
    bx, = block_vars(1)
    body = seq(alloc(X_s, Y_s), copy(full(X), full(X_s)),
               ir.Cumsum(full(X_s), full(dst), dim, reverse, loc=loc(4)), copy(full(dst), full(Y)))
    x, y = torch.randn(R, Cn), torch.randn(R, Cn).half()
    run(prim_func("scan", [X, Y], (1,), (bx,), body), x, y)
    expected = x.flip(dim).cumsum(dim).flip(dim) if reverse else x.cumsum(dim)
    close(y, expected.half(), dt.float16)


# ------------------------------------------------------------------------------- atomics

def test_atomic_add_tile_form_split_k_on_padded_output():
    M, N, K, BM, BN, BK, splits = 80, 96, 128, 64, 64, 32, 2
    A, B, C, A_s, B_s, C_f = _gemm_operands(M, N, K, BM, BN, BK, False, False, dt.float32, dt.float32)
    bx, by, bz = block_vars(3)
    k = var("k")
    kk = add(mul(bz, K // BK // splits), k)
    body = seq(alloc(A_s, B_s, C_f), fill(C_f, 0.0),
               for_(k, 0, K // BK // splits,
                    copy(_tile_a(A, False, by, kk, BM, BK), full(A_s)),
                    copy(_tile_b(B, False, bx, kk, BN, BK), full(B_s)),
                    gemm(A_s, B_s, C_f)),
               ir.AtomicAdd(region(C, (mul(by, BM), BM), (mul(bx, BN), BN)), full(C_f), loc=loc(9)))
    a, b, ref = _gemm_inputs(M, N, K, False, False, torch.float32)
    c = torch.randn(M, N)
    expected = c + ref
    run(prim_func("splitk", [A, B, C], (ceildiv(N, BN), ceildiv(M, BM), splits), (bx, by, bz), body), a, b, c)
    close(c, expected)


def test_atomic_add_scalar_form_in_parallel_and_serial_code():
    n, bins = 256, 16
    Idx = global_buffer("Idx", (n,), dt.int32)
    W = global_buffer("W", (n,), dt.float32)
    Hist = global_buffer("Hist", (bins,), dt.float32)
    Total = global_buffer("Total", (1,), dt.float32)
    bx, = block_vars(1)
    i, s = var("i"), var("s")
    body = seq(
        parallel((i,), (64,),  # each of the 4 blocks covers 64 items; duplicates collide
                 ir.AtomicAdd(region(Hist, load(Idx, add(mul(bx, 64), i))), load(W, add(mul(bx, 64), i)))),
        for_(s, 0, 64, ir.AtomicAdd(region(Total, 0), load(W, add(mul(bx, 64), s)))))
    idx = torch.randint(0, bins, (n,), dtype=torch.int32)
    w, hist, total = torch.randn(n), torch.randn(bins), torch.randn(1)
    expected_hist = hist.index_add(0, idx.long(), w)
    expected_total = total + w.sum()
    run(prim_func("hist", [Idx, W, Hist, Total], (4,), (bx,), body), idx, w, hist, total)
    close(hist, expected_hist)
    close(total, expected_total)


# ------------------------------------------------------------------------------- control flow

def test_scalar_if_and_while_with_alloc_var():
    nb = 6
    X, Out, Root = (global_buffer("X", (nb,), dt.float32), global_buffer("Out", (nb,), dt.float32),
                    global_buffer("Root", (nb,), dt.int32))
    cnt = var_buffer("cnt", dt.int32)
    bx, = block_vars(1)
    body = seq(
        ir.Alloc(cnt, init=ex(0)),
        while_(lt(mul(load(cnt), load(cnt)), mul(bx, 7)), store(cnt, (), add(load(cnt), 1))),
        store(Root, (bx,), load(cnt)),
        if_(binop("==", mod(bx, 2), 0), store(Out, (bx,), load(X, bx)),
            store(Out, (bx,), mul(load(X, bx), -3.0))))
    x, out, root = torch.randn(nb), torch.randn(nb), torch.randint(-3, 3, (nb,), dtype=torch.int32)
    run(prim_func("ctl", [X, Out, Root], (nb,), (bx,), body), x, out, root)
    blocks = torch.arange(nb)
    close(out, torch.where(blocks % 2 == 0, x, -3 * x))
    assert root.tolist() == [next(r for r in range(10) if r * r >= b * 7) for b in range(nb)]


def test_runtime_dim_and_argument_checks():
    Mv = var("M")
    X, Y = global_buffer("X", (Mv, 32), dt.float32), global_buffer("Y", (Mv, 32), dt.float32)
    X_s = shared("X_s", (64, 32), dt.float32)
    bx, = block_vars(1)
    i, j = var("i"), var("j")
    body = seq(alloc(X_s), copy(region(X, (mul(bx, 64), 64), None), full(X_s)),
               parallel((i, j), (64, 32), store(X_s, (i, j), mul(load(X_s, i, j), 2.0))),
               copy(full(X_s), region(Y, (mul(bx, 64), 64), None)))
    func = prim_func("dyn", [X, Y], (floordiv(add(Mv, 63), 64),), (bx,), body, dynamic_vars=[Mv],
                     dim_bindings={Mv: (0, 0)})
    x, y = torch.randn(100, 32), torch.randn(100, 32)
    run(func, x, y, dims={Mv: 100})
    close(y, 2 * x)
    y2 = torch.randn(100, 32)
    run(func, x, y2)  # M bound from X's shape through dim_bindings
    close(y2, 2 * x)
    with pytest.raises(TypeError, match="Y.*float32"):
        run(func, x, y.double())
    with pytest.raises(ValueError, match="Y.*shape"):
        run(func, x, torch.randn(90, 32))
    with pytest.raises(ValueError, match="X.*rank"):
        run(func, torch.randn(100), y)
    with pytest.raises(TypeError, match="2 tensors"):
        run(func, x)


# ------------------------------------------------------------------------------- versioned buffers

def test_versioned_buffer_slots_are_independent_tiles():
    """Sync copies into alternating slots of a [2, 64, 32] buffer (the IR after
    buffer_versioning, before pipeline injection), consumed by gemm, T.Parallel and reduce."""
    M, N, K, BM, BN, BK = 64, 64, 128, 64, 64, 32
    A, B, C, A_s0, B_s0, C_f = _gemm_operands(M, N, K, BM, BN, BK, False, False, dt.float32, dt.float32)
    A_v = shared("A_shared", (2, BM, BK), dt.float32, num_versions=2, origin=A_s0)
    B_v = shared("B_shared", (2, BK, BN), dt.float32, num_versions=2, origin=B_s0)
    RowSum = global_buffer("RowSum", (M,), dt.float32)
    r_f, ab_f = fragment("r_f", (BM,), dt.float32), fragment("ab_f", (BM, BK), dt.float32)
    bx, by = block_vars(2)
    k, i, j = var("k"), var("i"), var("j")
    slot = mod(k, 2)
    body = seq(
        alloc(A_v, B_v, C_f, r_f, ab_f), fill(C_f, 0.0), fill(r_f, 0.0),
        for_(k, 0, K // BK,
             copy(_tile_a(A, False, by, k, BM, BK), region(A_v, slot, None, None)),
             copy(_tile_b(B, False, bx, k, BN, BK), region(B_v, slot, None, None)),
             gemm(region(A_v, slot, None, None), region(B_v, slot, None, None), C_f),
             parallel((i, j), (BM, BK), store(ab_f, (i, j), call("abs", load(A_v, slot, i, j)))),
             ir.Reduce("sum", region(A_v, slot, None, None), full(r_f), 1, False, loc=loc(5)),
             kind="pipelined", num_stages=2),
        copy(full(C_f), full(C)), copy(full(r_f), full(RowSum)))
    a, b, ref = _gemm_inputs(M, N, K, False, False, torch.float32)
    c, rowsum = torch.randn(M, N), torch.randn(M)
    run(prim_func("versioned", [A, B, C, RowSum], (1, 1), (bx, by), body), a, b, c, rowsum)
    close(c, ref)
    close(rowsum, a.sum(1))


# ------------------------------------------------------------------------------- async model

def _async_gemm(M=128, N=64, K=128, bug=None, async_mma=False):
    """A 2-slot software pipeline as pipeline_injection emits it; `bug` injects one mistake."""
    BM, BN, BK = 64, 64, 32
    nk = ceildiv(K, BK)
    A, B, C, A_s0, B_s0, C_f = _gemm_operands(M, N, K, BM, BN, BK, False, False, dt.float16, dt.float32)
    A_v = shared("A_shared", (2, BM, BK), dt.float16, num_versions=2, origin=A_s0)
    B_v = shared("B_shared", (2, BK, BN), dt.float16, num_versions=2, origin=B_s0)
    bx, by = block_vars(2)
    k = var("k")

    def load_stage(it, line):
        s = mod(it, 2)
        return seq(
            ir.AsyncCopy(_tile_a(A, False, by, it, BM, BK), region(A_v, s, None, None), ex(it), s, loc=loc(line)),
            ir.AsyncCopy(_tile_b(B, False, bx, it, BN, BK), region(B_v, s, None, None), ex(it), s,
                         loc=loc(line + 1)))

    slot = mod(k, 2)
    consume = gemm(region(A_v, slot, None, None), region(B_v, slot, None, None), C_f, is_async=async_mma, line=30)
    if async_mma:
        loop = [ir.WaitGroup(0, k, loc=loc(20)), consume,
                ir.WaitMMA(2 if bug == "copy_into_gemm_slot" else 1, loc=loc(31)),
                if_(lt(add(k, 1), nk), load_stage(add(k, 1), 40)), ir.CommitGroup(add(k, 1), loc=loc(42))]
        epilogue = [] if bug == "accumulator_before_wait" else [ir.WaitMMA(0, loc=loc(50))]
    else:
        pending = 2 if bug in ("read_before_wait", "wait_not_covering") else 1
        covers = k if bug != "read_before_wait" else None
        # "undrained": the last iteration prefetches a tile nobody waits for
        prefetch = load_stage(add(k, 1), 40) if bug == "undrained" else if_(lt(add(k, 1), nk), load_stage(add(k, 1), 40))
        loop = [prefetch, ir.CommitGroup(add(k, 1), loc=loc(42)), ir.WaitGroup(pending, covers, loc=loc(20)), consume]
        epilogue = [] if bug == "undrained" else [ir.WaitGroup(0, loc=loc(50))]
    body = seq(alloc(A_v, B_v, C_f), fill(C_f, 0.0),
               load_stage(0, 10), ir.CommitGroup(ex(0), loc=loc(12)),
               ir.For(k, ex(0), ex(nk), seq(*loop), pipelined_from=2, loc=loc(15)),
               *epilogue,
               copy(full(C_f), region(C, (mul(by, BM), BM), (mul(bx, BN), BN))),
               *([ir.WaitMMA(0, loc=loc(60))] if bug == "accumulator_before_wait" else []))
    return prim_func("pipelined", [A, B, C], (ceildiv(N, BN), ceildiv(M, BM)), (bx, by), body), (M, N, K)


@pytest.mark.parametrize("async_mma", [False, True], ids=["sync_mma", "async_mma"])
def test_correct_two_slot_async_pipeline_is_clean_and_matches(async_mma):
    func, (M, N, K) = _async_gemm(async_mma=async_mma)
    a, b, ref = _gemm_inputs(M, N, K, False, False, torch.float16)
    c = torch.randn(M, N)
    run(func, a, b, c)
    close(c, ref)


@pytest.mark.parametrize("bug,async_mma,pattern", [
    ("read_before_wait", False,
     r"reads A_shared slot 0 before a T.wait_group(.|\n)*T.gemm\(A_shared\[k % 2(.|\n)*test_kernel.py:30"
     r"(.|\n)*T.async_copy\(A\[(.|\n)*test_kernel.py:10"),
    ("wait_not_covering", False, r"wait does not cover iteration 0(.|\n)*A_shared slot 0(.|\n)*T.wait_group\(2\)"),
    ("copy_into_gemm_slot", True,
     r"overwrites A_shared slot 0 while an async T.gemm still reads it(.|\n)*T.async_copy(.|\n)*test_kernel.py:40"
     r"(.|\n)*in flight: T.gemm\(A_shared\[k % 2"),
    ("undrained", False, r"kernel ends with an async copy into A_shared slot 0(.|\n)*T.async_copy\(A\["),
    ("accumulator_before_wait", True, r"reads the accumulator C_local of an async T.gemm"),
])
def test_schedule_bugs_raise_hazard_error(bug, async_mma, pattern):
    func, (M, N, K) = _async_gemm(bug=bug, async_mma=async_mma)
    a, b, _ = _gemm_inputs(M, N, K, False, False, torch.float16)
    with pytest.raises(tritile.HazardError, match=pattern):
        run(func, a, b, torch.randn(M, N))


def test_undrained_async_copy_and_parallel_read_of_pending_slot():
    X = global_buffer("X", (64, 32), dt.float32)
    Y = global_buffer("Y", (64, 32), dt.float32)
    X_s0 = shared("X_s", (64, 32), dt.float32)
    X_v = shared("X_s", (2, 64, 32), dt.float32, num_versions=2, origin=X_s0)
    bx, = block_vars(1)
    i, j = var("i"), var("j")
    issue = seq(alloc(X_v), ir.AsyncCopy(full(X), region(X_v, 1, None, None), ex(0), ex(1), loc=loc(3)),
                ir.CommitGroup(ex(0), loc=loc(4)))
    func = prim_func("leak", [X, Y], (1,), (bx,), issue)
    x, y = torch.randn(64, 32), torch.randn(64, 32)
    with pytest.raises(tritile.HazardError, match=r"kernel ends with an async copy into X_s slot 1"):
        run(func, x, y)

    reader = parallel((i, j), (64, 32), store(Y, (i, j), load(X_v, 1, i, j)))
    with pytest.raises(tritile.HazardError, match=r"reads X_s slot 1 before(.|\n)*Y\[i, j\] = X_s\[1, i, j\]"):
        run(prim_func("early", [X, Y], (1,), (bx,), seq(issue, reader)), x, y)

    # an async gemm nobody waits for
    A_s, C_f = shared("A_s", (32, 32), dt.float32), fragment("C_f", (32, 32), dt.float32)
    mma = seq(alloc(A_s, C_f), copy(region(X, (0, 32), None), full(A_s)), fill(C_f, 0.0),
              gemm(A_s, A_s, C_f, is_async=True, line=8))
    with pytest.raises(tritile.HazardError, match=r"kernel ends with an async T.gemm on C_f(.|\n)*test_kernel.py:8"):
        run(prim_func("mma", [X, Y], (1,), (bx,), mma), x, y)

    # the other slot is free to use while slot 1 is in flight; after the wait slot 1 holds X
    other = parallel((i, j), (64, 32), store(X_v, (0, i, j), load(X, i, j)))
    done = seq(issue, other, ir.WaitGroup(0, ex(0), loc=loc(5)), reader)
    run(prim_func("ok", [X, Y], (1,), (bx,), done), x, y)
    close(y, x)


def test_casts_round_the_same_in_scalar_and_vectorised_code():
    n = 32
    X = global_buffer("X", (n,), dt.float32)
    Half, Trunc = global_buffer("Half", (2, n), dt.float32), global_buffer("Trunc", (2, n), dt.int32)
    bx, = block_vars(1)
    i, s = var("i"), var("s")

    def casts(v):
        x = mul(load(X, v), 100.0)
        return [store(Half, (0 if v is i else 1, v), cast(x, dt.float16)),
                store(Trunc, (0 if v is i else 1, v), cast(x, dt.int32))]

    body = seq(parallel((i,), (n,), *casts(i)), for_(s, 0, n, *casts(s)))
    x = torch.randn(n)
    half, trunc = torch.randn(2, n), torch.randint(-5, 5, (2, n), dtype=torch.int32)
    run(prim_func("casts", [X, Half, Trunc], (1,), (bx,), body), x, half, trunc)
    scaled = x * 100.0
    assert torch.equal(half, scaled.half().float().expand(2, n))
    assert torch.equal(trunc, scaled.trunc().int().expand(2, n))
