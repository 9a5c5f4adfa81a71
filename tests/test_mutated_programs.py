"""Mutated T programs: a kernel with one line changed (a number, a buffer, a dtype, a flag, two
arguments swapped, the line removed) either compiles for sm_90 down to PTX or is a
`tritile.CompileError` quoting that kernel's file and line - never another exception, a
Triton failure passed through, or a crash of the process.

The mutants are drawn from a seeded list (`TRITILE_HYPOTHESIS_SCALE` widens it) of five base
kernels: a pipelined GEMM, a row softmax, a transposing copy, a FlashAttention loop and a column
sum by atomics.  The tests after them are what the mutants found (bench/NOTES.md, session 27),
each checked for its result where the program is valid."""
import importlib.util
import os
import random
import re

import pytest
import torch

import tritile
import tritile.language as T
from kernels import compile_error

BASES = {
    "gemm": '''
import tritile.language as T

def make():
    @T.prim_func
    def kernel(A: T.Tensor((256, 128), T.float16), B: T.Tensor((128, 192), T.float16), C: T.Tensor((256, 192), T.float16)):
        with T.Kernel(T.ceildiv(192, 64), T.ceildiv(256, 128), threads=128) as (bx, by):
            A_shared = T.alloc_shared((128, 32), T.float16)
            B_shared = T.alloc_shared((32, 64), T.float16)
            C_local = T.alloc_fragment((128, 64), T.float32)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(128, 32), num_stages=3):
                T.copy(A[by * 128, k * 32], A_shared)
                T.copy(B[k * 32, bx * 64], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * 128, bx * 64])
    return kernel
''',
    "softmax": '''
import tritile.language as T

def make():
    @T.prim_func
    def kernel(X: T.Tensor((128, 256), T.float32), Y: T.Tensor((128, 256), T.float32)):
        with T.Kernel(T.ceildiv(128, 16), threads=128) as bx:
            x = T.alloc_fragment((16, 256), T.float32)
            m = T.alloc_fragment((16,), T.float32)
            s = T.alloc_fragment((16,), T.float32)
            T.copy(X[bx * 16, 0], x)
            T.reduce_max(x, m, dim=1)
            for i, j in T.Parallel(16, 256):
                x[i, j] = T.exp(x[i, j] - m[i])
            T.reduce_sum(x, s, dim=1)
            for i, j in T.Parallel(16, 256):
                x[i, j] = x[i, j] / s[i]
            T.copy(x, Y[bx * 16, 0])
    return kernel
''',
    "transpose": '''
import tritile.language as T

def make():
    @T.prim_func
    def kernel(A: T.Tensor((64, 96), T.float16), B: T.Tensor((96, 64), T.float16)):
        with T.Kernel(T.ceildiv(96, 32), T.ceildiv(64, 32), threads=128) as (bx, by):
            tile = T.alloc_shared((32, 32), T.float16)
            out = T.alloc_fragment((32, 32), T.float16)
            T.copy(A[by * 32, bx * 32], tile)
            for i, j in T.Parallel(32, 32):
                out[i, j] = tile[j, i] * 2
            T.copy(out, B[bx * 32, by * 32])
    return kernel
''',
    "attention": '''
import tritile.language as T

def make():
    @T.prim_func
    def kernel(Q: T.Tensor((1, 2, 128, 64), T.float16), K: T.Tensor((1, 2, 128, 64), T.float16),
               V: T.Tensor((1, 2, 128, 64), T.float16), O: T.Tensor((1, 2, 128, 64), T.float16)):
        with T.Kernel(T.ceildiv(128, 64), 2, 1, threads=128) as (bx, by, bz):
            Q_shared = T.alloc_shared((64, 64), T.float16)
            K_shared = T.alloc_shared((64, 64), T.float16)
            V_shared = T.alloc_shared((64, 64), T.float16)
            S = T.alloc_fragment((64, 64), T.float32)
            P = T.alloc_fragment((64, 64), T.float16)
            acc = T.alloc_fragment((64, 64), T.float32)
            m = T.alloc_fragment((64,), T.float32)
            m_prev = T.alloc_fragment((64,), T.float32)
            l = T.alloc_fragment((64,), T.float32)
            rs = T.alloc_fragment((64,), T.float32)
            T.copy(Q[bz, by, bx * 64:(bx + 1) * 64, :], Q_shared)
            T.fill(acc, 0)
            T.fill(l, 0)
            T.fill(m, -T.infinity(T.float32))
            for k in T.Pipelined(T.ceildiv(128, 64), num_stages=2):
                T.copy(K[bz, by, k * 64:(k + 1) * 64, :], K_shared)
                T.clear(S)
                T.gemm(Q_shared, K_shared, S, transpose_B=True)
                T.copy(m, m_prev)
                T.reduce_max(S, m, dim=1, clear=False)
                for i, j in T.Parallel(64, 64):
                    S[i, j] = T.exp2(S[i, j] * 0.18 - m[i] * 0.18)
                for i in T.Parallel(64):
                    rs[i] = T.exp2(m_prev[i] * 0.18 - m[i] * 0.18)
                for i, j in T.Parallel(64, 64):
                    acc[i, j] *= rs[i]
                T.reduce_sum(S, l, dim=1, clear=False)
                T.copy(S, P)
                T.copy(V[bz, by, k * 64:(k + 1) * 64, :], V_shared)
                T.gemm(P, V_shared, acc)
            for i, j in T.Parallel(64, 64):
                acc[i, j] /= l[i]
            T.copy(acc, O[bz, by, bx * 64:(bx + 1) * 64, :])
    return kernel
''',
    "column_sum": '''
import tritile.language as T

def make():
    @T.prim_func
    def kernel(A: T.Tensor((256, 64), T.float32), S: T.Tensor((64,), T.float32)):
        with T.Kernel(T.ceildiv(256, 32), threads=128) as bx:
            tile = T.alloc_fragment((32, 64), T.float32)
            col = T.alloc_fragment((64,), T.float32)
            T.copy(A[bx * 32, 0], tile)
            T.reduce_sum(tile, col, dim=0)
            for j in T.Parallel(64):
                T.atomic_add(S[j], col[j])
    return kernel
''',
}
DTYPES = ["T.float16", "T.float32", "T.bfloat16", "T.int8", "T.int32", "T.float8_e4m3", "T.float64", "T.bool"]
NUMBERS = ["0", "1", "2", "3", "7", "16", "17", "33", "48", "100", "1000", "-1", "-16", "4096"]
MUTATIONS = ["number", "number", "name", "name", "dtype", "delete", "swap", "flag"]


