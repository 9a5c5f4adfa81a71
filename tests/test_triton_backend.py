"""The triton.language backend (tritile/codegen/triton) on a machine without a GPU.

* Three ways on CPU: tritile's tile-IR interpreter == Triton's interpreter running the generated
  ``@triton.jit`` kernel == torch, for the suite's kernels (GEMMs of every dtype / transpose /
  register operand / swizzle / runtime size, FlashAttention, softmax, reductions, scans, atomics,
  scalar control flow, `T.alloc_local` arrays) and for generated expression / reduction programs
  (hypothesis, `tests/expression_programs.py`), and for the pipeline tests' generated programs
  (hypothesis, `tests/pipeline_programs.py`).
* Compile checks for every target: the GEMM and FlashAttention examples for gfx942 / gfx950
  (`v_mfma`, LDS within the target's limit), sm_80 (`mma.sync`, `cp.async`), sm_90 (`wgmma`),
  sm_100 (`tcgen05`); a pipelined loop's `num_stages` reaches Triton's pipeliner.
* The choice of backend (`backend=`, `TRITILE_BACKEND`, auto's fallback), inspection stages, and
  `CompileError`s at the user's line for what the backend cannot express.
"""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import expression_programs as E
import kernels as K
import tritile
import tritile.language as T
from tritile import codegen
from tritile.codegen import triton as triton_backend
from tritile.codegen.triton import TritonKernel
from tritile.interpreter import execute
from tritile.lowering import run_passes
from tritile.runtime.target import Target, parse_target
from test_kernels_attention import flash_attention as FA  # examples/flash_attention.py
import test_kernels_fragment_rows as rows
from test_pipeline_properties import REPLAY as PIPELINE_REPLAY
from test_pipeline_properties import programs as pipeline_programs


@pytest.fixture(autouse=True)
def default_backend(monkeypatch):
    """These tests name the backends they compare: `TRITILE_BACKEND` (CI sets it for the kernel
    suites) does not choose for them."""
    monkeypatch.delenv("TRITILE_BACKEND", raising=False)


def on_backend(kernel, backend, target="auto"):
    """`kernel`'s program (its frontend IR) compiled with `backend`."""
    return tritile.compile(kernel.stages[0][1], target=target, backend=backend)


def on_triton(kernel, target="auto"):
    return on_backend(kernel, "triton", target)


def three_ways(kernel, args, expected, assert_close):
    """tile-IR interpreter == Triton's interpreter of the generated code == `expected` (torch),
    each output at its dtype's tolerance; the args are cloned for each run (outputs may be
    accumulated into).  `kernel` may have been built under any backend: both runs compile
    its program afresh (backend "auto" runs CPU tensors in the tile-IR interpreter)."""
    ours = on_backend(kernel, "auto")(*[a.clone() for a in args])
    triton = on_triton(kernel)(*[a.clone() for a in args])
    for name, result in (("tile-IR interpreter", ours), ("Triton interpreter", triton)):
        results, references = (result, expected) if isinstance(result, list) else ([result], [expected])
        for r, e in zip(results, references):
            try:
                assert_close(r, e)
            except AssertionError as err:
                raise AssertionError(f"{name}: {err}") from None
    return ours, triton


# ---------------------------------------------------------------------------- kernels, three ways


