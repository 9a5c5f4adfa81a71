"""Runtime dims specialised on divisibility by 16 (tritile/ir/divisibility.py), as Triton's
`tt.divisibility`: the specialised IR, the instructions each variant takes on sm_90 / sm_80 and
on the triton.language backend, each variant's results against torch (tile-IR interpreter,
Triton's interpreter, the GPU), and the mbarrier protocol of the TMA variants at runtime trip
counts, replayed on the host.

The kernels are TileLang's dynamic_shape example (`M, N, K = T.dynamic(...)`, tests/kernels.py's
GEMM): with a `T.dynamic` last dim that is not a multiple of 16 a tile copy cannot be proved
aligned and takes the synchronous masked load; with one that is, TMA (sm_90) or cp.async (sm_80).
"""
import pytest
import torch

import kernels as K
import tritile
import tritile.language as T
from pipeline_programs import mbarrier_problems
from tritile.interpreter import execute
from tritile.ir import divisibility

DIVISIBLE = dict(m=1024, n=1024, k=1024)
TMA_LOAD, TMA_STORE = "tma.async_copy_global_to_shared(", "tma.async_copy_shared_to_global("


def dynamic_gemm(block_M=128, block_N=128, block_K=32, num_stages=3, threads=128, target="cuda:90",
                 backend="gluon"):
    """TileLang's example_dynamic.py GEMM (its tiles by default) compiled for `target`."""
    M, N, K_ = T.dynamic("m, n, k")
    return tritile.compile(K.gemm(M, N, K_, block_M, block_N, block_K, num_stages=num_stages, threads=threads),
                           out_idx=[-1], target=target, backend=backend)


def dynamic_line(kernel, **dims) -> str:
    return next(line.strip() for line in kernel.get_source("tile", dims=dims).splitlines() if "# dynamic:" in line)


# ------------------------------------------------------------------ the specialised IR


def test_divisible_dims_become_vars_known_to_be_multiples_of_16():
    kernel = dynamic_gemm()
    assert dynamic_line(kernel) == "# dynamic: m, k, n"
    assert dynamic_line(kernel, m=80, k=48, n=72) == "# dynamic: m (multiple of 16), k (multiple of 16), n"
    assert dynamic_line(kernel, m=1000, k=50, n=1024) == "# dynamic: m, k, n (multiple of 16)"
    assert dynamic_line(kernel, k=0, n=16) == "# dynamic: m, k, n (multiple of 16)"  # 0 and unnamed: nothing

    frontend = kernel.stages[0][1]
    func, renamed = divisibility.specialize(frontend, (True, True, False))
    m, k, n = func.dynamic_vars
    assert (m.multiple_of, k.multiple_of, n.multiple_of) == (16, 16, 1)
    assert n is frontend.dynamic_vars[2] and set(renamed) == set(frontend.dynamic_vars[:2])
    a, b, c = func.params
    assert a.shape[0] is m and a.shape[1] is k and b.shape[0] is k and b.shape[1] is n and c.shape[0] is m
    assert func.dim_bindings == {m: (0, 0), k: (0, 1), n: (1, 1)}
    assert all(v.multiple_of == 1 for v in frontend.dynamic_vars)  # the frontend IR is left as it was
    assert divisibility.specialize(frontend, (False, False, False)) == (frontend, {})


def test_dims_of_get_source_are_checked():
    kernel = dynamic_gemm()
    with pytest.raises(ValueError, match="'q' is not a T.dynamic dimension or integer scalar parameter of main"):
        kernel.get_source("tile", dims={"q": 16})
    with pytest.raises(TypeError, match=r"dims\['k'\] must be an int"):
        kernel.get_source("tile", dims={"k": 16.0})


# ------------------------------------------------------------------ instructions per variant


