"""docs/semantics.md on every path: generated expression and reduction kernels
(`tests/expression_programs.py`) through the interpreter against torch, their generated code
through Triton for sm_90, a fixed replay list on the GPU against the interpreter, and the
cases that disagreed before (floor `//` / `%`, NaN in reductions, float `//`, fp8 loads)."""
from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import expression_programs as E
import tritile
import tritile.language as T
from tritile.ir import nodes as ir
from tritile.runtime.target import Target

GPU_REPLAY = E.replay_programs(200)  # bench/semantics_replay.py runs the same list
PTX_SUBSET = 10


def _run_interpreter(program, seed):
    kernel = E.build(program)
    a, b = E.inputs(program, torch.Generator().manual_seed(seed))
    return kernel(a, b), E.references(program, a, b)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(E.programs(), st.integers(0, 2 ** 31 - 1))
def test_interpreter_matches_torch(program, seed):
    actual, expected = _run_interpreter(program, seed)
    assert E.matches(actual, expected, program), f"{program.source}\nactual   {actual}\nexpected {expected}"


def test_a_float64_select_keeps_its_constant():
    """Found by the generated programs (session 23, TRITILE_HYPOTHESIS_SCALE=40): the interpreter's
    `T.if_then_else` made a tensor of a Python-float branch in torch's default float32, so a float64
    select of the constant -2147483647.0 gave -2147483648.0; branches are the call's compute dtype
    now (the generated Triton code was right: the literal is an f64 constant in its TTIR)."""
    select = ("select", "float64", ("<", ("cast", "float64", ("load", "A", "int8")), ("cast", "float64", (
        "load", "A", "int8"))), ("cast", "float64", ("load", "A", "int8")), ("cast", "float64", (
            "const", -2147483647, "int32")))
    actual, (expected,) = _run_interpreter(E.Program("parallel", "int8", "int8", "float64", select, "", True, False), 0)
    assert torch.equal(actual, expected) and actual[0].item() == -2147483647.0, actual


def test_replay_list_is_fixed_and_mixed():
    again = E.replay_programs(len(GPU_REPLAY))
    assert [p.source for p in again] == [p.source for p in GPU_REPLAY]
    kinds = {(p.kind, p.out_dtype) for p in GPU_REPLAY}
    assert {k for k, _ in kinds} == {"parallel", "reduce"}
    assert {"float8_e4m3", "float8_e5m2", "int8", "int64", "bfloat16"} <= {d for _, d in kinds}
    assert any(p.nan_propagate for p in GPU_REPLAY) and any(
        p.kind == "reduce" and not p.nan_propagate and E.is_float(p.a_dtype) for p in GPU_REPLAY)


@pytest.mark.parametrize("index", range(PTX_SUBSET))
def test_generated_programs_compile_for_sm90(index):
    program = GPU_REPLAY[index]
    ptx = E.build(program).get_source("ptx")
    assert ".target sm_90" in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("index", range(len(GPU_REPLAY)))
def test_replayed_programs_on_gpu(index, monkeypatch):
    monkeypatch.setenv("TRITILE_FP_FUSION", "off")  # an exact comparison: no fused multiply-add
    program = GPU_REPLAY[index]
    kernel = E.build(program)
    a, b = E.inputs(program, torch.Generator().manual_seed(index))
    interpreted = E.interpreted(kernel, a, b)
    on_gpu = kernel(a.cuda(), b.cuda()).cpu()
    assert E.agrees(on_gpu, interpreted, program, a, b), f"{program.source}\ngpu         {on_gpu}\ninterpreter {interpreted}"


def test_a_gpu_output_with_the_other_zero_agrees():
    """bench/results/semantics_replay_seed2040_before_fix_h100.json, program 786, reduced: `x //
    T.min(b, -b)` at b = 0 divides by whichever zero the min picked (unspecified,
    docs/semantics.md), so the H100's -inf where the interpreter has +inf agrees - and a wrong
    finite value still does not."""
    program = E.Program("parallel", "float16", "uint8", "float64",
                        ("bin", "//", "float64", ("cast", "float64", ("load", "A", "float16")),
                         ("bin", "min", "float64", ("cast", "float64", ("load", "B", "uint8")),
                          ("neg", "float64", ("cast", "float64", ("load", "B", "uint8"))))))
    a = torch.randn(E.LANES).half() * 20
    a[a == 0] = 1.0
    b = torch.randint(1, 200, (E.LANES,), dtype=torch.uint8)
    b[::4] = 0
    interpreted = E.build(program)(a, b)
    other_zero = torch.where(b == 0, -interpreted, interpreted)  # the infinities of -0.0
    assert torch.isinf(interpreted[::4]).all() and not E.same(other_zero, interpreted, program)
    assert E.agrees(other_zero, interpreted, program, a, b)
    wrong = other_zero.clone()
    wrong[1] += 1
    assert not E.agrees(wrong, interpreted, program, a, b)