@pytest.mark.parametrize("trans_A, trans_B", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_gemm_three_ways(trans_A, trans_B, dtype, assert_close):
    torch_dtype = getattr(torch, dtype)
    kernel = K.matmul(64, 64, 64, 32, 32, 32, trans_A, trans_B, dtype, dtype, num_stages=2)
    a, b = K.make_operands(64, 64, 64, trans_A, trans_B, torch_dtype)
    three_ways(kernel, (a, b), K.gemm_reference(a, b, trans_A, trans_B), assert_close)


@pytest.mark.parametrize("register_operand", ["A", "B"])
def test_gemm_register_operand_three_ways(register_operand, assert_close):
    kernel = K.matmul(64, 64, 64, 32, 32, 32, register_operand=register_operand)
    a, b = K.make_operands(64, 64, 64)
    three_ways(kernel, (a, b), K.gemm_reference(a, b), assert_close)


def test_gemm_swizzle_and_ragged_edges_three_ways(assert_close):
    """`T.use_swizzle` panels over a 3 x 3 grid whose last tiles hang over M and N (masked)."""
    kernel = K.matmul(80, 72, 64, 32, 32, 32, swizzle_panel=2)
    a, b = K.make_operands(80, 72, 64)
    three_ways(kernel, (a, b), K.gemm_reference(a, b), assert_close)
    assert "num_programs" in on_triton(kernel).get_source("triton")


def test_gemm_dynamic_sizes_three_ways(assert_close):
    M, N, K_ = T.dynamic("m, n, k")
    kernel = tritile.compile(K.gemm(M, N, K_, 32, 32, 32), out_idx=[-1])
    for m, n, k in [(64, 32, 64), (48, 80, 96)]:
        a, b = K.make_operands(m, n, k)
        three_ways(kernel, (a, b), K.gemm_reference(a, b), assert_close)


def test_gemm_small_tiles_use_a_broadcast_product(assert_close):
    """Tiles with a dimension under 16 (tl.dot's minimum) multiply by a broadcast product."""
    kernel = K.matmul(32, 32, 32, 8, 16, 8)
    a, b = K.make_operands(32, 32, 32)
    three_ways(kernel, (a, b), K.gemm_reference(a, b), assert_close)
    source = on_triton(kernel).get_source("triton")
    assert "tl.dot" not in source and "tl.sum(" in source


@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_attention_three_ways(is_causal, assert_close):
    kernel = FA.flashattn(1, 2, 128, 128, 64, is_causal)
    q, k, v = (torch.randn(1, 2, 128, 64, dtype=torch.float16) for _ in range(3))
    three_ways(kernel, (q, k, v), FA.ref_program(q, k, v, is_causal), assert_close)


def test_splitk_atomic_add_three_ways(assert_close):
    kernel = tritile.compile(K.splitk_gemm(64, 64, 128, 32, 32, 32, 2, "scalar"))
    a, b = K.make_operands(64, 64, 128)
    c = torch.zeros(64, 64)
    ours = c.clone()
    on_backend(kernel, "auto")(a, b, ours)
    triton = c.clone()
    on_triton(kernel)(a, b, triton)
    expected = a.float() @ b.float()
    assert_close(ours, expected)
    assert_close(triton, expected)


@pytest.mark.parametrize("form", ["tile_region", "tile_head"])
def test_tile_atomic_add_three_ways(form, assert_close):
    kernel = tritile.compile(K.splitk_gemm(64, 64, 64, 32, 32, 32, 2, form))
    a, b = K.make_operands(64, 64, 64)
    results = []
    for run in (on_backend(kernel, "auto"), on_triton(kernel)):
        c = torch.ones(64, 64)
        run(a, b, c)
        results.append(c)
    for c in results:
        assert_close(c, a.float() @ b.float() + 1)


@tritile.jit(out_idx=[-1])
def rows_softmax_reduce_scan(M, N, dtype="float32"):
    """Softmax rows, the running (cumsum) sum of each row's softmax, and its NaN-propagating max."""

    @T.prim_func
    def main(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(1, threads=128) as _:
            x = T.alloc_fragment((M, N), dtype)
            row_max = T.alloc_fragment((M,), dtype)
            row_sum = T.alloc_fragment((M,), dtype)
            T.copy(X, x)
            T.reduce_max(x, row_max, dim=1, nan_propagate=True)
            for i, j in T.Parallel(M, N):
                x[i, j] = T.exp(x[i, j] - row_max[i])
            T.reduce_sum(x, row_sum, dim=1)
            for i, j in T.Parallel(M, N):
                x[i, j] = x[i, j] / row_sum[i]
            T.cumsum(x, dim=1)
            T.copy(x, Y)

    return main


def test_softmax_reduce_scan_three_ways(assert_close):
    x = torch.randn(16, 32)
    three_ways(rows_softmax_reduce_scan(16, 32), (x,), torch.softmax(x, dim=1).cumsum(dim=1), assert_close)


@tritile.jit(out_idx=[-1])
def local_pair_scale(M, N):
    """The issue's example: a `T.alloc_local((2,))` read inside `T.Parallel`, written in a serial
    loop at a runtime index (a 1-D tensor on both backends, codegen/semantics.py)."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), S: T.Tensor((2,), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(1, threads=128) as _:
            pair = T.alloc_local((2,), "float32")
            for t in T.serial(2):
                pair[t] = S[t] * 2.0
            for i, j in T.Parallel(M, N):
                C[i, j] = A[i, j] * pair[0] + pair[1]

    return main


def test_alloc_local_array_inside_parallel(assert_close):
    a, s = torch.randn(16, 32), torch.randn(2)
    kernel = local_pair_scale(16, 32)
    three_ways(kernel, (a, s), a * (2 * s[0]) + 2 * s[1], assert_close)


@tritile.jit(out_idx=[-1])
def element_writes(N):
    """Single elements of a fragment read and written outside T.Parallel, at constant and loop indices."""

    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=128) as _:
            x = T.alloc_fragment((N,), "float32")
            T.copy(A, x)
            x[0] = x[N - 1] + 1.0
            for t in T.serial(3):
                x[t + 1] = x[t] * 2.0
            T.copy(x, B)

    return main


def test_element_writes_three_ways(assert_close):
    a = torch.randn(32)
    expected = a.clone()
    expected[0] = a[31] + 1
    for t in range(3):
        expected[t + 1] = expected[t] * 2
    three_ways(element_writes(32), (a,), expected, assert_close)


def test_fragment_rows_three_ways(assert_close):
    """Rows, a column and elements of fragments read and written at runtime indices: the same
    bits from both interpreters, inf / NaN / -0.0 in the other rows; and the flash-decoding
    combine kernels."""
    a = rows.special_values((6, 24), torch.bfloat16, "cpu")
    picks = torch.randperm(6).to(torch.int32), torch.randint(0, 6, (6,), dtype=torch.int32)
    kernel = rows.fragment_rows(6, 24, "bfloat16")
    expected = rows.fragment_rows_reference(a, *picks)
    for name, results in (("tile-IR interpreter", on_backend(kernel, "auto")(a, *picks)),
                          ("Triton interpreter", on_triton(kernel)(a, *picks))):
        assert all(rows.same_values(r, e) for r, e in zip(results, expected)), name
    lse, partial = rows.split_lse((1, 2, 4, 48), "cpu"), torch.randn(1, 48, 2, 4, 32).half()
    three_ways(rows.mha_combine(1, 2, 48, 4, 32, 64), (lse, partial),
               rows.combine_reference(lse.permute(2, 0, 3, 1), partial.permute(3, 0, 1, 2, 4)).half(), assert_close)


@tritile.jit(out_idx=[-1])
def scale_3d(B, M, N):
    """A 3-D T.Parallel: the Gluon backend's are of rank 1 or 2."""

    @T.prim_func
    def main(A: T.Tensor((B, M, N), "float32"), C: T.Tensor((B, M, N), "float32")):
        with T.Kernel(1, threads=128) as _:
            for b, i, j in T.Parallel(B, M, N):
                C[b, i, j] = A[b, i, j] * 2.0

    return main


def test_auto_falls_back_to_triton_where_gluon_refuses():
    kernel = scale_3d(2, 4, 8)
    with pytest.raises(tritile.CompileError, match="not supported by the Gluon backend"):
        codegen.compile_kernel(kernel.stages, Target("cuda", 90), [codegen.BACKENDS["gluon"]])
    chosen = codegen.compile_kernel(kernel.stages, Target("cuda", 90), codegen.candidates("auto", Target("cuda", 90)))
    assert isinstance(chosen, TritonKernel) and ".entry" in chosen.asm["ptx"]


def test_print_matches_the_tile_ir_interpreter(capsys):
    """T.print of a tile, a scalar and a message: the same lines from both interpreters (the GPU's
    `device_print` format)."""

    @T.prim_func
    def printing(A: T.Tensor((2, 4), "float32")):
        with T.Kernel(2, threads=128) as bx:
            tile = T.alloc_fragment((4,), "float32")
            T.copy(A[bx, 0], tile)
            T.print(tile, msg="tile")
            T.print(A[bx, 1] * 2.0, msg="x")
            T.print(msg="done")

    a = torch.randn(2, 4)
    outputs = []
    for backend in ("auto", "triton"):
        tritile.compile(printing, backend=backend)(a)
        outputs.append(capsys.readouterr().out.splitlines())
    assert outputs[0] == outputs[1] and len(outputs[0]) == 2 * (4 + 2)
    assert outputs[1][0] == f"pid (0, 0, 0) idx (0) tile: {float(a[0, 0]):f}"


@tritile.jit(out_idx=[-2, -1])
def scalar_control_flow(M, N):
    """`T.alloc_var` counters in a serial loop, an `if` and a `while` on runtime values."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), Count: T.Tensor((M,), "int32"), Total: T.Tensor((M,), "float32")):
        with T.Kernel(M, threads=128) as bx:
            count = T.alloc_var("int32", init=0)
            total = T.alloc_var("float32", 0)
            for j in T.serial(N):
                if A[bx, j] > 0:
                    count = count + 1
                    total = total + A[bx, j]
            while count > 4:
                count = count - 4
            Count[bx] = count
            Total[bx] = total

    return main


def test_scalar_control_flow_three_ways(assert_close):
    a = torch.randn(8, 32)
    positive = (a > 0).sum(1).int()
    expected = [torch.where(positive > 4, (positive - 1) % 4 + 1, positive).int(), (a * (a > 0)).sum(1)]
    three_ways(scalar_control_flow(8, 32), (a,), expected, assert_close)


# ---------------------------------------------------------------------------- generated programs

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(E.programs(), st.integers(0, 2 ** 31 - 1))
def test_expression_programs_three_ways(program, seed):
    """Every dtype: fp8 and bfloat16 values, saturating conversions and NaN included (Triton's
    interpreter is repaired where it departs from the compiled code: codegen/triton/interpreter.py)."""
    kernel = E.build(program)
    a, b = E.inputs(program, torch.Generator().manual_seed(seed))
    expected = E.references(program, a, b)
    ours, triton = on_backend(kernel, "auto")(a, b), on_triton(kernel)(a, b)
    assert E.matches(ours, expected, program), f"{program.source}\ntile-IR interpreter {ours}\nexpected {expected}"
    assert E.matches(triton, expected, program), f"{program.source}\nTriton interpreter {triton}\nexpected {expected}"


_A8, _U8 = ("load", "A", "int8"), ("cast", "uint8", ("load", "A", "int8"))
_DOUBLED = ("bin", "+", "int8", ("bin", "max", "int8", _A8, ("const", -128, "int8")), _A8)  # wraps in int8
_NEGATED = ("neg", "uint8", ("bin", "max", "uint8", _U8, ("const", 0, "uint8")))


@pytest.mark.parametrize("program", [
    E.Program("parallel", "int8", "int8", "int8", ("bin", "//", "int8", _A8, ("select", "int8", (
        "==", _DOUBLED, ("const", 0, "int8")), ("const", 1, "int8"), _DOUBLED)), "", True, False),
    E.Program("parallel", "int8", "int8", "uint8", ("bin", "//", "uint8", _U8, ("select", "uint8", (
        "==", _NEGATED, ("const", 0, "uint8")), ("const", 1, "uint8"), _NEGATED)), "", True, False),
], ids=["int8-wraps-past-a-library-call", "uint8-divides-by-a-select"])
def test_narrow_integer_constants_keep_their_type(program):
    """Found by the generated programs: a bare literal next to an int8 / uint8 tensor in
    `maximum` / `where` was Triton's int32, so int8 sums stopped wrapping (all-zero quotients) and
    uint8 // int32 was a TypeError; narrow-integer constants are typed scalars now."""
    test_expression_programs_three_ways.hypothesis.inner_test(program, 0)


def test_a_cast_that_wraps_keeps_floor_division():
    """Found by the generated programs (session 22): `T.int8(B[i]) // 2` of a uint8 B was emitted
    as Triton's truncating `//`, the signs analysis taking the cast for non-negative (the uint8's
    interval) - 128..255 turn negative in int8, and -77 // 2 came out -38 instead of -39.  A cast
    keeps its value's interval only where the target type holds all of it."""
    program = E.Program("parallel", "int8", "uint8", "int8", ("bin", "//", "int8", ("cast", "int8", ("load", "B", "uint8")),
                        ("select", "int8", ("==", ("const", 2, "int8"), ("const", 0, "int8")), ("const", 1, "int8"),
                         ("const", 2, "int8"))), "", True, False)
    test_expression_programs_three_ways.hypothesis.inner_test(program, 1)


def test_a_16_bit_modulo_by_a_cast_constant_is_typed():
    """Found by the generated programs (session 22, TRITILE_HYPOTHESIS_SCALE=8): bfloat16 `%` by
    `T.bfloat16(abs(7))` emitted `7.0.to(tl.float32)` - the cast folded to a bare literal, which
    has no `.to` - and failed in Triton (both backends share the rule)."""
    program = E.Program("parallel", "int8", "float8_e5m2", "bfloat16", ("bin", "%", "bfloat16", (
        "abs", "bfloat16", ("abs", "bfloat16", ("cast", "bfloat16", ("load", "A", "int8")))),
        ("cast", "bfloat16", ("abs", "uint8", ("const", 7, "uint8")))), "", True, False)
    test_expression_programs_three_ways.hypothesis.inner_test(program, 0)


def test_a_folded_cast_of_a_constant_saturates():
    """Found by the generated programs (session 23, TRITILE_HYPOTHESIS_SCALE=30):
    `T.int8(T.float16(T.int16(-32768)))` folded to the constant -32768 typed int8 - the fold
    rounded the constant to its own type but never converted it - and storing it wrapped to 0,
    where a cast of float16 -32768 to int8 saturates to -128 (the GPU's cvt, the interpreter's
    Cast and torch agree).  A folded cast converts as the Cast it replaces."""
    program = E.Program("parallel", "int8", "int8", "int8", ("cast", "int8", ("cast", "float16", (
        "const", -32768, "int16"))), "", True, False)
    test_expression_programs_three_ways.hypothesis.inner_test(program, 0)


def test_a_cast_to_the_same_fp8_type_keeps_inf():
    """Found by the generated programs (session 23, TRITILE_HYPOTHESIS_SCALE=200): the reference
    model saturated `T.float8_e5m2(A[i])` of an e5m2 A's -inf to -57344, where a cast to the value's
    own type is no conversion - the frontend drops it, as TVM and Triton do, and every backend
    keeps the inf (docs/semantics.md); the model is now the same."""
    program = E.Program("parallel", "float8_e5m2", "int8", "float8_e5m2", ("cast", "float8_e5m2", (
        "load", "A", "float8_e5m2")), "", True, False)
    for seed in range(4):  # inputs with an inf among them
        test_expression_programs_three_ways.hypothesis.inner_test(program, seed)


def test_an_int64_select_of_constants_stays_int64():
    """Found by the generated programs (session 23, TRITILE_HYPOTHESIS_SCALE=300): an int64 select
    of two constants was `tl.where(c, -1, -1)` - Triton's int32 - and adding INT64_MIN to it was a
    Triton error; int64 constants are typed scalars, as narrower and unsigned ones were."""
    select = ("select", "int64", ("<", ("cast", "int64", ("load", "A", "int8")), ("cast", "int64", (
        "load", "A", "int8"))), ("const", -1, "int64"), ("const", -1, "int64"))
    program = E.Program("parallel", "int8", "int8", "int8", ("cast", "int8", ("bin", "+", "int64", select, (
        "const", -2 ** 63, "int64"))), "", True, False)
    test_expression_programs_three_ways.hypothesis.inner_test(program, 0)


@pytest.mark.parametrize("a_dtype, expr", [
    ("int8", ("bin", "+", "float32", ("neg", "float32", ("cast", "float32", ("load", "A", "int8"))),
              ("cast", "float32", ("const", 0, "int8")))),
    ("float32", ("bin", "//", "float32", ("load", "A", "float32"), ("cast", "float32", ("const", 1, "int8")))),
], ids=["minus-zero-plus-zero", "float-floor-division-by-one"])
def test_float_identities_hold_only_where_they_are_identities(a_dtype, expr):
    """Found by the generated programs (session 23, TRITILE_HYPOTHESIS_SCALE=200): the frontend
    rewrote float `x + 0.0` to x, which is -0.0 where the sum is +0.0, and - on the way - `x // 1.0`
    to x where it is floor(x).  For floats only x - (+0.0) and x * 1 stay rewritten."""
    program = E.Program("parallel", a_dtype, "int8", "float32", expr, "", True, False)
    for seed in range(2):
        test_expression_programs_three_ways.hypothesis.inner_test(program, seed)


def test_a_bfloat16_maximum_stays_bfloat16():
    """Found by the generated programs (session 22): Triton's `maximum` / `minimum` promote
    bfloat16 to float32 and return float32, so `B + (max(A, A) + B)` skipped the rounding after
    the inner sum (35072 where each bfloat16 operation rounded gives 34816) - in compiled code
    too; the generated code converts the result back (exact)."""
    load_b, load_a = ("cast", "bfloat16", ("load", "B", "int16")), ("cast", "bfloat16", ("load", "A", "int8"))
    program = E.Program("parallel", "int8", "int16", "bfloat16", ("bin", "+", "bfloat16", load_b, (
        "bin", "+", "bfloat16", ("bin", "max", "bfloat16", load_a, load_a), load_b)), "", True, False)
    test_expression_programs_three_ways.hypothesis.inner_test(program, 0)


def _pipeline_program_three_ways(program, seed, target=Target("cuda", 90)):
    """A generated pipeline program (tests/pipeline_programs.py: sibling pipelined GEMM loops,
    guards, runtime trip counts, manual schedules) through the tile-IR interpreter (its final IR)
    and the generated triton.language kernel (Triton's interpreter), each against torch."""
    stages = run_passes(program.func, target, stop_after="shared_memory_budget")
    expected_c, expected_d = program.reference(program.make_args(seed))
    kernel = triton_backend.compile_kernel(dict(stages)["accumulator_init"], target)
    for name, run in (("tile-IR interpreter", lambda args: execute(stages[-1][1], args, dict(program.dims))),
                      ("Triton interpreter", lambda args: kernel.interpret(args, dict(program.dims)))):
        args = program.make_args(seed)
        run(args)
        torch.testing.assert_close(args[3], expected_c, rtol=1e-4, atol=1e-3, msg=lambda m: f"{name}: {m}")
        if program.read_after:
            torch.testing.assert_close(args[4], expected_d, rtol=0, atol=0, msg=lambda m: f"{name}: {m}")
    return kernel


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(program=pipeline_programs(), seed=st.integers(0, 2**16))
def test_pipeline_programs_three_ways(program, seed):
    _pipeline_program_three_ways(program, seed)


def test_replayed_pipeline_programs_three_ways_and_compile_for_gfx942():
    for index, (program, seed) in enumerate(PIPELINE_REPLAY[:12]):
        kernel = _pipeline_program_three_ways(program, seed, Target("hip", "gfx942"))
        if index < 3:
            assert "v_mfma" in kernel.asm["amdgcn"]


def test_replayed_programs_three_ways():
    """The first 120 programs of the fixed replay list (the GPU's, bench/semantics_replay.py)."""
    for index, program in enumerate(E.replay_programs(120)):
        kernel = E.build(program)
        a, b = E.inputs(program, torch.Generator().manual_seed(index))
        assert E.matches(on_triton(kernel)(a, b), E.references(program, a, b), program), program.source


# ---------------------------------------------------------------------------- targets

GEMM_TILES = dict(block_M=128, block_N=128, block_K=32)


def _compiled(kernel):
    compiled = kernel._codegen(kernel.plan_target)
    assert isinstance(compiled, TritonKernel)
    return compiled


@pytest.fixture(scope="module")
def examples_for():
    """target -> (GEMM, FlashAttention) JITKernels compiled by the triton.language backend."""
    built = {}

    def build(target):
        if target not in built:
            gemm = tritile.compile(K.gemm(512, 512, 512, 128, 128, 32, num_stages=3), target=target, backend="triton")
            attention = tritile.compile(FA.flashattn.fn(1, 2, 256, 256, 64, True, 128, 64, 2, 128), target=target,
                                        backend="triton")
            built[target] = gemm, attention
        return built[target]

    return build


@pytest.mark.parametrize("target", ["hip:gfx942", "hip:gfx950"])
def test_examples_compile_for_amd(target, examples_for):
    for kernel in examples_for(target):
        compiled = _compiled(kernel)
        amdgcn = compiled.asm["amdgcn"]
        assert f".amdgcn_target \"amdgcn-amd-amdhsa--{target[4:]}" in amdgcn
        assert amdgcn.count("v_mfma") >= 16, "a GEMM lowered without matrix cores"
        assert "ds_read" in amdgcn  # operands staged through LDS by Triton's stream pipeliner
        assert 0 < compiled.metadata.shared <= parse_target(target).shared_memory_limit
        assert compiled.metadata.num_warps == 2  # 128 threads in waves of 64


def test_examples_compile_for_sm80(examples_for):
    for kernel in examples_for("cuda:80"):
        ptx = _compiled(kernel).asm["ptx"]
        assert ".target sm_80" in ptx and "mma.sync" in ptx and "cp.async" in ptx
        assert "cp.async.bulk" not in ptx  # no TMA: masked loads, pipelined with cp.async


def test_examples_compile_for_sm90(examples_for):
    for kernel in examples_for("cuda:90"):
        ptx = _compiled(kernel).asm["ptx"]
        assert ".target sm_90a" in ptx and "wgmma.mma_async" in ptx
        assert "cp.async.bulk.tensor" in ptx  # tiles through TMA descriptors (tests/test_triton_tma.py)


def test_examples_compile_for_sm100(examples_for):
    for kernel in examples_for("cuda:100"):
        ptx = _compiled(kernel).asm["ptx"]
        assert "sm_100" in ptx and "tcgen05.mma" in ptx and "cp.async.bulk.tensor" in ptx


def test_three_warpgroup_kernel_runs_on_a_power_of_two_of_warps():
    """TileLang's 384-thread FlashAttention (three warpgroups of 64 rows) is a tile program on
    Triton, which takes only a power of two of warps: it compiles on 8."""
    kernel = tritile.compile(FA.flashattn.fn(1, 2, 384, 384, 64, False, 192, 128, 2, 384), target="cuda:90",
                             backend="triton")
    compiled = _compiled(kernel)
    assert compiled.metadata.num_warps == 8 and "wgmma.mma_async" in compiled.asm["ptx"]


def test_pipelined_loop_carries_its_stages():
    """`T.Pipelined(num_stages=S)` becomes `tl.range(..., num_stages=S)`, and Triton's pipeliner
    multi-buffers the loop's loads by it: shared memory grows by one (A, B) stage per stage
    (and, the loads being TMA descriptor loads on sm_90, by the stage's 8-byte mbarrier);
    a serial loop stays a plain `range`."""
    shared = {}
    for stages in (2, 3, 4):
        kernel = tritile.compile(K.gemm(512, 512, 512, 128, 128, 32, num_stages=stages), target="cuda:90",
                                 backend="triton")
        assert f"num_stages={stages})" in kernel.get_source("triton")
        shared[stages] = _compiled(kernel).metadata.shared
    stage_bytes = (128 * 32 + 32 * 128) * 2 + 8
    assert shared[3] - shared[2] == stage_bytes and shared[4] - shared[3] == stage_bytes
    serial = on_triton(scalar_control_flow(8, 32)).get_source("triton")
    assert "in range(0, 32)" in serial and "tl.range" not in serial


def test_inspection_stages_on_cpu():
    kernel = tritile.compile(K.gemm(128, 128, 128, 64, 64, 32), target="hip:gfx942")
    assert kernel.backend == "auto" and [b.name for b in kernel.backends] == ["triton"]
    assert "@triton.jit" in kernel.get_source("triton") and "tl.dot(" in kernel.get_source("triton")
    assert "tt.dot" in kernel.get_source("ttir")
    assert "#ttg.amd_mfma" in kernel.get_source("ttgir")
    assert "llvm.amdgcn" in kernel.get_source("llir")
    assert "v_mfma" in kernel.get_source("amdgcn")
    assert kernel.get_kernel_source() == kernel.get_source("triton")
    with pytest.raises(ValueError, match="'ptx' does not exist"):
        kernel.get_source("ptx")
    # the pass list stops where the triton.language backend starts; later stages on demand
    assert [name for name, _ in kernel.stages] == ["tile", "warp_group_serialization", "buffer_views", "flat_reshapes",
                                                 "accumulator_init"]
    assert "T.alloc_shared([2, 64, 32]" in kernel.get_source("buffer_versioning")
    with pytest.raises(ValueError, match="unknown stage 'sass'"):
        kernel.get_source("sass")


def test_interpreting_leaves_later_gluon_compiles_working(tmp_path):
    """Triton imports Gluon on its first interpreted launch, while triton.language's builtins are
    patched, and Gluon's language wraps those builtins at import: a Gluon compile after a
    process's first Triton-interpreted kernel failed ("Did you forget to add
    @triton.gluon.jit ?").  In a fresh process, Gluon not yet imported, with fresh caches."""
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    tests = Path(__file__).parent
    script = textwrap.dedent("""
        import sys
        import torch
        import kernels as K
        import tritile
        assert "triton.experimental.gluon.language" not in sys.modules
        torch.manual_seed(0)
        a, b = torch.randn(64, 64, dtype=torch.float16), torch.randn(64, 64, dtype=torch.float16)
        c = torch.empty(64, 64, dtype=torch.float16)
        tritile.compile(K.gemm(64, 64, 64, 32, 32, 32), backend="triton")(a, b, c)
        torch.testing.assert_close(c.float(), K.gemm_reference(a, b).float(), rtol=1e-2, atol=1e-2)
        ptx = tritile.compile(K.gemm(128, 128, 128, 64, 64, 32), backend="gluon").get_source("ptx")
        assert "wgmma.mma_async" in ptx
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)]),
           "TRITON_CACHE_DIR": str(tmp_path / "triton"), "TRITILE_CACHE_DIR": str(tmp_path / "tritile")}
    env.pop("TRITILE_BACKEND", None)
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


# ---------------------------------------------------------------------------- choosing a backend


def test_backend_table():
    assert [b.name for b in codegen.candidates("auto", Target("cuda", 90))] == ["gluon", "triton"]
    assert [b.name for b in codegen.candidates("auto", Target("hip", "gfx950"))] == ["triton"]
    assert [b.name for b in codegen.candidates("auto", Target("cuda", 100))] == ["triton"]  # tcgen05
    assert [b.name for b in codegen.candidates("gluon", Target("cuda", 100))] == ["gluon"]
    with pytest.raises(ValueError, match="does not compile for hip:gfx942"):
        codegen.candidates("gluon", Target("hip", "gfx942"))
    with pytest.raises(ValueError, match="unknown backend 'tvm'"):
        codegen.backend_name("tvm")


def test_backend_from_environment(monkeypatch):
    monkeypatch.setenv("TRITILE_BACKEND", "triton")
    kernel = tritile.compile(K.gemm(64, 64, 64, 32, 32, 32))
    assert kernel.backend == "triton" and kernel.stages[-1][0] == "accumulator_init"
    monkeypatch.setenv("TRITILE_BACKEND", "gluon")
    assert tritile.compile(K.gemm(64, 64, 64, 32, 32, 32), backend="triton").backend == "triton"  # argument wins
    assert tritile.compile(K.gemm(64, 64, 64, 32, 32, 32)).backend == "gluon"


def test_jit_backend_keyword(assert_close):
    @tritile.jit(out_idx=[-1], backend="triton")
    def scale(N):
        @T.prim_func
        def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
            with T.Kernel(T.ceildiv(N, 32), threads=32) as bx:
                for i in T.Parallel(32):
                    B[bx * 32 + i] = A[bx * 32 + i] * 3.0

        return main

    a = torch.randn(80)
    kernel = scale(80)
    assert kernel.backend == "triton"
    assert_close(kernel(a), a * 3)


def test_parallel_of_any_extent_three_ways(assert_close):
    """A T.Parallel over 24 x 40 lanes on global tensors: 32 x 64 lanes, those past the extents
    masked off."""

    @T.prim_func
    def shifted(A: T.Tensor((24, 40), "float32"), B: T.Tensor((24, 40), "float32")):
        with T.Kernel(1, threads=128) as _:
            for i, j in T.Parallel(24, 40):
                B[i, j] = A[i, j] * 2.0 + i

    kernel = tritile.compile(shifted, out_idx=[-1])
    a = torch.randn(24, 40)
    three_ways(kernel, (a,), a * 2 + torch.arange(24)[:, None], assert_close)
    assert "tl.arange(0, 64)" in on_triton(kernel).get_source("triton")


def test_program_no_backend_takes_names_each_refusal():
    def build():
        @T.prim_func
        def odd(A: T.Tensor((32,), "float32"), B: T.Tensor((32,), "float32")):
            with T.Kernel(1, threads=128) as _:
                tile = T.alloc_fragment((32,), "float32")
                bits = T.view(tile, dtype="int32")  # reinterpreting register bits: the interpreter's only
                T.copy(A, tile)
                for i in T.Parallel(32):
                    B[i] = T.Cast("float32", bits[i])

        return codegen.compile_kernel(tritile.compile(odd, target="cuda:90").stages, Target("cuda", 90),
                                      codegen.candidates("auto", Target("cuda", 90)))

    message = K.compile_error(build)
    assert "no backend compiles kernel 'odd' for cuda:90" in message
    assert "gluon:" in message and "triton:" in message
    # both refuse the on-chip view of another dtype, each at its line
    assert "T.view of fragment buffer tile as int32" in message and "by the Gluon backend" in message
    assert "by the triton.language backend" in message


def test_partial_register_tile_is_a_compile_error_at_the_users_line():
    def build():
        @T.prim_func
        def half_tile(A: T.Tensor((32, 32), "float16"), B: T.Tensor((32, 32), "float16")):
            with T.Kernel(1, threads=128) as _:
                S = T.alloc_shared((32, 32), "float16")
                T.clear(S)
                T.copy(A[0:16, 0:32], S[4:20, 0:32])  # a range of 16 rows that is no lane group of 16
                T.copy(S, B)

        return tritile.compile(half_tile, target="hip:gfx942").get_source("triton")

    message = K.compile_error(build)
    assert "a partial region S[16, 32] of shared buffer S" in message
    assert "a static range of dim 0 starts at a multiple of its extent padded to a power of two, not at 4" in message
    assert "not supported by the triton.language backend" in message
    assert "T.copy(A[0:16, 0:32], S[4:20, 0:32])" in message