def test_sm90_variant_loads_and_stores_tiles_with_tma():
    kernel = dynamic_gemm()
    plain = kernel.get_source("gluon")
    assert TMA_LOAD not in plain and TMA_STORE not in plain and "gl.load(A + " in plain
    divisible = kernel.get_source("gluon", dims=DIVISIBLE)
    assert "TMA_DESCRIPTORS = (((128, 32)" in divisible and "gl.load(" not in divisible
    assert divisible.count(TMA_LOAD) > 0 and TMA_STORE in divisible
    # the descriptors are encoded from each tensor's own shape (and its row-major strides) at launch
    assert "(A, A.shape, (A.shape[1], 1))" in divisible and "(C, C.shape, (C.shape[1], 1))" in divisible
    ttgir = kernel.get_source("ttgir", dims=DIVISIBLE)
    assert all(f"%{d}: i32 {{tt.divisibility = 16 : i32}}" in ttgir for d in "mkn")
    assert "cp.async.bulk.tensor" in kernel.get_source("ptx", dims=DIVISIBLE)
    assert "cp.async.bulk.tensor" not in kernel.get_source("ptx")


def test_sm90_variant_takes_tma_only_for_tensors_whose_row_pitch_is_aligned():
    """k = 1000: A's rows (k halves) are not 16-byte multiples, B's and C's (n) are."""
    source = dynamic_gemm().get_source("gluon", dims=dict(m=1000, n=1024, k=1000))
    assert "gl.load(A + " in source and "gl.load(B + " not in source
    assert "B_desc, [" in source and "A_desc" not in source and TMA_STORE in source


def test_sm80_variant_copies_tiles_with_cp_async():
    kernel = dynamic_gemm(64, 64, 32, target="cuda:80")
    assert "cp.async_copy_global_to_shared(" not in kernel.get_source("gluon")
    assert "cp.async_copy_global_to_shared(" in kernel.get_source("gluon", dims=DIVISIBLE)
    assert "cp.async.cg.shared.global" in kernel.get_source("ptx", dims=DIVISIBLE)
    assert "cp.async.cg.shared.global" not in kernel.get_source("ptx")


def test_triton_backend_variant_passes_tt_divisibility():
    """Triton's own analysis: the dims' tt.divisibility lets its pipeliner issue cp.async / vector
    loads; on sm_90 the divisible variant's tiles go through TMA descriptors (tests/test_triton_tma.py)."""
    kernel = dynamic_gemm(64, 64, 32, backend="triton")
    ttir = kernel.get_source("ttir", dims=dict(m=80, n=72, k=48))
    assert "%m: i32 {tt.divisibility = 16 : i32}" in ttir and "%k: i32 {tt.divisibility = 16 : i32}" in ttir
    assert "%n: i32 loc(" in ttir
    assert "tt.divisibility" not in kernel.get_source("ttir").split("%m:")[1].split("%k:")[0]
    assert "cp.async.bulk.tensor" in kernel.get_source("ptx", dims=DIVISIBLE)
    assert "cp.async" not in kernel.get_source("ptx")
    sm80 = dynamic_gemm(64, 64, 32, target="cuda:80", backend="triton")
    assert "cp.async.cg" in sm80.get_source("ptx", dims=DIVISIBLE) and "cp.async" not in sm80.get_source("ptx")


# ------------------------------------------------------------------ results per variant

SIZES = [(80, 80, 48), (72, 72, 50), (80, 72, 50), (72, 80, 48), (64, 48, 16)]


def run_sizes(kernel, device, assert_close):
    for m, n, k in SIZES:
        a, b = K.make_operands(m, n, k, device=device)
        assert_close(kernel(a, b), K.gemm_reference(a, b))


def test_variants_match_torch_in_the_interpreter(assert_close):
    kernel = dynamic_gemm(32, 32, 16, num_stages=2)
    run_sizes(kernel, "cpu", assert_close)
    # one variant per divisibility key (m, k, n), each run through its own pass list
    assert set(kernel._variants) == {(False, False, False), (True, True, True), (True, False, False),
                                     (False, True, True)}
    assert kernel._variants[(True, True, True)].func.dynamic_vars[1].multiple_of == 16


