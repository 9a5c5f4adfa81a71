"""uniform_selects (lowering/uniform_selects.py): a T.Parallel whose if_then_else has one outcome
on every lane branches once around the loop; values never change."""
from __future__ import annotations

import operator
import re
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tritile
import tritile.language as T
from tritile.interpreter import execute
from tritile.ir import nodes as ir
from tritile.ir.printer import format_func
from tritile.ir.transform import walk
from tritile.lowering import run_passes
from tritile.lowering import uniform_selects
from tritile.runtime.kernel import JITKernel
from tritile.runtime.target import Target

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_warp_specialization import attention_ir  # noqa: E402

H100 = Target("cuda", 90)
OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


def select_program(a, b, s, t, op, steps=6, rows=8, cols=16):
    """Out[k, i, j] = 1 where a*i + b*j + s*k (op) t, else 2 - over lanes (i, j), step k."""

    @T.prim_func
    def selects(Out: T.Tensor((steps, rows, cols), "float32")):
        with T.Kernel(1, threads=128) as bx:
            for k in T.serial(steps):
                for i, j in T.Parallel(rows, cols):
                    lhs = a * i + b * j + s * k
                    if op == ">=":
                        Out[k, i, j] = T.if_then_else(lhs >= t, 1.0, 2.0)
                    elif op == ">":
                        Out[k, i, j] = T.if_then_else(lhs > t, 1.0, 2.0)
                    elif op == "<=":
                        Out[k, i, j] = T.if_then_else(lhs <= t, 1.0, 2.0)
                    else:
                        Out[k, i, j] = T.if_then_else(lhs < t, 1.0, 2.0)
    return tritile.compile(selects, out_idx=[0], target="cuda:90").stages[0][1]


def reference(a, b, s, t, op, steps=6, rows=8, cols=16):
    k, i, j = torch.meshgrid(torch.arange(steps), torch.arange(rows), torch.arange(cols), indexing="ij")
    return torch.where(OPS[op](a * i + b * j + s * k, t), 1.0, 2.0)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(a=st.integers(-3, 3), b=st.integers(-3, 3), s=st.integers(-8, 8), t=st.integers(-40, 40),
       op=st.sampled_from(sorted(OPS)))
def test_branches_compute_what_the_select_does(a, b, s, t, op):
    func = select_program(a, b, s, t, op)
    rewritten = uniform_selects.run(func, H100)
    branches = [n for n in walk(rewritten.kernel.body) if isinstance(n, ir.If)]
    # a lane-free condition is left alone; a version that can never run is not emitted
    assert (0 < len(branches) <= 2) if (a, b) != (0, 0) else not branches
    want = reference(a, b, s, t, op)
    for stage in (func, rewritten):
        out = torch.zeros(6, 8, 16)
        execute(stage, [out], {})
        torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_a_select_not_affine_in_the_lanes_is_left_alone():
    @T.prim_func
    def product(Out: T.Tensor((8, 16), "float32")):
        with T.Kernel(1, threads=128) as bx:
            for i, j in T.Parallel(8, 16):
                Out[i, j] = T.if_then_else(i * j >= 12, 1.0, 2.0)

    func = tritile.compile(product, out_idx=[0], target="cuda:90").stages[0][1]
    assert format_func(uniform_selects.run(func, H100)) == format_func(func)


def test_causal_mask_branches_off_the_diagonal():
    stages = dict(run_passes(attention_ir(True), H100))
    text = format_func(stages["uniform_selects"])
    # the partition's 64 rows all see every key of the tile / none of them
    assert "if bx * 128 + (0 + part * 64) - (k_t - 1) * 128 + -127 >= 0:" in text
    assert "if bx * 128 + (0 + part * 64) - (k_t - 1) * 128 + 63 < 0:" in text
    # the mask is applied after the gemm (accumulator_init): kept, or every score -inf
    assert "acc_s[i, j] = acc_s[i, j]\n" in text and "acc_s[i, j] = acc_s[i, j] + -T.infinity()" in text
    source = JITKernel(attention_ir(True), target=H100).get_source("gluon")
    assert re.search(r"gl\.where\(\(q_idx_\d+ >= k_idx_\d+\)", source)  # the diagonal tiles still select


def junction_program(a, t, lim, kmax, both: bool, steps=6, rows=8, cols=16):
    """Out[k, i, j] = 1 where (a*i - j + 4*k >= t) and/or (j < lim) and/or (k < kmax)."""

    @T.prim_func
    def junctions(Out: T.Tensor((steps, rows, cols), "float32")):
        with T.Kernel(1, threads=128) as bx:
            for k in T.serial(steps):
                for i, j in T.Parallel(rows, cols):
                    if both:
                        Out[k, i, j] = T.if_then_else((a * i - j + 4 * k >= t) & (j < lim) & (k < kmax), 1.0, 2.0)
                    else:
                        Out[k, i, j] = T.if_then_else((a * i - j + 4 * k >= t) | (j < lim) | (k < kmax), 1.0, 2.0)
    return tritile.compile(junctions, out_idx=[0], target="cuda:90").stages[0][1]


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(a=st.integers(-3, 3), t=st.integers(-20, 30), lim=st.integers(0, 17), kmax=st.integers(0, 6),
       both=st.booleans())
def test_conjunctions_and_disjunctions_branch_too(a, t, lim, kmax, both):
    func = junction_program(a, t, lim, kmax, both)
    rewritten = uniform_selects.run(func, H100)
    assert 0 < sum(isinstance(n, ir.If) for n in walk(rewritten.kernel.body)) <= 2
    k, i, j = torch.meshgrid(torch.arange(6), torch.arange(8), torch.arange(16), indexing="ij")
    terms = (a * i - j + 4 * k >= t, j < lim, k < kmax)
    hit = (terms[0] & terms[1] & terms[2]) if both else (terms[0] | terms[1] | terms[2])
    want = torch.where(hit, 1.0, 2.0)
    for stage in (func, rewritten):
        out = torch.zeros(6, 8, 16)
        execute(stage, [out], {})
        torch.testing.assert_close(out, want, rtol=0, atol=0)


@pytest.mark.parametrize("a, t, lim, kmax, both", [
    (2, 3, 9, 4, True),  # "every lane" folds to False (j < 9 fails at j = 15): two versions
    (2, 3, 17, 6, False),  # "no lane" folds to False: two versions
    (-1, -5, 0, 0, True),
])
def test_versions_compile_for_sm90(a, t, lim, kmax, both):
    """Each version has lane indices and Lets of its own (none is live across the branches:
    Triton 3.6 crashed lowering an `scf.if` that yields them)."""
    kernel = JITKernel(junction_program(a, t, lim, kmax, both), target=H100)
    source = kernel.get_source("gluon")
    assert "if " in source and ".target sm_90" in kernel.get_source("ptx")