def mutate(src: str, rng: random.Random):
    """`src` with one line of its kernel body changed, or None where the drawn change does not apply."""
    lines = src.split("\n")
    i = rng.choice([k for k, line in enumerate(lines) if line.startswith("        ") and line.strip()])
    line, kind = lines[i], rng.choice(MUTATIONS)
    if kind == "number":
        numbers = list(re.finditer(r"(?<![\w.])\d+(?![\w.])", line))
        if numbers:
            m = rng.choice(numbers)
            line = line[:m.start()] + rng.choice(NUMBERS) + line[m.end():]
    elif kind == "name":
        names = sorted(set(re.findall(r"\b([A-Z][A-Za-z_]*|[a-z_]+(?:_shared|_local|_prev))\b", src)) - {"T"})
        present = [n for n in names if re.search(rf"\b{n}\b", line)]
        if present:
            line = re.sub(rf"\b{rng.choice(present)}\b", rng.choice(names), line, count=1)
    elif kind == "dtype":
        found = [d for d in DTYPES if d in line]
        if found:
            line = line.replace(rng.choice(found), rng.choice(DTYPES), 1)
    elif kind == "delete":
        if not line.rstrip().endswith(":"):
            line = line[:len(line) - len(line.lstrip())] + "pass"
    elif kind == "swap":
        m = re.search(r"T\.(copy|gemm)\((\w+(?:\[[^\]]*\])?), (\w+(?:\[[^\]]*\])?)", line)
        if m:
            line = line[:m.start(2)] + m.group(3) + ", " + m.group(2) + line[m.end(3):]
    elif "transpose_B=True" in line:
        line = line.replace("transpose_B=True", "transpose_A=True")
    elif "T.gemm(" in line:
        line = line.replace(")", ", transpose_B=True)", 1)
    elif "dim=1" in line:
        line = line.replace("dim=1", rng.choice(["dim=0", "dim=2", "dim=-1"]))
    if line == lines[i]:
        return None
    lines[i] = line
    return "\n".join(lines)


def mutants(seed: int, count: int) -> list:
    """`count` distinct mutants [(base name, source)], drawn with a Random seeded by `seed`."""
    rng, found = random.Random(seed), {}
    while len(found) < count:
        base = rng.choice(sorted(BASES))
        src = mutate(BASES[base], rng)
        if src is not None:
            found.setdefault(src, base)
    return [(base, src) for src, base in found.items()]


COUNT = 60 * max(1, int(os.environ.get("TRITILE_HYPOTHESIS_SCALE", "1")))


@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_mutated_programs_compile_or_quote_their_line(backend, tmp_path):
    problems = []
    for index, (base, src) in enumerate(mutants({"gluon": 2027, "triton": 2028}[backend], COUNT)):
        name = f"mutant_{backend}_{index}"
        path = tmp_path / f"{name}.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception:  # no longer Python (a removed line left a name undefined): Python's own error
            continue
        try:
            tritile.compile(module.make(), target="cuda:90", backend=backend).get_source("ptx")
        except tritile.CompileError as err:
            message = str(err)
            if f"{name}.py:" not in message or "failed to compile kernel" in message or "cannot lower" in message:
                problems.append(f"{base} -> {path}: {message[:400]}")
        except Exception as err:  # noqa: BLE001 - what the test is for
            problems.append(f"{base} -> {path}: {type(err).__name__}: {err}"[:400])
    assert not problems, "\n".join(problems)


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
    """Triton 3.6 fails on (or aborts at) Gluon's i1 shared memory; auto takes the triton backend."""
    message = compile_error(lambda: tritile.compile(_bool_tile(), out_idx=[-1], target="cuda:90",
                                                    backend="gluon").get_source("ptx"))
    assert "a bool shared buffer (positive" in message
    tritile.compile(_bool_tile(), out_idx=[-1], target="cuda:90").get_source("ptx")  # auto: triton
    a = torch.randn(32, 32).half()
    expected = torch.where(a.t() > 0, a, -a)
    for backend in ("auto", "triton") if device == "cpu" else ("auto",):
        assert torch.equal(tritile.compile(_bool_tile(), out_idx=[-1], backend=backend)(a.to(device)).cpu(), expected)


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