def test_eager_dynamic_kernel_is_one_specialisation_with_variants(assert_close):
    matmul = tritile.jit(K.gemm_eager)
    for m, n, k in SIZES[:2]:
        a, b = K.make_operands(m, n, k)
        assert_close(matmul(a, b, dynamic_dims=True, block_M=32, block_N=32, block_K=16), K.gemm_reference(a, b))
    assert matmul.cache_info().misses == 1


def test_variants_match_torch_in_tritons_interpreter(assert_close):
    run_sizes(dynamic_gemm(32, 32, 16, num_stages=2, backend="triton"), "cpu", assert_close)


def test_interpreter_refuses_sizes_a_variant_does_not_hold():
    kernel = dynamic_gemm(32, 32, 16, num_stages=2)
    variant = kernel._variant((True, True, True))
    a, b = K.make_operands(64, 64, 50)
    with pytest.raises(ValueError, match="dynamic dimension k = 50: this program was specialised for a multiple of 16"):
        execute(variant.func, [a, b, torch.empty(64, 64, dtype=torch.float16)], {})


# ------------------------------------------------------------------ the TMA variants' mbarrier protocol


@pytest.mark.parametrize("threads", [128, 256], ids=["one-warpgroup", "producer-warp"])
def test_tma_variant_replays_clean_at_runtime_trip_counts(threads):
    """Runtime trip counts under and over the stage count, ragged M / N edges; with 256 threads
    the variant is warp specialized and persistent (the replay runs every schedule)."""
    kernel = dynamic_gemm(64, 64, 32, threads=threads)
    source = kernel.get_source("gluon", dims=DIVISIBLE)
    assert TMA_LOAD in source and ("_producer" in source) == (threads == 256)
    for m, n, k in [(80, 144, 16), (144, 80, 48), (64, 64, 96), (80, 80, 160)]:
        a, b = K.make_operands(m, n, k)
        assert mbarrier_problems(source, [a, b, torch.empty(m, n, dtype=torch.float16)], (m, k, n)) == []


# ------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("backend, threads", [("gluon", 128), ("gluon", 256), ("triton", 128)],
                         ids=["gluon", "gluon-producer-warp", "triton"])
def test_variants_match_torch_on_the_gpu(backend, threads, assert_close):
    kernel = dynamic_gemm(threads=threads, target="auto", backend=backend)
    for m, n, k in [(1024, 1024, 1024), (1000, 1000, 1000), (1000, 1024, 1024), (1024, 1000, 1008), (1024, 1024, 16)]:
        a, b = K.make_operands(m, n, k, device="cuda")
        assert_close(kernel(a, b), K.gemm_reference(a, b))
    if backend == "gluon":
        tma = kernel._variants[(True, True, True)].device_kernel.source
        plain = kernel._variants[(False, False, False)].device_kernel.source
        assert (TMA_LOAD in tma) == (torch.cuda.get_device_capability()[0] == 9) and TMA_LOAD not in plain


# ------------------------------------------------------------------ integer scalar parameters, several kernels


@tritile.jit(out_idx=[1])
def masked_two_pass(block=32):
    """Two kernels and a workspace of the T.dynamic size M: B[r] = alpha * A[r] + 1 for r < n,
    1 past n (an integer scalar bounding a mask, a float scalar that is never specialised)."""
    M = T.dynamic("M")

    @T.prim_func
    def main(A: T.Tensor((M,), T.float32), B: T.Tensor((M,), T.float32), n: T.int32, alpha: T.float32):
        staging = T.alloc_global((M,), T.float32)
        with T.Kernel(T.ceildiv(M, block), threads=block) as bx:
            for i in T.Parallel(block):
                row = bx * block + i
                if row < M:
                    staging[row] = T.if_then_else(row < n, A[row] * alpha, 0.0)
        with T.Kernel(T.ceildiv(M, block), threads=block) as bx:
            for i in T.Parallel(block):
                row = bx * block + i
                if row < M:
                    B[row] = staging[row] + 1.0

    return main


def masked_reference(a, n, alpha):
    out = torch.ones_like(a)
    out[:n] += a[:n] * alpha
    return out