# ---------------------------------------------------------------------------- fixed cases


@tritile.jit(out_idx=[-1])
def _elementwise(N, dtype, op):
    @T.prim_func
    def kernel(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(N):
                if op == "//":
                    C[i] = A[i] // B[i]
                else:
                    C[i] = A[i] % B[i]

    return kernel


def test_integer_floor_division_and_modulo():
    a = torch.tensor([7, -7, 6, -1, 7, -7, -2 ** 31, 5], dtype=torch.int32)
    b = torch.tensor([3, 3, 3, 3, -3, -3, -1, 7], dtype=torch.int32)
    assert _elementwise(8, "int32", "//")(a, b).tolist() == [2, -3, 2, -1, -3, 2, -2 ** 31, 0]
    assert _elementwise(8, "int32", "%")(a, b).tolist() == [1, 2, 0, 2, -2, -1, 0, 5]
    for dtype in (torch.int8, torch.int16, torch.int64):  # fresh values against torch's floor ops
        x = torch.randint(-100, 100, (16,), dtype=dtype)
        y = torch.randint(1, 50, (16,), dtype=dtype) * (torch.randint(0, 2, (16,), dtype=dtype) * 2 - 1)
        name = str(dtype).split(".")[1]
        assert torch.equal(_elementwise(16, name, "//")(x, y), torch.div(x, y, rounding_mode="floor"))
        assert torch.equal(_elementwise(16, name, "%")(x, y), torch.remainder(x, y))


def test_float_floor_division_and_modulo():
    a = torch.tensor([7.5, -7.5, 6.0, -1.0, 5.0, -0.0, 1.0, 0.0], dtype=torch.float32)
    b = torch.tensor([2.0, 2.0, -4.0, 3.0, math.inf, 1.0, 0.0, 0.0], dtype=torch.float32)
    div = _elementwise(8, "float32", "//")(a, b)
    mod = _elementwise(8, "float32", "%")(a, b)
    assert div[:6].tolist() == [3.0, -4.0, -2.0, -1.0, 0.0, -0.0] and math.copysign(1, div[5]) < 0
    assert div[6] == math.inf and math.isnan(div[7])
    assert mod[:4].tolist() == [1.5, 0.5, -2.0, 2.0] and math.isnan(mod[4]) and math.isnan(mod[6])
    x, y = torch.randn(16) * 100, torch.randn(16) * 10
    assert torch.equal(_elementwise(16, "float32", "//")(x, y), torch.floor(x / y))
    assert torch.equal(_elementwise(16, "float32", "%")(x, y), x - torch.floor(x / y) * y)


@tritile.jit(out_idx=[-1])
def _row_max(M, N, dtype, kind, nan_propagate, clear):
    @T.prim_func
    def kernel(A: T.Tensor((M, N), dtype), B: T.Tensor((M,), dtype), C: T.Tensor((M,), dtype)):
        with T.Kernel(1, threads=128) as bx:
            F = T.alloc_fragment((M, N), dtype)
            R = T.alloc_fragment((M,), dtype)
            T.copy(A, F)
            T.copy(B, R)
            if kind == "max":
                T.reduce_max(F, R, dim=1, clear=clear, nan_propagate=nan_propagate)
            elif kind == "min":
                T.reduce_min(F, R, dim=1, clear=clear, nan_propagate=nan_propagate)
            else:
                T.reduce_absmax(F, R, dim=1, clear=clear, nan_propagate=nan_propagate)
            T.copy(R, C)

    return kernel


@pytest.mark.parametrize("kind", ["max", "min", "absmax"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_reduce_nan_propagate(kind, dtype):
    torch_dtype = getattr(torch, dtype)
    a = torch.randn(4, 8, dtype=torch_dtype)
    a[1, 3] = math.nan
    a[2, :] = math.nan
    b = torch.full((4,), -100.0, dtype=torch_dtype)
    values = a.abs() if kind == "absmax" else a
    fn = (lambda x: x.amin(1)) if kind == "min" else (lambda x: x.amax(1))
    ignoring = _row_max(4, 8, dtype, kind, False, True)(a, b)
    propagating = _row_max(4, 8, dtype, kind, True, True)(a, b)
    nan_as = -math.inf if kind != "min" else math.inf
    expected = fn(torch.where(values.isnan(), torch.tensor(nan_as, dtype=torch_dtype), values))
    assert torch.equal(ignoring[[0, 1, 3]], expected[[0, 1, 3]]) and ignoring[2].isnan()
    assert torch.equal(propagating[[0, 3]], fn(values)[[0, 3]]) and propagating[1:3].isnan().all()
    old_nan = torch.full((4,), math.nan, dtype=torch_dtype)  # clear=False: the old value takes part
    assert torch.equal(_row_max(4, 8, dtype, kind, False, False)(a, old_nan)[[0, 1, 3]], expected[[0, 1, 3]])
    assert _row_max(4, 8, dtype, kind, True, False)(a, old_nan).isnan().all()
    k = _row_max(4, 8, dtype, kind, True, True)
    assert "nan_propagate=True" in k.get_source("tile")
    assert "_propagate_nan)" in k.get_source("gluon")


@tritile.jit(out_idx=[-1])
def _fp8_scaled(N, dtype):
    @T.prim_func
    def kernel(A: T.Tensor((N,), dtype), C: T.Tensor((N,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(N):
                C[i] = T.float32(A[i]) * 2.0

    return kernel


@tritile.jit(out_idx=[-1])
def _fp8_copy(N, dtype):
    @T.prim_func
    def kernel(A: T.Tensor((N,), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(N):
                C[i] = A[i]

    return kernel


def _compile_for(kernel, target: Target) -> str:
    from tritile.codegen.gluon import compile_kernel
    from tritile.lowering import run_passes

    return compile_kernel(run_passes(kernel.func, target)[-1][1], target).asm["ptx"]


@pytest.mark.parametrize("dtype", ["float8_e4m3", "float8_e5m2"])
def test_fp8_element_loads_compile(dtype):
    kernel = _fp8_scaled(16, dtype)
    a = torch.randn(16).to(E.TORCH[dtype])
    assert torch.equal(kernel(a), a.float() * 2)
    assert "other=0.0" in kernel.get_source("gluon")
    assert ".target sm_90" in _compile_for(kernel, Target("cuda", 90))
    copy = _fp8_copy(16, dtype)
    assert torch.equal(copy(a).view(torch.uint8), a.view(torch.uint8))
    if dtype == "float8_e5m2":  # sm_80: Triton 3.6 has no fp8e4nv, and converts fp8 with sm_89 cvts
        assert ".target sm_80" in _compile_for(copy, Target("cuda", 80))


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_float_floor_division_compiles(dtype):
    for op in ("//", "%"):
        kernel = _elementwise(16, dtype, op)
        for arch in (90, 80):
            ptx = _compile_for(kernel, Target("cuda", arch))
            assert f".target sm_{arch}" in ptx and "cvt.rmi" in ptx  # floor


def test_index_math_stays_plain():
    """Non-negative index arithmetic keeps Triton's truncating ops: no correction helpers are
    called in the GEMM / attention examples, and a signed // gets one."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import flash_attention as fa
    from tritile.ops.matmul import matmul, tile_config

    sources = [matmul.compile(M=256, N=256, K=256).get_source("gluon"),
               # persistent, warp specialized, swizzled panels: the tile decode divides by a panel width
               matmul.compile(M=4096, N=4096, K=4096, **tile_config("cuda", 4096, 4096, 4096)).get_source("gluon")]
    for dim, causal in ((64, False), (128, True)):
        sources.append(fa.flashattn(1, 8, 1024, 1024, dim, causal, **fa.tile_config("cuda", dim, causal))
                       .get_source("gluon"))
    for src in sources:  # a module defines only the helpers its kernels call
        assert "_floordiv(" not in src and "_floormod(" not in src
    assert "_floordiv(" in _elementwise(16, "int32", "//").get_source("gluon").split("def _floordiv(")[1]


# ---------------------------------------------------------------------------- conversions (H100 replay, run 1)


@tritile.jit(out_idx=[-1])
def _unary(N, src, dst, op):
    @T.prim_func
    def kernel(A: T.Tensor((N,), src), C: T.Tensor((N,), dst)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(N):
                if op == "store":  # a store into a buffer of another type converts
                    C[i] = A[i]
                elif op == "twice":  # the value doubled in its own type, stored: rounded to it
                    C[i] = A[i] * 2.0
                elif op == "neg":
                    C[i] = -(A[i] - A[i])  # -(+0.0)
                elif op == "abs":
                    C[i] = T.abs(A[i])
                else:  # "uint8": replay program 186, float -> uint8 -> float16
                    C[i] = T.float16(T.uint8(A[i]))

    return kernel


def _ptx90(kernel) -> str:
    return _compile_for(kernel, Target("cuda", 90))


def _bits_equal(actual, expected) -> bool:
    """Equal values, NaN where NaN and the sign of zeros."""
    x, y = actual.double(), torch.tensor(expected, dtype=torch.float64)
    return bool((((x == y) & (x.signbit() == y.signbit())) | (x.isnan() & y.isnan())).all())


@pytest.mark.parametrize("dtype, top, instruction", [("float8_e4m3", 448.0, "cvt.rn.satfinite.e4m3x2.f32"),
                                                     ("float8_e5m2", 57344.0, "cvt.rn.satfinite.e5m2x2.f32")])
def test_float_to_fp8_saturates(dtype, top, instruction):
    inf, nan = math.inf, math.nan
    a = torch.tensor([1e6, -1e6, inf, -inf, nan, 3.0, -0.0, 464.0])
    kernel = _unary(8, "float32", dtype, "store")
    assert _bits_equal(kernel(a), [top, -top, top, -top, nan, 3.0, -0.0, 448.0])
    assert instruction in _ptx90(kernel)
    ints = torch.tensor([2 ** 40, -2 ** 40, 3, 0], dtype=torch.int64)  # through float32, saturating
    assert _bits_equal(_unary(4, "int64", dtype, "store")(ints), [top, -top, 3.0, 0.0])
    # an operation's result rounded to fp8 saturates as well; a plain copy keeps e5m2's inf
    fp8 = torch.tensor([top, -top, 1.5, nan]).to(E.TORCH[dtype])
    doubled = _unary(4, dtype, dtype, "twice")
    assert _bits_equal(doubled(fp8), [top, -top, 3.0, nan])
    assert instruction in _ptx90(doubled)
    if dtype == "float8_e5m2":
        infs = torch.tensor([inf, -inf]).to(E.TORCH[dtype])
        assert _bits_equal(_fp8_copy(2, dtype)(infs), [inf, -inf])


@pytest.mark.parametrize("src", ["float32", "float64", "bfloat16", "float8_e4m3"])
def test_float_to_int_saturates_nan_to_zero(src):
    inf, nan = math.inf, math.nan
    a = torch.tensor([nan, 300.0, -300.0, 11230.17, -1.5, 2.9, inf, -inf]).to(E.TORCH[src])
    values = a.double().tolist()  # as rounded to `src`: 11230.17 is 11200 in bfloat16, 448 in e4m3

    def expected(lo, hi):
        return [0 if v != v else int(min(max(v, lo), hi)) for v in values]

    for dst, (lo, hi) in {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
                          "int32": (-2 ** 31, 2 ** 31 - 1), "int64": (-2 ** 63, 2 ** 63 - 1)}.items():
        kernel = _unary(8, src, dst, "store")
        assert kernel(a).tolist() == expected(lo, hi), dst
        gluon = kernel.get_source("gluon").split("def kernel")[1]
        assert " != " in gluon and ", 0.0, " in gluon, dst  # NaN -> 0 selected before the conversion
        if dst in ("int8", "uint8", "int16"):  # narrow targets clamped in float first
            assert f"gl.minimum(gl.maximum(" in gluon and f", {float(hi)})" in gluon, dst
    assert ".target sm_90" in _ptx90(_unary(8, src, "uint8", "store"))


def test_fp8_to_uint8_to_float16_keeps_the_conversion():
    a = torch.tensor([6144.0, 57344.0, -3.0, math.nan, 200.0, 2.5, 255.0, -0.0]).to(torch.float8_e5m2)
    kernel = _unary(8, "float8_e5m2", "float16", "uint8")
    assert kernel(a).tolist() == [255.0, 255.0, 0.0, 0.0, 192.0, 2.0, 255.0, 0.0]
    assert "255.0)).to(gl.uint8).to(gl.float16)" in kernel.get_source("gluon")
    assert "cvt.rzi.u16.f32" in _ptx90(kernel) or "cvt.rzi.u16.f16" in _ptx90(kernel)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "float8_e5m2", "float8_e4m3"])
def test_float_negation_keeps_the_sign_of_zero(dtype):
    a = torch.tensor([1.0, -2.0, 0.0, 3.0]).to(E.TORCH[dtype])
    kernel = _unary(4, dtype, dtype, "neg")
    assert _bits_equal(kernel(a), [-0.0] * 4)
    assert "* -1.0)" in kernel.get_source("gluon")  # not Triton's 0 - x
    assert ".target sm_90" in _ptx90(kernel)


def test_fp8_abs_computes_in_float32():
    a = torch.tensor([math.inf, -3.0, -0.0, math.nan]).to(torch.float8_e5m2)
    kernel = _unary(4, "float8_e5m2", "float8_e5m2", "abs")
    assert _bits_equal(kernel(a), [57344.0, 3.0, 0.0, math.nan])  # an fp8 operation: saturating
    assert "gl.abs(gl.load(A + i, mask=(i < 4), other=0.0).to(gl.float32)).to(gl.float8e5)" in kernel.get_source("gluon")
    assert ".target sm_90" in _ptx90(kernel)


def test_integer_absmax_wraps_abs():
    int_min, int_max = -2 ** 31, 2 ** 31 - 1
    a = torch.tensor([[int_min, 5, -7, 3], [int_min] * 4, [int_min, int_max, 0, -1], [-2, -9, 4, 1]],
                     dtype=torch.int32)
    old = torch.zeros(4, dtype=torch.int32)
    kernel = _row_max(4, 4, "int32", "absmax", False, True)
    assert kernel(a, old).tolist() == [7, int_min, int_max, 9]  # abs(INT_MIN) == INT_MIN
    assert "gl.abs(" in kernel.get_source("gluon")


@tritile.jit(out_idx=[-1])
def _fp8_broadcasts(N, dtype):
    @T.prim_func
    def kernel(A: T.Tensor((N,), T.float32), C: T.Tensor((4, N), dtype)):
        with T.Kernel(1, threads=128) as bx:
            filled = T.alloc_fragment((N,), dtype)
            staged = T.alloc_shared((N,), dtype)
            T.fill(filled, 3.0)
            T.fill(staged, 1e6)  # saturates
            for i in T.Parallel(N):
                C[0, i] = filled[i]
                C[1, i] = staged[i]
                C[2, i] = T.cast(T.int32(3) ^ T.int32(0), dtype)  # semantics replay program 28
                C[3, i] = A[5]  # a scalar converted, then broadcast

    return kernel


@pytest.mark.parametrize("dtype, top", [("float8_e4m3", 448.0), ("float8_e5m2", 57344.0)])
def test_fp8_broadcasts_convert_once_and_splat_bytes(dtype, top, device):
    a = torch.randn(64) * 4
    c = _fp8_broadcasts(64, dtype)(a.to(device)).cpu()
    scalar = a[5].to(E.TORCH[dtype]).item()
    expected = torch.tensor([[3.0] * 64, [top] * 64, [3.0] * 64, [scalar] * 64])
    assert torch.equal(c.double(), expected.double())
    gluon = _fp8_broadcasts(64, dtype).get_source("gluon")
    assert "gl.int8" in gluon and "bitcast=True" in gluon
    assert "{%rs1, %rs1}" not in _ptx90(_fp8_broadcasts(64, dtype))  # the pair the H100 misread


@tritile.jit(out_idx=[-1])
def _copy_and_reduce_to_int(M, N, src, dst):
    @T.prim_func
    def kernel(A: T.Tensor((M, N), src), B: T.Tensor((M,), src), C: T.Tensor((2, M), dst)):
        with T.Kernel(1, threads=128) as bx:
            tile = T.alloc_fragment((M, N), src)
            column = T.alloc_fragment((M,), src)
            converted = T.alloc_fragment((M,), dst)
            row_max = T.alloc_fragment((M,), dst)
            T.copy(A, tile)
            T.copy(B, column)
            T.copy(column, converted)  # a converting T.copy
            T.reduce_max(tile, row_max, dim=1)  # a reduction written to an integer fragment
            T.copy(converted, C[0, :])
            T.copy(row_max, C[1, :])

    return kernel


def test_float_to_int_in_copies_and_reductions_saturates(device):
    column = torch.tensor([math.nan, 300.0, -300.0, 1e10, -1.5, 2.9, math.inf, -math.inf])
    a = torch.cat([column[:, None], column[:, None] - torch.rand(8, 3) - 1.0], dim=1)  # row max: column
    kernel = _copy_and_reduce_to_int(8, 4, "float32", "int8")
    expected = [0, 127, -128, 127, -1, 2, 127, -128]
    assert kernel(a.to(device), column.to(device)).cpu().tolist() == [expected, expected]
    gluon = kernel.get_source("gluon").split("def kernel")[1]
    assert gluon.count(" != ") == 2 and gluon.count("gl.minimum(gl.maximum(") == 2
    assert ".target sm_90" in _ptx90(kernel)


# ---------------------------------------------------------------------------- fused multiply-add


def _product_into_sum(dtype):
    @T.prim_func
    def kernel(A: T.Tensor((16,), dtype), B: T.Tensor((16,), dtype), C: T.Tensor((16,), dtype)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(16):
                C[i] = A[i] * B[i] + A[i]

    return kernel


@pytest.mark.parametrize("backend", ["gluon", "triton"])
@pytest.mark.parametrize("fusion", ["on", "off"])
def test_fp_fusion_decides_whether_a_product_and_a_sum_fuse(backend, fusion, monkeypatch):
    """TRITILE_FP_FUSION (docs/semantics.md): on, Triton contracts `a * b + a` into one
    `fma.rn.f32`; off, the product and the sum are rounded apart, as the interpreter does."""
    monkeypatch.setenv("TRITILE_FP_FUSION", fusion)
    ptx = tritile.compile(_product_into_sum("float32"), out_idx=[2], target="cuda:90",
                          backend=backend).get_source("ptx")
    ops = {line.split()[0] for line in ptx.splitlines() if line.strip().endswith(";") and line.split()}
    if fusion == "on":
        assert "fma.rn.f32" in ops and "mul.rn.f32" not in ops
    else:
        assert {"mul.rn.f32", "add.rn.f32"} <= ops and not any(op.startswith("fma") for op in ops)


def _replayed_294():
    """bench/results/semantics_replay_seed2027_h100.json, program 294: an fp16 difference of a
    product, whose fused multiply-add rounds once where the interpreter rounds twice.  A new
    kernel per call: the switch is read when a kernel is compiled."""

    @T.prim_func
    def kernel(A: T.Tensor((16,), T.uint8), B: T.Tensor((16,), T.float64), C: T.Tensor((16,), T.float16)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(16):
                C[i] = (T.float16(A[i]) - (T.float16(B[i]) - (T.float16(A[i]) * T.float16(A[i]))))

    return tritile.compile(kernel, out_idx=[-1])


@pytest.mark.gpu
def test_a_product_in_a_sum_rounds_once_fused_and_twice_without(monkeypatch):
    a = torch.full((16,), 225, dtype=torch.uint8)
    b = torch.full((16,), 16.5152645111084, dtype=torch.float64)
    interpreted = _replayed_294()(a, b)
    assert interpreted[0].item() == 50816.0  # 225 * 225 rounded to 50624, then each difference
    monkeypatch.setenv("TRITILE_FP_FUSION", "off")
    assert torch.equal(_replayed_294()(a.cuda(), b.cuda()).cpu(), interpreted)
    monkeypatch.setenv("TRITILE_FP_FUSION", "on")
    assert _replayed_294()(a.cuda(), b.cuda())[0].item() == 50848.0  # b - a * a rounded once


# ---------------------------------------------------------------------------- int16 negation


def _int16_signs():
    """bench/results/semantics_replay_seed2028_before_fix_h100.json, program 648, taken apart: the negation
    and abs of int16 -32768 wrap to -32768, which ptxas read as +32768 once divided, shifted,
    widened or reduced (-32768 // 121 gave 270)."""

    @T.prim_func
    def kernel(A: T.Tensor((16,), T.int16), B: T.Tensor((16,), T.int16), C: T.Tensor((4, 16), T.int32),
               D: T.Tensor((1,), T.int16)):
        with T.Kernel(1, threads=128) as bx:
            tile = T.alloc_fragment((16,), T.int16)
            largest = T.alloc_fragment((1,), T.int16)
            for i in T.Parallel(16):
                C[0, i] = T.int32((-A[i]) // B[i])
                C[1, i] = T.int32(T.abs(A[i]) // B[i])
                C[2, i] = T.int32(-A[i])
                C[3, i] = T.int32((-A[i]) >> 1)
            T.copy(A, tile)
            T.reduce_absmax(tile, largest, dim=0)
            D[0] = largest[0]

    return kernel


def _int16_sign_operands():
    a = torch.randint(-1000, 1000, (16,), dtype=torch.int16)
    a[::3] = -32768
    b = torch.randint(1, 128, (16,), dtype=torch.int16) * (torch.randint(0, 2, (16,), dtype=torch.int16) * 2 - 1)
    negated, magnitude = -a, a.abs()  # torch wraps both to -32768
    expected = torch.stack([torch.div(negated, b, rounding_mode="floor"),
                            torch.div(magnitude, b, rounding_mode="floor"), negated, negated >> 1]).int()
    return a, b, expected, magnitude.int().max().to(torch.int16).reshape(1)


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_int16_negation_and_abs_wrap(backend, device):
    if backend == "triton" and device == "cuda":
        pytest.skip("the GPU suite runs the triton backend under TRITILE_BACKEND=triton")
    a, b, expected, largest = _int16_sign_operands()
    kernel = tritile.compile(_int16_signs(), out_idx=[2, 3], backend=backend)
    c, d = kernel(a.to(device), b.to(device))
    assert torch.equal(c.cpu(), expected) and torch.equal(d.cpu(), largest)


@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_int16_negation_is_a_32_bit_one_for_ptxas(backend):
    """On CUDA the PTX of an int16 negation and abs is a 32-bit one (codegen/ptx_fixups.py says
    why): no neg.s16 / abs.s16 left for ptxas to widen wrong.  The generated source is Triton's
    own `-x` / `abs`, so an AMD target is untouched."""
    kernel = tritile.compile(_int16_signs(), out_idx=[2, 3], target="cuda:90", backend=backend)
    ops = {line.split()[0] for line in kernel.get_source("ptx").replace("; ", ";\n").splitlines()
           if line.strip().endswith(";")}
    assert {"neg.s32", "abs.s32", "cvt.s32.s16"} <= ops and not {"neg.s16", "abs.s16"} & ops
    assert "inline_asm" not in kernel.get_source("gluon" if backend == "gluon" else "triton")


def _int16_negations_as_arithmetic():
    """`0 - x`, `x * -1`, `-1 * x` and `~x + 1` of int16: LLVM makes each of them neg.s16 too."""

    @T.prim_func
    def kernel(A: T.Tensor((16,), T.int16), B: T.Tensor((16,), T.int16), C: T.Tensor((4, 16), T.int32)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(16):
                C[0, i] = T.int32((0 - A[i]) // B[i])
                C[1, i] = T.int32((A[i] * -1) // B[i])
                C[2, i] = T.int32((-1 * A[i]) >> 1)
                C[3, i] = T.int32((~A[i] + 1) // B[i])

    return kernel


@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_int16_negations_written_as_arithmetic(backend, device):
    if backend == "triton" and device == "cuda":
        pytest.skip("the GPU suite runs the triton backend under TRITILE_BACKEND=triton")
    a, b, _, _ = _int16_sign_operands()
    kernel = tritile.compile(_int16_negations_as_arithmetic(), out_idx=[-1],
                             backend="auto" if backend == "gluon" else backend)
    negated = -a
    floor_quotient = torch.div(negated, b, rounding_mode="floor")
    expected = torch.stack([floor_quotient, floor_quotient, negated >> 1, floor_quotient]).int()
    assert torch.equal(kernel(a.to(device), b.to(device)).cpu(), expected)
    ptx = tritile.compile(_int16_negations_as_arithmetic(), out_idx=[-1], target="cuda:90",
                          backend=backend).get_source("ptx")
    assert "neg.s32" in ptx and "neg.s16" not in ptx


# ---------------------------------------------------------------------------- float -> int64 range


def _saturated_then_added(src):
    """bench/results/semantics_replay_seed2030_before_fix_h100.json, program 464, reduced: T.int64 of a
    float16 inf saturates to INT64_MAX, so 7 + it wraps and the min is the wrapped sum.  LLVM took
    the conversion of an out-of-range value for poison, assumed a float16's range and folded the
    min away (the GPU returned INT64_MAX)."""

    @T.prim_func
    def kernel(A: T.Tensor((16,), src), C: T.Tensor((2, 16), T.int64)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(16):
                C[0, i] = T.min(T.int64(7) + T.int64(A[i]), T.int64(A[i]))
                C[1, i] = T.int64(T.int32(A[i]) + T.int32(-3))

    return kernel


def _saturating_reference(a: torch.Tensor, bits: int) -> torch.Tensor:
    x = a.double()
    low, high = -(1 << bits - 1), (1 << bits - 1) - 1
    ints = torch.where(x.isnan(), 0.0, x.clamp(-2.0 ** (bits - 1), 2.0 ** 52)).long()  # exact below 2^52
    return torch.where(x >= 2.0 ** (bits - 1), high, torch.where(x <= low, low, ints))


@pytest.mark.parametrize("backend", ["auto", "triton"])
@pytest.mark.parametrize("src", ["float16", "float32"])
def test_a_saturated_conversion_wraps_in_later_arithmetic(backend, src, device):
    if backend == "triton" and device == "cuda":
        pytest.skip("the GPU suite runs the triton backend under TRITILE_BACKEND=triton")
    a = (torch.randn(16) * 100).to(getattr(torch, src))
    a[0], a[1], a[2] = math.inf, -math.inf, math.nan
    if src == "float32":
        a[3], a[4] = 3e9, 1e19  # past int32's and int64's ranges
    kernel = tritile.compile(_saturated_then_added(src), out_idx=[-1], backend=backend)
    c = kernel(a.to(device)).cpu()
    as_int64 = _saturating_reference(a, 64)
    wrapped = torch.minimum(as_int64 + 7, as_int64)  # torch's int64 sum wraps as the GPU's
    as_int32 = _saturating_reference(a, 32).to(torch.int32)
    assert torch.equal(c[0], wrapped) and torch.equal(c[1], (as_int32 + torch.tensor(-3, dtype=torch.int32)).long())
    assert c[0, 0].item() == -(1 << 63) + 6


@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_a_saturated_conversion_keeps_the_min_in_ptx(backend):
    ptx = tritile.compile(_saturated_then_added("float16"), out_idx=[-1], target="cuda:90",
                          backend=backend).get_source("ptx")
    assert "min.s64" in ptx and "9223372036854775807" in ptx


# ---------------------------------------------------------------------------- constants


def _constant_select_to_fp8():
    """bench/results/semantics_replay_seed2033_before_fix_h100.json, program 595: a select of two equal
    constants converted to e4m3.  LLVM folded it to a constant, Triton converted the constant in
    pairs and ptxas packed the word from a pair and a stray register (`F2FP.PACK_AB_MERGE_C ...,
    R1`): lanes 2-3 of every 4 read -2 and -416.  The frontend folds such a select itself."""

    @T.prim_func
    def kernel(A: T.Tensor((16,), T.uint8), C: T.Tensor((16,), T.float8_e4m3)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(16):
                C[i] = T.float8_e4m3(T.if_then_else(T.int16(A[i]) != 3, T.int16(-1), T.int16(-1)))

    return kernel


def test_a_select_of_equal_constants_is_the_constant(device):
    a = torch.randint(0, 256, (16,), dtype=torch.uint8)
    kernel = tritile.compile(_constant_select_to_fp8(), out_idx=[-1])
    assert torch.equal(kernel(a.to(device)).float().cpu(), torch.full((16,), -1.0))
    assert "where" not in kernel.get_source("gluon").split("def kernel")[1]
    assert isinstance(_select_of(0.0, -0.0), ir.Call)  # signed zeros differ
    assert isinstance(_select_of(math.nan, math.nan), ir.Const) and isinstance(_select_of(2.5, 2.5), ir.Const)


def _select_of(true_value: float, false_value: float):
    """What T.if_then_else builds for a run-time condition and two float32 constants."""
    from tritile.frontend.exprs import select

    cond = ir.BinOp(">", ir.Var("c", T.int32), ir.Const(0), T.bool)
    return select(cond, ir.Const(true_value, T.float32), ir.Const(false_value, T.float32))


def _float64_constants():
    """bench/results/semantics_replay_seed2033_before_fix_h100.json, program 596: a float64 constant that
    float32 does not hold, as a bare literal, was Triton's float32 in `gl.to_tensor` / `maximum`
    (-2147483647.0 stored -2147483648.0)."""

    @T.prim_func
    def kernel(A: T.Tensor((16,), T.float64), C: T.Tensor((2, 16), T.float64)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(16):
                C[0, i] = -T.float64(T.max(T.int32(3), T.int32(2147483647)))
                C[1, i] = T.max(A[i], T.float64(-2147483647.0)) + T.if_then_else(A[i] > 0, T.float64(0.1), A[i])

    return kernel


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_float64_constants_keep_their_bits(backend, device):
    if backend == "triton" and device == "cuda":
        pytest.skip("the GPU suite runs the triton backend under TRITILE_BACKEND=triton")
    a = torch.randn(16, dtype=torch.float64) * 3e9
    c = tritile.compile(_float64_constants(), out_idx=[-1], backend=backend)(a.to(device)).cpu()
    bound = torch.tensor(-2147483647.0, dtype=torch.float64)
    assert torch.equal(c[0], torch.full((16,), -2147483647.0, dtype=torch.float64))
    assert torch.equal(c[1], torch.maximum(a, bound) + torch.where(a > 0, 0.1, a))


def _constant_only_llvm_sees(dtype):
    """A value only LLVM finds constant (`x * 0 + 3`), converted to fp8: semantics replays 2035 and
    2036 found two more such programs after the frontend's fold of equal constants."""

    @T.prim_func
    def kernel(A: T.Tensor((64,), T.int32), C: T.Tensor((64,), dtype)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(64):
                C[i] = T.Cast(dtype, A[i] * 0 + 3)

    return kernel


@pytest.mark.parametrize("dtype", ["float8_e4m3", "float8_e5m2"])
def test_an_fp8_conversion_of_a_value_llvm_finds_constant(dtype, device):
    """Gluon converts to fp8 four lanes at a time in inline asm packed by prmt
    (codegen/semantics.py `_fp8_conversion_helper`): Triton's packing, `mov.b32 {%rs1, %rs1}` of one
    converted pair, was what ptxas merged with a stray register."""
    a = torch.randint(-1000, 1000, (64,), dtype=torch.int32)
    kernel = tritile.compile(_constant_only_llvm_sees(dtype), out_idx=[-1])
    assert torch.equal(kernel(a.to(device)).float().cpu(), torch.full((64,), 3.0))
    ptx = tritile.compile(_constant_only_llvm_sees(dtype), out_idx=[-1], target="cuda:90",
                          backend="gluon").get_source("ptx")
    assert "prmt.b32" in ptx and not re.search(r"mov\.b32\s+%r\d+, \{(%rs\d+), \1\}", ptx)
