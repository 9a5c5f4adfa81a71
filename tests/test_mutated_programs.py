"""Mutated T programs (tests/mutated_programs.py): a kernel with one line changed either compiles
for sm_90 down to PTX or is a `tritile.CompileError` quoting that kernel's file and line - never
another exception, a Triton failure passed through, or a crash of the process; and where its
result is defined, the triton backend computes it as the interpreter does (on the CPU, through
Triton's interpreter; the GPU: bench/mutant_replay.py).

The mutants come from seeded lists (`TRITILE_HYPOTHESIS_SCALE` widens them).  The tests after
them are what the mutants found (bench/NOTES.md, session 27), each checked for its result where
the program is valid."""
import os
import re
import traceback

import pytest
import torch

import tritile
import tritile.language as T
from kernels import compile_error
from mutated_programs import BASES, DYNAMIC_BASES, FP8_BASES, LIBRARY_BASES, SCHEDULED_BASES, agree, interpreted, load, mutants, random_arguments
from pipeline_programs import mbarrier_problems

COUNT = 60 * max(1, int(os.environ.get("TRITILE_HYPOTHESIS_SCALE", "1")))


# (mutants, seeds of the two backends' compile lists, seed of the triton backend's comparison)
MUTANT_LISTS = {"first": (BASES, COUNT, {"gluon": 2027, "triton": 2028}, 2029),
                "scheduled": (SCHEDULED_BASES, COUNT // 2, {"gluon": 2037, "triton": 2038}, 2039),
                "library": (LIBRARY_BASES, COUNT // 2, {"gluon": 2047, "triton": 2048}, 2049),
                "dynamic": (DYNAMIC_BASES, COUNT // 2, {"gluon": 2057, "triton": 2058}, 2059),
                "fp8": (FP8_BASES, COUNT // 2, {"gluon": 2067, "triton": 2068}, 2069)}


@pytest.mark.parametrize("backend", ["gluon", "triton"])
@pytest.mark.parametrize("kind", sorted(MUTANT_LISTS))
def test_mutated_programs_compile_or_quote_their_line(kind, backend, tmp_path):
    bases, count, seeds, _ = MUTANT_LISTS[kind]
    problems = []
    for index, (base, src) in enumerate(mutants(seeds[backend], count, bases)):
        name = f"mutant_{backend}_{index}"
        path = tmp_path / f"{name}.py"
        make = load(src, str(path))
        if make is None:
            continue
        try:
            tritile.compile(make(), target="cuda:90", backend=backend).get_source("ptx")
        except tritile.CompileError as err:
            message = str(err)
            if f"{name}.py:" not in message or "failed to compile kernel" in message or "cannot lower" in message:
                problems.append(f"{base} -> {path}: {message[:400]}")
        except Exception as err:  # noqa: BLE001 - what the test is for
            if _raised_by_its_own_python(err, path):
                continue
            problems.append(f"{base} -> {path}: {type(err).__name__}: {err}"[:400])
    assert not problems, "\n".join(problems)


def _raised_by_its_own_python(err: Exception, path) -> bool:
    """Did the mutant's own Python raise `err` where it ran it - an annotation Python evaluates at
    the `def` (`T.A((256, 512), ...)`: no such attribute; `T.Kernel(...)`: tritile's message that
    it is called outside a kernel), not tritile compiling it?  A missing `T` name is raised by
    tritile.language's module `__getattr__` (which serves TVM's `T.int`, ...) called from that line."""
    frames = traceback.extract_tb(err.__traceback__)
    missing_name = isinstance(err, AttributeError) and frames[-1].name == "__getattr__" and len(frames) > 1
    by_its_line = frames[-2 if missing_name else -1].filename == str(path)
    return by_its_line or "can only be used inside a kernel compiled by tritile" in str(err)


@pytest.mark.parametrize("kind", sorted(MUTANT_LISTS))
def test_mutants_compute_on_the_triton_backend_what_they_compute_on_the_interpreter(kind, tmp_path):
    """Each mutant that both compile, where its result is defined (`interpreted`), on fresh
    random inputs: Triton's interpreter running the triton backend's code against tritile's."""
    bases, count, _, seed = MUTANT_LISTS[kind]
    problems, compared = [], 0
    for index, (base, src) in enumerate(mutants(seed, count, bases)):
        path = tmp_path / f"mutant_{index}.py"
        make = load(src, str(path))
        try:
            func = make()
            reference = tritile.compile(func, target="cpu", backend="auto")
            on_triton = tritile.compile(func, backend="triton")
        except Exception:  # noqa: BLE001 - not Python, or refused: the test above holds those
            continue
        args = random_arguments(reference.func, torch.Generator().manual_seed(index))
        try:
            undefined, expected = interpreted(reference, args)
        except (tritile.CompileError, ValueError, TypeError, RuntimeError):
            continue  # the interpreter refuses to run it (an out-of-range access it can name)
        if undefined:
            continue
        actual = [t.clone() for t in args]
        try:
            on_triton(*actual)  # the backend generates its code at the first call
        except tritile.CompileError:
            continue  # refused, with the mutant's line (the test above holds that)
        compared += 1
        wrong = [i for i, (x, y) in enumerate(zip(actual, expected)) if not agree(x, y)]
        if wrong:
            problems.append(f"{base} -> {path}: parameter {wrong[0]} differs")
    assert compared >= count // 4, f"only {compared} of {count} mutants compared"
    assert not problems, "\n".join(problems)


def test_integers_agree_but_for_a_few_elements_one_off():
    """An integer tensor stored from float sums may land one off where a backend added in another
    order; more than that, or in more than 1 % of the elements, is a difference."""
    expected = torch.randint(-1000, 1000, (64, 64), generator=torch.Generator().manual_seed(0)).int()
    few = expected.clone()
    few.view(-1)[::500] += 1
    assert agree(few, expected)
    many = expected.clone()
    many.view(-1)[::50] -= 1
    assert not agree(many, expected)
    two = expected.clone()
    two[3, 7] += 2
    assert not agree(two, expected)
    flags = torch.rand(64, generator=torch.Generator().manual_seed(1)) > 0.5
    flipped = flags.clone()
    flipped[5] = ~flipped[5]
    assert agree(flags, flags.clone()) and not agree(flipped, flags)


def _lanes_divided(selected: bool):
    @T.prim_func
    def kernel(A: T.Tensor((64,), T.int32), B: T.Tensor((64,), T.int32), C: T.Tensor((64,), T.int32)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(64):
                if selected:
                    C[i] = T.if_then_else(B[i] != 0, A[i] // B[i], 7)
                else:
                    C[i] = A[i] // B[i]

    return kernel


@pytest.mark.parametrize("selected", [False, True])
def test_a_result_of_lanes_divided_by_zero_is_undefined_unless_discarded(selected):
    """Seed 3111's mutant 24 on the H100 (an int8 `s / 256`: the literal takes int8, wraps to 0):
    a lane's quotient by zero is unspecified, so a result that depends on it is no reference."""
    kernel = tritile.compile(_lanes_divided(selected), target="cpu", backend="auto")
    a = torch.randint(-50, 50, (64,), generator=torch.Generator().manual_seed(3))
    b = torch.randint(-3, 3, (64,), generator=torch.Generator().manual_seed(4)).int()
    b[::4] = 0
    undefined, out = interpreted(kernel, [a.int(), b, torch.zeros(64, dtype=torch.int32)])
    assert undefined == (None if selected else "it divides integers by zero")
    if selected:
        expected = torch.where(b != 0, torch.div(a, torch.where(b != 0, b, 1), rounding_mode="floor"), 7)
        assert torch.equal(out[2], expected.int())


# ---------------------------------------------------------------------------- what they found


def _gemm(a_dtype, b_dtype, c_dtype):
    @T.prim_func
    def kernel(A: T.Tensor((64, 64), a_dtype), B: T.Tensor((64, 64), b_dtype), C: T.Tensor((64, 64), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            A_shared = T.alloc_shared((64, 64), a_dtype)
            B_shared = T.alloc_shared((64, 64), b_dtype)
            acc = T.alloc_fragment((64, 64), c_dtype)
            T.copy(A, A_shared)
            T.copy(B, B_shared)
            T.clear(acc)
            T.gemm(A_shared, B_shared, acc)
            T.copy(acc, C)

    return kernel


@pytest.mark.parametrize("backend", ["gluon", "triton"])
@pytest.mark.parametrize("operands, accumulator", [("float16", "bfloat16"), ("float16", "float64"),
                                                   ("float16", "int32"), ("bfloat16", "float16"),
                                                   ("float8_e4m3", "bfloat16"), ("int8", "int16")])
def test_a_gemm_accumulator_the_gpu_lacks_is_refused_at_its_line(backend, operands, accumulator):
    """Triton failed on these late (an MLIR pass) or aborted the process (float16 into float64 or
    int32): codegen/gemm_accumulators.py."""
    dtype, acc = getattr(T, operands), getattr(T, accumulator)
    message = compile_error(lambda: tritile.compile(_gemm(dtype, dtype, acc), out_idx=[-1], target="cuda:90",
                                                    backend=backend).get_source("ptx"))
    assert "T.gemm(A_shared, B_shared, acc)" in message and f"not {accumulator} (acc)" in message


@pytest.mark.parametrize("backend", ["gluon", "triton"])
@pytest.mark.parametrize("operands, accumulator", [("float16", "float16"), ("float8_e4m3", "float16"),
                                                   ("int8", "float32"), ("float32", "float64")])
def test_gemm_accumulators_the_gpu_takes_compile(backend, operands, accumulator):
    dtype, acc = getattr(T, operands), getattr(T, accumulator)
    assert ".target sm_90" in tritile.compile(_gemm(dtype, dtype, acc), out_idx=[-1], target="cuda:90",
                                              backend=backend).get_source("ptx")


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_a_gemm_of_two_operand_dtypes_computes_in_the_accumulators(backend, device):
    """int32 A, float16 B: the triton backend cast B to int32 and Triton refused an int32 tl.dot."""
    if backend == "triton" and device == "cuda":
        pytest.skip("the GPU suite runs the triton backend under TRITILE_BACKEND=triton")
    a = torch.randint(-8, 8, (64, 64), dtype=torch.int32)
    b = torch.randn(64, 64).half()
    kernel = tritile.compile(_gemm(T.int32, T.float16, T.float32), out_idx=[-1], backend=backend)
    torch.testing.assert_close(kernel(a.to(device), b.to(device)).cpu(), a.float() @ b.float(), rtol=1e-4, atol=1e-3)


def _bool_reduction(kind):
    @T.prim_func
    def kernel(X: T.Tensor((16, 64), T.bool), Y: T.Tensor((16,), T.bool)):
        with T.Kernel(1, threads=128) as bx:
            x = T.alloc_fragment((16, 64), T.bool)
            r = T.alloc_fragment((16,), T.bool)
            T.copy(X, x)
            if kind == "max":
                T.reduce_max(x, r, dim=1)
            elif kind == "min":
                T.reduce_min(x, r, dim=1)
            else:
                T.reduce_absmax(x, r, dim=1)
            T.copy(r, Y)

    return kernel


@pytest.mark.parametrize("backend", ["auto", "triton"])
@pytest.mark.parametrize("kind", ["max", "min", "absmax"])
def test_bool_reductions_are_any_and_all(kind, backend, device):
    """The pad lanes' identity had no bool (torch.iinfo raised inside both GPU backends), and the
    interpreter's absmax took torch's abs of bools."""
    if backend == "triton" and device == "cuda":
        pytest.skip("the GPU suite runs the triton backend under TRITILE_BACKEND=triton")
    x = torch.rand(16, 64) > 0.5
    x[0], x[1] = False, True
    kernel = tritile.compile(_bool_reduction(kind), out_idx=[-1], backend=backend)
    expected = x.all(1) if kind == "min" else x.any(1)
    assert torch.equal(kernel(x.to(device)).cpu(), expected)


def _float_sums_into(dtype):
    @T.prim_func
    def kernel(X: T.Tensor((16, 64), T.float32), Y: T.Tensor((16,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            x = T.alloc_fragment((16, 64), T.float32)
            total = T.alloc_fragment((16,), dtype)
            T.copy(X, x)
            T.fill(total, 1)
            T.reduce_sum(x, total, dim=1, clear=False)
            T.reduce_sum(x, total, dim=1, clear=False)
            for i in T.Parallel(16):
                Y[i] = total[i]

    return kernel


@pytest.mark.parametrize("backend", ["auto", "triton"])
@pytest.mark.parametrize("dtype", [T.bool, T.int32])
def test_a_float_sum_added_to_a_bool_or_int_destination_adds_in_float(dtype, backend, device):
    """Mutant 284 of the GPU replay (attention's row sum `l` a bool fragment): the old value and
    the float sum were added in the destination's type - an int1 `+` is an exclusive or, so two
    nonzero sums made it False and `acc /= l` gave inf; an int destination lost a negative
    fraction (1 + trunc(-0.5) against trunc(1 - 0.5))."""
    if backend == "triton" and device == "cuda":
        pytest.skip("the GPU suite runs the triton backend under TRITILE_BACKEND=triton")
    x = torch.randn(16, 64) / 8
    kernel = tritile.compile(_float_sums_into(dtype), out_idx=[-1], backend=backend)
    sums = x.sum(1)
    if dtype == T.bool:
        expected = (((1 + sums) != 0).float() + sums != 0).float()
    else:
        expected = ((1 + sums).trunc() + sums).trunc()
    torch.testing.assert_close(kernel(x.to(device)).cpu(), expected)
    # Triton's interpreter adds int1 as numpy adds bools (an or): only the GPU shows the xor
    gluon = tritile.compile(_float_sums_into(dtype), out_idx=[-1], target="cuda:90").get_source("gluon")
    assert "total.to(gl.float32) + " in gluon


def _first_column_shifted():
    @T.prim_func
    def kernel(X: T.Tensor((16, 64), T.float32), Y: T.Tensor((16, 64), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            x = T.alloc_fragment((16, 64), T.float32)
            m = T.alloc_fragment((16,), T.float32)
            T.copy(X, x)
            T.reduce_max(x, m, dim=1)
            for i, j in T.Parallel(16, 1):
                x[i, j] = x[i, j] - m[i]
            T.copy(x, Y)

    return kernel


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_a_unit_range_of_a_fragment_read_in_parallel_keeps_its_dim(backend, device):
    """Mutant 150 of seed 2051 (a softmax's `T.Parallel(16, 256)` made `(16, 1)`): the triton
    backend read `x[i, j]`'s one column as a [16] tile, which met `m[i]`'s [16, 1] as [16, 16]."""
    if backend == "triton" and device == "cuda":
        pytest.skip("the GPU suite runs the triton backend under TRITILE_BACKEND=triton")
    x = torch.randn(16, 64)
    expected = x.clone()
    expected[:, 0] -= x.max(1).values
    kernel = tritile.compile(_first_column_shifted(), out_idx=[-1], backend=backend)
    torch.testing.assert_close(kernel(x.to(device)).cpu(), expected)


def _first_sum_added():
    @T.prim_func
    def kernel(A: T.Tensor((32, 64), T.float32), S: T.Tensor((64,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            tile = T.alloc_fragment((32, 64), T.float32)
            col = T.alloc_fragment((64,), T.float32)
            T.copy(A, tile)
            T.reduce_sum(tile, col, dim=0)
            for j in T.Parallel(1):
                T.atomic_add(S[j], col[j])

    return kernel


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_one_element_of_a_fragment_read_in_a_unit_parallel(backend, device):
    """Mutant 1 of seed 2053 (the column sum's `T.Parallel(64)` made `(1)`): the range's one
    element is a scalar, which `tl.reshape` does not take."""
    if backend == "triton" and device == "cuda":
        pytest.skip("the GPU suite runs the triton backend under TRITILE_BACKEND=triton")
    a, s = torch.randn(32, 64), torch.randn(64)
    expected = s.clone()
    expected[0] += a[:, 0].sum()
    kernel = tritile.compile(_first_sum_added(), backend=backend)
    s_out = s.to(device)
    kernel(a.to(device), s_out)
    torch.testing.assert_close(s_out.cpu(), expected)


def _tile_of_a_tensor_added():
    @T.prim_func
    def kernel(D: T.Tensor((128, 128), T.float32), C: T.Tensor((128, 128), T.float32)):
        with T.Kernel(2, 2, threads=128) as (bx, by):
            T.atomic_add(C[by * 64, bx * 64], D[by * 64:by * 64 + 64, bx * 64:bx * 64 + 64])

    return kernel


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_a_tile_atomic_of_a_global_tile_adds_its_values(backend, device):
    """Mutant 110 of the scheduled kernels' seed 2070 (split-K's `T.atomic_add(C[...], C_local)`
    given a global tensor's region): the triton backend added the tensor's pointer as its value,
    a Triton error."""
    if backend == "triton" and device == "cuda":
        pytest.skip("the GPU suite runs the triton backend under TRITILE_BACKEND=triton")
    d, c = torch.randn(128, 128), torch.randn(128, 128)
    kernel = tritile.compile(_tile_of_a_tensor_added(), backend=backend)
    out = c.clone().to(device)
    kernel(d.to(device), out)
    torch.testing.assert_close(out.cpu(), c + d)


def test_a_float16_accumulator_through_a_max_with_a_literal_keeps_its_type(tmp_path, device):
    """Mutant 2 of the scheduled kernels' seed 2072 (the GEMM's accumulator made float16, its
    epilogue `T.max(C_local[i, j] + bias, 0)`): Triton's maximum of that float16 tile and a
    literal was float32, which Gluon refused to store into the float16 shared tile."""
    src = SCHEDULED_BASES["gemm_epilogue"].replace("C_local = T.alloc_fragment((128, 128), T.float32)",
                                                   "C_local = T.alloc_fragment((128, 128), T.float16)")
    _computes_as_the_interpreter(load(src, str(tmp_path / "float16_accumulator.py")), 2, 3, device)


def _computes_as_the_interpreter(make, seed: int, output: int, device: str) -> None:
    """The kernel of `make` compiles for sm_90 on the Gluon backend, its result on fresh random
    inputs (`seed`) is defined, and parameter `output` after a run on `device` is the
    interpreter's."""
    assert ".entry" in tritile.compile(make(), target="cuda:90", backend="gluon").get_source("ptx")
    reference = tritile.compile(make(), target="cpu", backend="auto")
    args = random_arguments(reference.func, torch.Generator().manual_seed(seed))
    undefined, expected = interpreted(reference, args)
    assert undefined is None
    actual = [t.to(device) for t in args]
    tritile.compile(make())(*actual)
    assert agree(actual[output], expected[output])


def test_one_element_converted_to_fp8_compiles_and_rounds(tmp_path, device):
    """Mutant 165 of the library kernels' seed 3001 (decoding's combine with its (1,) weight sum
    made float8_e4m3): the Gluon backend's packed fp8 conversion needs four elements, and Triton
    refused the one-element tensor and the scalar of its max at parse time."""
    src = LIBRARY_BASES["decode_combine"].replace("weight_sum = T.alloc_fragment((1,), T.float32)",
                                                  "weight_sum = T.alloc_fragment((1,), T.float8_e4m3)")
    _computes_as_the_interpreter(load(src, str(tmp_path / "fp8_weight_sum.py")), 165, 2, device)


def test_stages_past_the_trip_count_are_capped_on_the_triton_backend(tmp_path):
    """Mutant 66 of the library kernels' seed 3006 (the backward's `num_stages=4096` over four
    query blocks): Triton's pipeliner was still working on it after minutes; the triton backend
    asks for the loop's trip count at most, as the Gluon backend's planner plans."""
    src = LIBRARY_BASES["attention_bwd"].replace("num_stages=2", "num_stages=4096")
    make = load(src, str(tmp_path / "stages_4096.py"))
    kernel = tritile.compile(make(), target="cuda:90", backend="triton")
    assert "num_stages=4)" in kernel.get_source("triton") and ".entry" in kernel.get_source("ptx")


@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_stages_shared_memory_cannot_hold_are_refused_at_the_loop(backend, tmp_path):
    """The same stages over a runtime trip count: the passes took two minutes to reach the
    shared memory budget's error; the planner now refuses at once what no shared memory holds."""
    src = DYNAMIC_BASES["gemm_dynamic"].replace("num_stages=3", "num_stages=4096")
    make = load(src, str(tmp_path / "runtime_trips_4096.py"))
    with pytest.raises(tritile.CompileError) as info:
        tritile.compile(make(), target="cuda:90", backend=backend).get_source("ptx")
    message = str(info.value)
    assert "runtime_trips_4096.py:14" in message and "4095 copies of the shared tiles it loads (A_shared 8192 B, B_shared 4096 B)" in message
    assert "T.Pipelined(T.ceildiv(K, 32), num_stages=4096)" in message


@pytest.mark.parametrize("backend", ["gluon", "cpu"])
def test_two_copies_of_one_iteration_into_one_tile_are_refused_when_pipelined(backend, tmp_path):
    """Mutant 54 of the runtime-dim kernels' seed 3100 (B's tile copied into A_shared after A's):
    pipelined, both became async copies in flight at once, landing in either order - the
    interpreter's hazard check stopped it, the Gluon kernel would have raced.  Refused at the
    loop; the triton backend, whose loads are values in program order, computes it."""
    src = DYNAMIC_BASES["gemm_dynamic"].replace("T.copy(B[k * 32, bx * 64], B_shared)",
                                                "T.copy(B[k * 32, bx * 64], A_shared)")
    make = load(src, str(tmp_path / "two_copies.py"))
    target = "cpu" if backend == "cpu" else "cuda:90"
    with pytest.raises(tritile.CompileError) as info:
        tritile.compile(make(), target=target, backend="auto" if backend == "cpu" else backend).get_source("tile")
    message = str(info.value)
    assert "two_copies.py:14" in message and "both copy into A_shared in one iteration" in message
    assert "(Copy at line 15) and 1 (Copy at line 16)" in message


def _rows_summed(rows: int):
    @T.prim_func
    def kernel(A: T.Tensor((rows, 64), T.float32), S: T.Tensor((64,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            acc = T.alloc_fragment((64,), T.float32)
            T.clear(acc)
            for r in T.unroll(rows):
                for i in T.Parallel(64):
                    acc[i] += A[r, i]
            T.copy(acc, S)

    return kernel


@pytest.mark.parametrize("rows", [8, 300])
def test_a_long_unrolled_loop_stays_a_loop(rows, device):
    """Mutant 214 of the library kernels' seed 3012 (decoding's combine unrolled 4096 times):
    the Gluon compile ran for minutes; past 256 trips `T.unroll` is emitted as a loop."""
    for backend in ("gluon", "triton"):
        kernel = tritile.compile(_rows_summed(rows), target="cuda:90", backend=backend)
        unrolled = "static_range(0, 8" in kernel.get_source(backend)
        assert unrolled == (rows == 8) and (f"in range(0, {rows})" in kernel.get_source(backend)) == (rows == 300)
    a = torch.randn(rows, 64)
    for backend in ("auto", "triton") if device == "cpu" else ("auto",):
        out = torch.zeros(64, device=device)
        tritile.compile(_rows_summed(rows), backend=backend)(a.to(device), out)
        torch.testing.assert_close(out.cpu(), a.sum(0), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("divisor, wrapped", [("(k + 1) % 0", ""), ("(k + 1) // 256", ""),
                                              ("T.int8(k) % 256", " (256 as int8 is 0)")])
def test_a_constant_zero_divisor_is_refused_at_its_line(divisor, wrapped, tmp_path):
    """Mutant 16 of the FP8 kernels' seed 3200 (the promotion's `(k + 1) % 2` made `% 0`): Triton's
    LLVM lowering failed on both backends; and seed 3111's #24 divided an int8 by 256, a literal
    that takes int8 and wraps to 0.  A quotient by the constant 0 is unspecified in every lane."""
    src = FP8_BASES["gemm_fp8"].replace("(k + 1) % 2", divisor)
    if not wrapped and "256" in divisor:  # an int32 `// 256` is a plain division
        assert ".entry" in tritile.compile(load(src, str(tmp_path / "by_256.py"))(), target="cuda:90",
                                           backend="gluon").get_source("ptx")
        return
    with pytest.raises(tritile.CompileError) as info:
        load(src, str(tmp_path / "by_zero.py"))()
    message = str(info.value)
    assert "by_zero.py:20: integer division by zero" in message and message.split("\n")[0].endswith(wrapped or "% 0")


@pytest.mark.parametrize("panel_size", [0, -1])
def test_a_panel_of_no_rows_is_refused_at_its_line(panel_size, tmp_path):
    """Mutant 69 of the FP8 kernels' seed 3200 (`T.use_swizzle(panel_size=-1)`): the triton
    backend computed another tile order than the interpreter - the result differed."""
    src = FP8_BASES["gemm_fp8"].replace("panel_size=2", f"panel_size={panel_size}")
    with pytest.raises(tritile.CompileError) as info:
        load(src, str(tmp_path / "panel.py"))()
    assert f"panel.py:13: T.use_swizzle panel_size must be at least 1, got {panel_size}" in str(info.value)


def _bool_tile():
    @T.prim_func
    def kernel(A: T.Tensor((32, 32), T.float16), B: T.Tensor((32, 32), T.float16)):
        with T.Kernel(1, threads=128) as bx:
            positive = T.alloc_shared((32, 32), T.bool)
            out = T.alloc_fragment((32, 32), T.float16)
            for i, j in T.Parallel(32, 32):
                positive[i, j] = A[i, j] > 0
            for i, j in T.Parallel(32, 32):
                out[i, j] = T.if_then_else(positive[j, i], A[i, j], -A[i, j])
            T.copy(out, B)

    return kernel


def test_a_bool_shared_buffer_is_refused_by_gluon_and_runs_on_triton(device):
    """Triton 3.6 fails on (or aborts at) tiles of an i1 shared buffer in Gluon; auto takes the triton
    backend (single elements of one, TileLang's any_of test, stay with Gluon)."""
    message = compile_error(lambda: tritile.compile(_bool_tile(), out_idx=[-1], target="cuda:90",
                                                    backend="gluon").get_source("ptx"))
    assert "a tile of bool shared buffer positive" in message
    tritile.compile(_bool_tile(), out_idx=[-1], target="cuda:90").get_source("ptx")  # auto: triton
    a = torch.randn(32, 32).half()
    expected = torch.where(a.t() > 0, a, -a)
    for backend in ("auto", "triton") if device == "cpu" else ("auto",):
        assert torch.equal(tritile.compile(_bool_tile(), out_idx=[-1], backend=backend)(a.to(device)).cpu(), expected)


def _positive_tile(through_shared: bool):
    @T.prim_func
    def kernel(A: T.Tensor((128, 64), T.float32), B: T.Tensor((128, 64), T.bool)):
        with T.Kernel(2, threads=128) as bx:
            tile = T.alloc_fragment((64, 64), T.float32)
            staged = T.alloc_shared((64, 64), T.float32)
            T.copy(A[bx * 64, 0], tile)
            if through_shared:
                T.copy(tile, staged)
                T.copy(staged, B[bx * 64, 0])
            else:
                T.copy(tile, B[bx * 64, 0])

    return kernel


@pytest.mark.parametrize("through_shared", [False, True])
def test_a_tile_stored_into_a_bool_tensor_takes_no_tma_descriptor(through_shared, device):
    """Mutant 45 of the library kernels' seed 3001 (the attention backward's dV made bool): a TMA
    store of the tile aborted the process in Triton (a descriptor of i1 elements); the tile is
    stored element by element, each nonzero value true."""
    for backend in ("gluon", "triton"):
        source = tritile.compile(_positive_tile(through_shared), target="cuda:90", backend=backend)
        assert ".entry" in source.get_source("ptx") and "tensormap" not in source.get_source("ptx")
    a = torch.randn(128, 64)
    a[::3] = 0.0
    for backend in ("auto", "triton"):
        out = torch.zeros(128, 64, dtype=torch.bool, device=device)
        tritile.compile(_positive_tile(through_shared), backend=backend)(a.to(device), out)
        assert torch.equal(out.cpu(), a != 0)


def _negated_infinity_fill():
    @T.prim_func
    def kernel(A: T.Tensor((64,), T.float32), B: T.Tensor((64,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            m = T.alloc_fragment((64,), T.float32)
            T.fill(m, -T.infinity(T.float16))
            for i in T.Parallel(64):
                B[i] = T.max(m[i], A[i])

    return kernel


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_a_negated_infinity_of_another_dtype_fills(backend, device):
    """The negation of a literal was `(float("inf") * -1.0)`, which the fill's cast then called
    `.to` on: a Python float has none (both GPU backends)."""
    if backend == "triton" and device == "cuda":
        pytest.skip("the GPU suite runs the triton backend under TRITILE_BACKEND=triton")
    a = torch.randn(64)
    a[::7] = float("-inf")
    assert torch.equal(tritile.compile(_negated_infinity_fill(), out_idx=[-1], backend=backend)(a.to(device)).cpu(), a)


def test_infinity_of_an_integer_type_is_a_compile_error():
    def build():
        @T.prim_func
        def kernel(A: T.Tensor((64,), T.int32)):
            with T.Kernel(1, threads=128) as bx:
                T.fill(A, T.infinity(T.int32))

    assert "T.infinity takes a float dtype, not int32" in compile_error(build)


def test_t_tensor_as_a_loop_range_is_a_compile_error():
    def build():
        @T.prim_func
        def kernel(A: T.Tensor((32, 32), T.float16)):
            with T.Kernel(1, threads=128) as bx:
                for i, j in T.Tensor(32, 32):
                    A[i, j] = 0

    assert "for i, j in T.Tensor(32, 32):" in compile_error(build)


def _shifted_rows(through_shared: bool):
    """Each block copies the 32 rows starting 16 before its own: the first block's tile starts
    at row -16."""

    @T.prim_func
    def kernel(A: T.Tensor((128, 64), T.float32), B: T.Tensor((128, 64), T.float32)):
        with T.Kernel(4, threads=128) as bx:
            tile = T.alloc_fragment((32, 64), T.float32)
            if through_shared:
                staged = T.alloc_shared((32, 64), T.float32)
                T.copy(A[bx * 32 - 16, 0], staged)
                T.copy(staged, tile)
            else:
                T.copy(A[bx * 32 - 16, 0], tile)
            T.copy(tile, B[bx * 32, 0])

    return kernel


@pytest.mark.parametrize("backend", ["auto", "triton"])
@pytest.mark.parametrize("through_shared", [False, True])
def test_a_tile_starting_before_the_tensor_reads_zeros_there(backend, through_shared, device):
    """diff_42_290 of the mutant replay (`bx * -1` as a column start): the GPU copies' masks
    tested only the upper bounds, so lanes before the tensor read whatever lay there."""
    if backend == "triton" and device == "cuda":
        pytest.skip("the GPU suite runs the triton backend under TRITILE_BACKEND=triton")
    a = torch.randn(128, 64)
    shifted = torch.cat([torch.zeros(16, 64), a[:-16]])
    kernel = tritile.compile(_shifted_rows(through_shared), out_idx=[-1], backend=backend)
    assert torch.equal(kernel(a.to(device)).cpu(), shifted)
    # sm_80 has no TMA (which zero-fills by itself): every copy there takes the masked loads
    name = "gluon" if backend == "auto" else "triton"
    on_sm80 = tritile.compile(_shifted_rows(through_shared), out_idx=[-1], target="cuda:80", backend=name)
    assert ".target sm_80" in on_sm80.get_source("ptx") and ">= 0)" in on_sm80.get_source(name)


def _stored_before_the_tensor(through_shared):
    @T.prim_func
    def kernel(X: T.Tensor((128, 64), T.float32), Y: T.Tensor((128, 64), T.float32)):
        with T.Kernel(8, threads=128) as bx:
            if through_shared:
                tile = T.alloc_shared((16, 64), T.float32)
            else:
                tile = T.alloc_fragment((16, 64), T.float32)
            T.copy(X[bx * 16, 0], tile)
            T.copy(tile, Y[bx * 16 - 8, 0])

    return kernel


@pytest.mark.parametrize("backend", ["auto", "triton"])
@pytest.mark.parametrize("through_shared", [False, True])
def test_a_tile_stored_from_before_the_tensor_drops_those_rows(backend, through_shared, device):
    """Mutant 177 of the triton backend's GPU replay (seed 2031: a softmax storing its rows at
    `Y[bx * -1, 0]`): a TMA store from a start before the tensor stopped the H100 with "an
    illegal instruction was encountered", on both backends, from registers and from shared
    memory.  Such stores take the masked path; the rows before the tensor are dropped."""
    if backend == "triton" and device == "cuda":
        pytest.skip("the GPU suite runs the triton backend under TRITILE_BACKEND=triton")
    x, y = torch.randn(128, 64), torch.randn(128, 64)
    expected = y.clone()
    expected[:120] = x[8:]  # block b's rows at 16 b - 8: block 0's first 8 before the tensor
    kernel = tritile.compile(_stored_before_the_tensor(through_shared), backend=backend)
    out = y.to(device)
    kernel(x.to(device), out)
    assert torch.equal(out.cpu(), expected)
    name = "gluon" if backend == "auto" else "triton"
    source = tritile.compile(_stored_before_the_tensor(through_shared), target="cuda:90",
                             backend=name).get_source(name)
    assert "async_copy_shared_to_global(Y_desc" not in source and "Y_desc.store" not in source


def test_a_tma_copy_needs_a_start_aligned_to_16_bytes(tmp_path, device):
    """Mutant 53 of bench/mutant_replay.py's seed 2030, the GEMM's A tile from column k * 3 (6 bytes
    into an fp16 row): as a TMA load it stopped the H100 with "an illegal instruction was
    encountered".  Its A tiles load through the registers now, while B's stay TMA loads in the same
    ring (every commit group keeps a TMA copy: `rings._every_group_has_tma`)."""
    make = load(BASES["gemm"].replace("T.copy(A[by * 128, k * 32]", "T.copy(A[by * 128, k * 3]"),
                str(tmp_path / "shifted_columns.py"))
    a, b = torch.randn(256, 128).half(), torch.randn(128, 192).half()
    expected = sum(a[:, 3 * k:3 * k + 32].float() @ b[32 * k:32 * k + 32].float() for k in range(4))
    torch.testing.assert_close(tritile.compile(make(), out_idx=[-1])(a.to(device), b.to(device)).float().cpu(), expected,
                               rtol=1e-2, atol=5e-2)
    source = tritile.compile(make(), out_idx=[-1], target="cuda:90").get_source("gluon")
    assert "(A_desc, [(by * 128), (k_t * 3)]" not in source and "async_copy_global_to_shared(B_desc" in source


# the attention base's loop over K / V blocks with its trip count a runtime scalar
_RUNTIME_TRIPS = {"T.Pipelined(T.ceildiv(128, 64)": "T.Pipelined(n",
                  "O: T.Tensor((1, 2, 128, 64), T.float16)):": "O: T.Tensor((1, 2, 128, 64), T.float16), n: T.int32):"}
# how each program's K / V loop leaves its 128-row head: (the base's lines replaced, its scalar
# arguments, the environment it compiles in, the row starts of the copies that leave the head as
# the rows view's coordinates would read them)
OVERRUNS = {
    # mutant 583 of seed 2030: 19 blocks of 64 rows; on the H100 its replay hung
    "ceildiv(128, 7) blocks": ({"T.Pipelined(T.ceildiv(128, 64)": "T.Pipelined(T.ceildiv(128, 7)"}, [], {},
                               ["(k_t * 64)", "1152"]),
    # the same 19 blocks, their count known at run time only
    "runtime trip count": (_RUNTIME_TRIPS, [19], {}, ["(k_t * 64)"]),
    "runtime trip count, producer warp": (_RUNTIME_TRIPS, [19], {"TRITILE_WARP_SPECIALIZE": "1"}, ["(g * 64)"]),
    # the first block starts 64 rows before its head
    "a block before the head": ({"T.Pipelined(T.ceildiv(128, 64)": "T.Pipelined(3",
                                 "[bz, by, k * 64:(k + 1) * 64, :]": "[bz, by, (k - 1) * 64:k * 64, :]"}, [], {},
                                ["-64"]),
}


def _overrunning(overrun: str, tmp_path, monkeypatch):
    """(the program's `make`, its scalar arguments) of `OVERRUNS[overrun]`, its environment set."""
    replaced, scalars, environment, _ = OVERRUNS[overrun]
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    src = BASES["attention"]
    for old, new in replaced.items():
        assert old in src
        src = src.replace(old, new)
    return load(src, str(tmp_path / "overrun.py")), scalars


@pytest.mark.parametrize("backend", ["auto", "triton"])
@pytest.mark.parametrize("overrun", list(OVERRUNS))
def test_a_loop_leaving_its_head_reads_zeros_past_it(overrun, backend, device, tmp_path, monkeypatch):
    """Mutant 583 (attention over `T.ceildiv(128, 7)` K blocks of a 128-row head) and its kin on
    fresh random inputs: the interpreter reads zeros past the head's rows, and so must the GPU
    (the H100 read the next head's rows through TMA's rows view, or hung) and Triton's
    interpreter of the triton backend's full-rank descriptors."""
    if backend == "triton" and device == "cuda":
        pytest.skip("the GPU suite runs the triton backend under TRITILE_BACKEND=triton")
    make, scalars = _overrunning(overrun, tmp_path, monkeypatch)
    reference = tritile.compile(make(), target="cpu", backend="auto")
    tensors = random_arguments(reference.func, torch.Generator().manual_seed(583))
    undefined, expected = interpreted(reference, tensors + scalars)
    assert undefined is None
    actual = [t.to(device) for t in tensors] + scalars
    tritile.compile(make(), backend=backend)(*actual)
    assert agree(actual[3], expected[3])


@pytest.mark.parametrize("overrun", list(OVERRUNS))
def test_a_copy_leaving_its_head_takes_no_rows_view(overrun, tmp_path, monkeypatch):
    """The sm_90 Gluon of those programs: a TMA copy through the [B*H*S, D] rows view is clipped
    only at the view's end, so `tma_rows_view` proved that a block never straddles two heads but
    not that it stays inside its own.  A rows-view tile now needs bounds keeping every index but
    the last inside the tensor (`codegen/signs.py`; a pipelined copy's iteration below its trip
    count), else it takes a descriptor of the tensor's full rank, which clips every dim.  The
    replay's hang was mutant 583's epilogue at the replayed commit: V of iteration 18 (rows
    1152..1215) took cp.async in a ring whose barriers only TMA copies arm, a wait nothing
    completes (95fdaab's `rings._every_group_has_tma` fixed that since); the host replay of
    each module's mbarrier protocol holds it."""
    from pipeline_programs import mbarrier_problems

    make, scalars = _overrunning(overrun, tmp_path, monkeypatch)
    kernel = tritile.compile(make(), target="cuda:90")
    source = kernel.get_source("gluon")
    rows_view_starts = re.findall(r"async_copy_global_to_shared\([KV]_desc\w*, \[\(\(bz\) \* 2 \+ by\) \* 128 \+ (.*?), 0\]",
                                  source)
    assert not set(OVERRUNS[overrun][-1]) & set(rows_view_starts)
    tensors = random_arguments(kernel.func, torch.Generator().manual_seed(583))
    assert mbarrier_problems(source, tensors, scalars) == []


@pytest.mark.parametrize("threads", [128, 256])
def test_loads_nothing_consumes_are_waited_for_after_their_loop(threads, tmp_path, device):
    """Mutant 139 of bench/mutant_replay.py's seed 2030, the GEMM with its `T.gemm` line removed:
    the H100 stored values up to 7.2 into C, which is 0.  Nothing consumes the loads, so the
    one-stage loop waits for a group only before the next refills its tiles, and the Gluon ring
    dropped the drain after the loop (pipeline injection's `WaitGroup(0)`, "no TMA group can be
    in flight here"): the last group's TMA loads could still be writing A_shared / B_shared when
    their barrier was invalidated and the epilogue's TMA-store staging tile took their bytes
    (Triton places buffers by liveness).  With a producer warp (256 threads: warp specialized,
    persistent) the consumers released the last group's slot before it landed - the host replay
    deadlocks there - and no partition waited for it before the kernel exited."""
    src = BASES["gemm"].replace("T.gemm(A_shared, B_shared, C_local)", "pass")
    make = load(src.replace("threads=128", f"threads={threads}"), str(tmp_path / f"unconsumed_loads_{threads}.py"))
    reference = tritile.compile(make(), target="cpu", backend="auto")
    args = random_arguments(reference.func, torch.Generator().manual_seed(139))
    undefined, expected = interpreted(reference, args)
    assert undefined is None and not expected[2].any()
    actual = [t.to(device) for t in args]
    tritile.compile(make())(*actual)
    assert agree(actual[2], expected[2])
    source = tritile.compile(make(), target="cuda:90", backend="gluon").get_source("gluon")
    assert "no TMA group can be in flight here" not in source
    if threads == 128:  # group 3 (slot 0, its fourth phase) waited for before the staging tile's bytes
        drain = source.index("\n    mbarrier.wait(k_t_bars.index(0), 1)\n")
        assert drain < source.index("mbarrier.invalidate(k_t_bars") < source.index("_store_tile0 = gl.allocate_shared_memory")
    assert mbarrier_problems(source, args) == []


def test_a_pipelined_cuda_core_gemm_is_emitted_once(tmp_path, device):
    """FP8 seed 3330 #103 (the FP8 base with B_shared made bfloat16: an fp8 x bfloat16 gemm, which
    only CUDA cores take): the 3-stage loop's epilogue repeated the 128x128x128 FMA dot twice
    after the loop - 24576 multiply-adds a thread in one function - and the Gluon compile took
    55-70 s on the CPU (LLVM and ptxas).  Its epilogue now runs as more steps of the loop, as a
    warp-specialized kernel's does (consumer_loop_folding): one dot, 8 s."""
    src = FP8_BASES["gemm_fp8"].replace("B_shared = T.alloc_shared((128, 128), T.float8_e4m3)",
                                        "B_shared = T.alloc_shared((128, 128), T.bfloat16)")
    make = load(src, str(tmp_path / "cuda_core_gemm.py"))
    kernel = tritile.compile(make(), target="cuda:90", backend="gluon")
    assert "epilogue folded in" in kernel.get_source("consumer_loop_folding")
    source = kernel.get_source("gluon")
    assert source.count("gl.dot_fma(") == 1
    args = random_arguments(kernel.func, torch.Generator().manual_seed(103))
    assert mbarrier_problems(source, args) == []
    a, b, scales, _ = args
    expected = (a.float() @ b.float().T) * (scales[0] * scales[1])
    actual = [t.to(device) for t in args]
    tritile.compile(make())(*actual)
    torch.testing.assert_close(actual[3].cpu().float(), expected, rtol=1e-2, atol=1e-2 * float(expected.abs().max()))


def test_a_small_cuda_core_gemm_keeps_its_unrolled_epilogue():
    """The fold of large CUDA-core gemms leaves the library's float32 64x64x32 tiles as they were
    (2^17 multiply-adds: their epilogue's slot indices stay constants, no guard in the loop)."""
    from kernels import matmul

    kernel = tritile.compile(matmul(128, 128, 128, 64, 64, 32, False, False, "float32", "float32", "float32", 2)
                             .stages[0][1], target="cuda:90", backend="gluon")
    assert "epilogue folded in" not in kernel.get_source("consumer_loop_folding")
    assert kernel.get_source("gluon").count("gl.dot_fma(") == 2  # the loop's and the epilogue's