def test_integer_scalar_is_part_of_the_key_and_float_is_not():
    kernel = masked_two_pass()
    header = kernel.get_source("tile", dims={"M": 64, "n": 32})
    assert "# dynamic: M (multiple of 16)" in header and "# scalars: n (multiple of 16)" in header
    assert "# scalars:" not in kernel.get_source("tile", dims={"M": 64, "n": 33})
    assert "# scalars:" not in kernel.get_source("tile") and "multiple of" not in kernel.get_source("tile")
    with pytest.raises(ValueError, match="'alpha' is not a T.dynamic dimension or integer scalar parameter of main "
                                         r"\(it has M, n\)"):
        kernel.get_source("tile", dims={"alpha": 16})
    part = kernel._parts[0]
    func, renamed = divisibility.specialize(part.stages[0][1], (False, True))
    (n,) = [v for v in func.scalar_vars if v.name == "n"]
    assert n.multiple_of == 16 and func.dynamic_vars[0].multiple_of == 1 and set(renamed) == {part.func.scalar_vars[0]}


@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_parts_run_their_variant_of_the_calls_key(backend, assert_close):
    """One key per call over (M, n); each kernel of the call runs its own variant for it
    (the tile-IR interpreter, or Triton's interpreter of the generated kernels)."""
    kernel = tritile.compile(masked_two_pass.fn(), out_idx=[1], backend=backend)
    for m, n in [(64, 32), (64, 50), (40, 16), (40, 7), (48, 0), (48, 100)]:
        a = torch.randn(m)
        assert_close(kernel(a, n, 0.5), masked_reference(a, n, 0.5))
    keys = {(True, True), (True, False), (False, True), (False, False)}
    assert all(set(part._variants) == keys for part in kernel._parts)
    variant = kernel._parts[0]._variants[(True, True)]
    assert [v.multiple_of for v in variant.func.runtime_vars] == [16, 16, 1]


def test_interpreter_refuses_a_scalar_a_variant_does_not_hold():
    part = masked_two_pass()._parts[0]
    variant = part._variant((False, True))
    n = next(v for v in variant.func.scalar_vars if v.name == "n")
    alpha = next(v for v in variant.func.scalar_vars if v.name == "alpha")
    with pytest.raises(ValueError, match="scalar parameter n = 50: this program was specialised for a multiple of 16"):
        execute(variant.func, [torch.randn(64), torch.empty(64), torch.empty(64)], {n: 50, alpha: 1.0})


@pytest.mark.parametrize("backend, stage", [("gluon", "ttgir"), ("triton", "ttir")])
def test_each_kernel_passes_tt_divisibility_for_the_calls_key(backend, stage):
    kernel = tritile.compile(masked_two_pass.fn(), out_idx=[1], backend=backend, target="cuda:90")
    divisible = kernel.get_source(stage, dims={"M": 64, "n": 32})
    assert divisible.count("%M: i32 {tt.divisibility = 16 : i32}") == 2
    assert divisible.count("%n: i32 {tt.divisibility = 16 : i32}") == 2
    assert "%alpha: f32 {tt.divisibility" not in divisible
    plain = kernel.get_source(stage)
    assert "%M: i32 {tt.divisibility" not in plain and "%n: i32 {tt.divisibility" not in plain
    only_n = kernel.get_source(stage, dims={"n": 48})
    assert only_n.count("%n: i32 {tt.divisibility = 16 : i32}") == 2 and "%M: i32 {tt.divisibility" not in only_n


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_parts_and_scalar_variants_on_the_gpu(backend, assert_close):
    kernel = tritile.compile(masked_two_pass.fn(), out_idx=[1], backend=backend)
    for m, n in [(4096, 1024), (4096, 1000), (1000, 512), (1000, 999)]:
        a = torch.randn(m, device="cuda")
        assert_close(kernel(a, n, -1.5), masked_reference(a, n, -1.5))
    assert all(part._variants[(True, True)].device_kernel is not None for part in kernel._parts)
