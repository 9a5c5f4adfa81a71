"""accumulator_init (lowering/accumulator_init.py): a gemm overwrites its accumulator and the
initial value (a clear, a fill, a mask) is applied after it; values never change."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tritile
import tritile.language as T
from tritile.interpreter import execute
from tritile.ir import nodes as ir
from tritile.ir.transform import walk
from tritile.lowering import accumulator_init

M, N, K, STEPS = 16, 32, 16, 3
VALUES = [0.0, -math.inf, 1.5, -2.0]


def init_program(init: str, a=1, b=-1, s=4, t=0, then_value=0.0, else_value=-math.inf, fill_value=0.0,
                 between: str = "none"):
    """Out[k] = A @ B^T plus an initial value of the accumulator, for STEPS steps k; `init` is
    "clear", "fill" or "mask" (select on a*i + b*j + s*k >= t); `between` puts a statement
    between the initialisation and the gemm."""

    @T.prim_func
    def program(A: T.Tensor((M, K), "float16"), B: T.Tensor((STEPS, N, K), "float16"),
                Bias: T.Tensor((M, N), "float32"), Out: T.Tensor((STEPS, M, N), "float32")):
        with T.Kernel(1, threads=128) as bx:
            A_shared = T.alloc_shared((M, K), "float16")
            B_shared = T.alloc_shared((N, K), "float16")
            acc = T.alloc_fragment((M, N), "float32")
            bias = T.alloc_fragment((M, N), "float32")
            seen = T.alloc_fragment((M, N), "float32")
            T.copy(A, A_shared)
            T.copy(Bias, bias)
            for k in T.serial(STEPS):
                if init == "clear":
                    T.clear(acc)
                elif init == "fill":
                    T.fill(acc, fill_value)
                elif init == "bias":
                    for i, j in T.Parallel(M, N):
                        acc[i, j] = bias[i, j]
                else:
                    for i, j in T.Parallel(M, N):
                        acc[i, j] = T.if_then_else(a * i + b * j + s * k >= t, then_value, else_value)
                T.copy(B[k, :, :], B_shared)  # unrelated to the accumulator: may stay in between
                if between == "reads acc":
                    T.copy(acc, seen)
                elif between == "writes bias":
                    T.copy(Bias, bias)
                T.gemm(A_shared, B_shared, acc, transpose_B=True)
                T.copy(acc, Out[k, :, :])

    return tritile.compile(program, out_idx=[3], target="cuda:90").stages[0][1]


def reference(A, B, Bias, init, a=1, b=-1, s=4, t=0, then_value=0.0, else_value=-math.inf, fill_value=0.0):
    i, j = torch.meshgrid(torch.arange(M), torch.arange(N), indexing="ij")
    out = []
    for k in range(STEPS):
        if init == "clear":
            start = torch.zeros(M, N)
        elif init == "fill":
            start = torch.full((M, N), fill_value)
        elif init == "bias":
            start = Bias
        else:
            start = torch.where(a * i + b * j + s * k >= t, then_value, else_value)
        out.append(start + A.float() @ B[k].float().T)
    return torch.stack(out)


def run(func, A, B, Bias):
    out = torch.full((STEPS, M, N), float("nan"))
    execute(func, [A, B, Bias, out], {})
    return out


def inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(M, K, generator=gen).half(), torch.randn(STEPS, N, K, generator=gen).half(),
            torch.randn(M, N, generator=gen))


def gemms(func) -> list:
    return [n for n in walk(func.kernel.body) if isinstance(n, ir.Gemm)]


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(init=st.sampled_from(["clear", "fill", "bias", "mask"]), a=st.integers(-2, 2), b=st.integers(-2, 2),
       s=st.integers(-8, 8), t=st.integers(-30, 30), then_value=st.sampled_from(VALUES),
       else_value=st.sampled_from(VALUES), fill_value=st.sampled_from(VALUES), seed=st.integers(0, 2 ** 16))
def test_initial_value_after_the_gemm_computes_the_same(init, a, b, s, t, then_value, else_value, fill_value, seed):
    params = dict(a=a, b=b, s=s, t=t, then_value=then_value, else_value=else_value, fill_value=fill_value)
    func = init_program(init, **params)
    moved = accumulator_init.run(func, None)
    assert [g.clear_accum for g in gemms(moved)] == [True]
    parallels = [n for n in walk(moved.kernel.body) if isinstance(n, ir.Parallel)]
    adds_nothing = init == "clear" or (init == "fill" and fill_value == 0) or (
        init == "mask" and then_value == 0 and else_value == 0)
    assert len(parallels) == (0 if adds_nothing else 1)
    A, B, Bias = inputs(seed)
    want = reference(A, B, Bias, init, **params)
    before, after = run(func, A, B, Bias), run(moved, A, B, Bias)
    # the same sum in the other order: equal in the interpreter, whose gemm adds its product
    torch.testing.assert_close(after, before, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(after, want, rtol=1e-5, atol=1e-4, equal_nan=True)


def test_a_mask_becomes_a_select_on_the_product():
    moved = accumulator_init.run(init_program("mask"), None)
    body = next(n for n in walk(moved.kernel.body) if isinstance(n, ir.For)).body.stmts
    kinds = [type(s).__name__ for s in body]
    assert kinds == ["Copy", "Gemm", "Parallel", "Copy"], kinds
    store = body[2].body.stmts[-1]
    select = store.value
    assert isinstance(select, ir.Call) and select.fn == "if_then_else"
    kept, masked = select.args[1], select.args[2]
    assert isinstance(kept, ir.Load) and kept.buffer is store.buffer  # adding 0 keeps the product
    assert isinstance(masked, ir.BinOp) and masked.op == "+"


@pytest.mark.parametrize("between", ["reads acc", "writes bias"])
def test_an_initialisation_that_cannot_move_stays(between):
    """The accumulator read before the gemm, or the initial value's source rewritten in
    between: the program is left as it is."""
    func = init_program("bias", between=between)
    moved = accumulator_init.run(func, None)
    assert [g.clear_accum for g in gemms(moved)] == [False]
    A, B, Bias = inputs(1)
    torch.testing.assert_close(run(moved, A, B, Bias), reference(A, B, Bias, "bias"), rtol=1e-5, atol=1e-4)


def test_a_gemm_accumulating_over_a_loop_keeps_its_accumulator():
    """The init outside a reduction loop and the gemm inside it: not one statement list."""

    @T.prim_func
    def program(A: T.Tensor((M, 2 * K), "float16"), B: T.Tensor((N, 2 * K), "float16"), Out: T.Tensor((M, N), "float32")):
        with T.Kernel(1, threads=128) as bx:
            A_shared = T.alloc_shared((M, K), "float16")
            B_shared = T.alloc_shared((N, K), "float16")
            acc = T.alloc_fragment((M, N), "float32")
            T.clear(acc)
            for k in T.serial(2):
                T.copy(A[:, k * K:(k + 1) * K], A_shared)
                T.copy(B[:, k * K:(k + 1) * K], B_shared)
                T.gemm(A_shared, B_shared, acc, transpose_B=True)
            T.copy(acc, Out)

    func = tritile.compile(program, out_idx=[2], target="cuda:90").stages[0][1]
    moved = accumulator_init.run(func, None)
    assert [g.clear_accum for g in gemms(moved)] == [False]
    A, B = torch.randn(M, 2 * K).half(), torch.randn(N, 2 * K).half()
    out = torch.zeros(M, N)
    execute(moved, [A, B, out], {})
    torch.testing.assert_close(out, A.float() @ B.float().T, rtol=1e-5, atol=1e-4)


def test_a_cleared_wgmma_accumulator_starts_from_fresh_zeros():
    """use_acc=False ignores the accumulator operand, but the old value passed there stays
    live into the wgmma: the backend passes zeros."""
    import re
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from examples.flash_attention import flashattn, tile_config
    from tritile.runtime.kernel import JITKernel
    from tritile.runtime.target import Target

    source = JITKernel(flashattn.fn(1, 2, 512, 512, 128, True, **tile_config("cuda", 128)),
                       target=Target("cuda", 90)).get_source("gluon")
    cleared = re.findall(r"acc_s = warpgroup_mma\(Q_shared[^\n]*", source)
    assert cleared and all("gl.zeros([64, 128], gl.float32" in g and "use_acc=False" in g for g in cleared), cleared
