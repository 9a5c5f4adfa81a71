"""Tile atomics: `T.atomic_add` of a whole tile into a global region.

* Split-K GEMM, TileLang's examples/gemm_splitk style: the grid's third dimension splits K;
  every split accumulates its partial product into C with an atomic add: the tile form
  (`T.atomic_add(C[region or head address], C_shared)`) and the scalar form
  (`T.atomic_add(C[i, j], value)` inside `T.Parallel`, guarded for a padded shape).
* A wgmma accumulator added to C at every step of a loop (the FlashAttention backward's dQ):
  on sm_90 the Gluon backend converts it to the coalesced layout (4 fp32 / 8 fp16 contiguous a
  thread: `red.global.v4.f32` / `.v8.f16`), and both backends drop the tests of the dims the
  region provably stays inside (block indices below the grid: no mask at all where the tensor
  is a multiple of the tile; the rows alone where M is ragged).

C starts from random values, so the kernels must add to it, not overwrite it.  On the `device`
fixture's tensors (CPU: the reference interpreter, and the triton backend in Triton's
interpreter; CUDA: the Gluon kernel); the generated code is compiled for sm_90 without a GPU.
"""
import re

import pytest
import torch

import tritile
import tritile.language as T
from kernels import splitk_gemm

matmul_splitk = tritile.jit(splitk_gemm)


SPLITK_CASES = [
    ("tile_region", 128, 128),
    ("tile_head", 128, 128),
    ("scalar", 128, 128),
    ("scalar", 200, 136),  # padded: the guard keeps edge tiles inside C
    ("scalar_unguarded", 200, 136),  # padded, no guard: the adds past the edges must be dropped
]
K, SPLIT_K = 128, 2


@pytest.mark.parametrize("form, M, N", SPLITK_CASES)
def test_splitk_atomic_add(form, M, N, device, assert_close):
    kernel = matmul_splitk(M, N, K, 64, 64, 32, SPLIT_K, form)
    a = torch.randn(M, K, dtype=torch.float16, device=device)
    b = torch.randn(K, N, dtype=torch.float16, device=device)
    storage = torch.randn(M + 64, N, device=device)  # C, then rows no kernel may write
    c, after = storage[:M], storage[M:].clone()
    expected = c + a.float() @ b.float()
    kernel(a, b, c)
    assert_close(c, expected)
    assert torch.equal(storage[M:], after)


@tritile.jit
def step_accumulate(M, N, K, dtype, block_M=64, block_N=64, block_K=32):
    """C += A @ B, each K step's product (a fresh wgmma accumulator) added to C's tile atomically."""

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), T.float16)
            B_shared = T.alloc_shared((block_K, block_N), T.float16)
            acc = T.alloc_fragment((block_M, block_N), T.float32)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[k * block_K, bx * block_N], B_shared)
                T.clear(acc)
                T.gemm(A_shared, B_shared, acc)
                T.atomic_add(C[by * block_M:(by + 1) * block_M, bx * block_N:(bx + 1) * block_N], acc)

    return main


STEP_CASES = [(128, 128, 96), (200, 136, 96)]  # exact; ragged rows and columns (edge tiles masked)


@pytest.mark.parametrize("backend", ["auto", "triton"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("M, N, K_", STEP_CASES)
def test_tile_atomic_per_step_matches_torch(M, N, K_, dtype, backend, device, assert_close):
    if backend == "triton" and device != "cpu":
        pytest.skip("the triton backend's CPU check (Triton's interpreter)")
    if backend == "triton" and dtype == "bfloat16":
        pytest.skip("Triton's interpreter has no bfloat16 atomics (numpy has no bfloat16)")
    torch_dtype = getattr(torch, dtype)
    a = torch.randn(M, K_, dtype=torch.float16, device=device)
    b = torch.randn(K_, N, dtype=torch.float16, device=device)
    storage = torch.randn(M + 64, N, device=device).to(torch_dtype)  # C, then rows no kernel may write
    c, after = storage[:M], storage[M:].clone()
    expected, largest = c.clone(), c.abs().max()
    for k in range(0, K_, 32):  # each step's sum rounded to C's dtype
        expected = (expected.float() + a[:, k:k + 32].float() @ b[k:k + 32].float()).to(torch_dtype)
        largest = max(largest, expected.abs().max())
    kernel = tritile.compile(step_accumulate.fn(M, N, K_, dtype), backend=backend)
    kernel(a, b, c)
    if dtype == "float32":
        assert_close(c, expected)
    else:  # the GPU also rounds each step's product to C's dtype before adding it: an ulp a step
        tol = K_ // 32 * torch.finfo(torch_dtype).eps * largest.item()
        torch.testing.assert_close(c.float(), expected.float(), rtol=0, atol=tol)
    assert torch.equal(storage[M:], after)


def _atomics(ptx: str) -> list:
    """(instruction, whether its predicate is constant true) of each global atomic in `ptx`."""
    constant = set(re.findall(r"mov\.pred\s+(%p\d+), -1;", ptx))
    found = []
    for pred, op in re.findall(r"(?:@(%p\d+)\s+)?((?:atom|red)\.global\S*)", ptx):
        found.append((op, not pred or pred in constant))
    return found


def _atomic_line(source: str) -> str:
    return next(line.strip() for line in source.splitlines() if "atomic_add(" in line)


@pytest.fixture
def per_element_atomics(monkeypatch, gluon_backend):
    """The per-element path of sm_90's tile atomics, which serves the tiles a TMA reduce does
    not take (`TRITILE_TMA_REDUCE=0` gives it those too)."""
    monkeypatch.setenv("TRITILE_TMA_REDUCE", "0")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("M, N", [(128, 128), (200, 136)])
def test_sm90_tile_atomic_of_a_fragment_is_one_tma_reduce(M, N, dtype, gluon_backend):
    """A whole fragment added into a 2-D tile is one TMA reduce of the tile staged in shared
    memory, ragged edge tiles too (the hardware drops the elements past 200 x 136, as the
    per-element masks did; test_tile_atomic_per_step_matches_torch checks on the GPU that no row
    past C changes): no atomic per element, no mask.  The staging tile is allocated once at the
    top of the kernel and waited on before each write; the kernel waits for the last reduce and
    then stores into it, its last use for Triton's allocator."""
    kernel = tritile.compile(step_accumulate.fn(M, N, 96, dtype), target="cuda:90")
    source = kernel.get_source("gluon")
    body = source[source.index("def main("):source.index("def tritile_launch(")]
    assert "atomic_add(" not in source and body.count("async_reduce_add(C_desc, [") == 2, source
    stage = re.search(r"^    (_stage\d+) = gl\.allocate_shared_memory\(", body, flags=re.M).group(1)
    assert body.index(f"{stage} = gl.allocate_shared_memory(") < body.index("for k_t in range(")
    assert re.search(rf"tma\.store_wait\(0\)\n\s+{stage}\.store\(acc\.to\(", body)
    # the last reduce waited for, then the staging tile's last use (so no later buffer takes its bytes early)
    assert re.search(rf"tma\.store_wait\(0\)\n\s+{stage}\.store\(gl\.zeros\(\[64, 64\], gl\.\w+, layout=\w+\)\)\s*$", body)
    ptx = kernel.get_source("ptx")
    assert not _atomics(ptx)
    assert re.search(r"cp\.reduce\.async\.bulk\.tensor\.2d\.global\.shared::cta\.add", ptx)


@tritile.jit
def copy_accumulate(dtype, order=None, M=64, N=64):
    """C += A through a fragment, by one tile atomic of memory order `order`."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(1, threads=128) as bx:
            frag = T.alloc_fragment((M, N), dtype)
            T.copy(A, frag)
            T.atomic_add(C[0:M, 0:N], frag, memory_order=order)

    return main


@pytest.mark.parametrize("dtype, order, reduced", [("float32", None, True), ("float16", "relaxed", True),
                                                   ("float32", "release", False), ("int32", None, False)])
def test_which_tile_atomics_become_a_tma_reduce(dtype, order, reduced, device, assert_close):
    """A relaxed float add is a TMA reduce; an ordered one (the reduce is relaxed) or an integer
    one keeps its atomics per element.  Each adds A to C alike."""
    torch_dtype = getattr(torch, dtype)
    make = (lambda: torch.randint(-50, 50, (64, 64), device=device, dtype=torch_dtype)) if dtype == "int32" else \
        (lambda: torch.randn(64, 64, device=device).to(torch_dtype))
    a, c = make(), make()
    expected = (c.float() + a.float()).to(torch_dtype)
    copy_accumulate(dtype, order)(a, c)
    assert_close(c, expected)
    if device == "cpu":
        source = tritile.compile(copy_accumulate.fn(dtype, order), target="cuda:90", backend="gluon").get_source("gluon")
        assert ("async_reduce_add(C_desc, [0, 0], " in source) == reduced
        assert ("gl.atomic_add(" in source) == (not reduced)


@pytest.mark.parametrize("dtype, op", [("float32", "atom.global.gpu.relaxed.add.v4.f32"),
                                       ("float16", "atom.global.gpu.relaxed.add.noftz.v8.f16"),
                                       ("bfloat16", "atom.global.gpu.relaxed.add.noftz.v8.bf16")])
def test_sm90_tile_atomic_is_16_bytes_wide_and_unmasked_inside_the_tensor(dtype, op, per_element_atomics):
    """128 x 128: every tile stays inside C (by, bx below the grid), so the Gluon atomic has no
    mask and its 64 x 64 tile (32 elements a thread of 128) is 8 16-byte vectors per thread and
    step (twice in the PTX: the pipelined loop and its last step)."""
    kernel = tritile.compile(step_accumulate.fn(128, 128, 96, dtype), target="cuda:90")
    line = _atomic_line(kernel.get_source("gluon"))
    assert "gl.convert_layout(acc.to(" in line and "mask=" not in line, line
    atomics = _atomics(kernel.get_source("ptx"))
    per_thread = 64 * 64 // 128 * (32 if dtype == "float32" else 16) // 128
    assert [a for a, _ in atomics] == [op] * (2 * per_thread), atomics
    assert all(always for _, always in atomics), atomics


def test_sm90_ragged_tile_atomic_keeps_the_mask_of_the_dims_it_may_leave(per_element_atomics):
    """200 x 136: by's last tile passes row 200 and bx's column 136 - both tested, each alone."""
    kernel = tritile.compile(step_accumulate.fn(200, 136, 96, "float32"), target="cuda:90")
    line = _atomic_line(kernel.get_source("gluon"))
    assert re.search(r"mask=\(_i\d+\[:, None\] < 200\) & \(_i\d+\[None, :\] < 136\)", line), line
    atomics = _atomics(kernel.get_source("ptx"))
    assert atomics and all(a == "atom.global.gpu.relaxed.add.v4.f32" and not always for a, always in atomics)
    rows_only = tritile.compile(step_accumulate.fn(200, 128, 96, "float32"), target="cuda:90")
    line = _atomic_line(rows_only.get_source("gluon"))
    assert re.search(r"mask=\(_i\d+\[:, None\] < 200\), sem=", line), line


def test_sm90_tile_atomic_of_a_runtime_dim_keeps_its_mask(per_element_atomics):
    """Nothing bounds a T.dynamic dim but 0: its test stays; the static dim's goes."""
    M = T.dynamic("m")
    kernel = tritile.compile(step_accumulate.fn(M, 128, 96, "float32"), target="cuda:90")
    line = _atomic_line(kernel.get_source("gluon"))
    assert re.search(r"mask=\(_i\d+\[:, None\] < m\), sem=", line), line


def test_vector_atomics_switch_keeps_the_accumulator_layout(monkeypatch, per_element_atomics):
    """`TRITILE_VECTOR_ATOMICS=0` (an A/B switch): no conversion, the accumulator's pairs."""
    monkeypatch.setenv("TRITILE_VECTOR_ATOMICS", "0")
    kernel = tritile.compile(step_accumulate.fn(128, 128, 96, "float32"), target="cuda:90")
    assert "convert_layout" not in _atomic_line(kernel.get_source("gluon"))
    atomics = _atomics(kernel.get_source("ptx"))
    assert [a for a, _ in atomics] == ["atom.global.gpu.relaxed.add.v2.f32"] * 32, atomics


def test_triton_backend_drops_the_masks_it_proves():
    exact = tritile.compile(step_accumulate.fn(128, 128, 96, "float32"), target="cuda:90", backend="triton")
    assert "mask=" not in _atomic_line(exact.get_source("triton"))
    ragged = tritile.compile(step_accumulate.fn(200, 128, 96, "float32"), target="cuda:90", backend="triton")
    assert re.search(r"mask=\(_i\d+\[:, None\] < 200\), sem=", _atomic_line(ragged.get_source("triton")))


@tritile.jit
def block_prefix_sums(M, N, block):
    """C's row block j += the sum of A's row blocks 0..j: program bx adds its block to C's blocks
    bx, bx + 1, ... (a loop whose trip count falls as bx grows, like a causal backward's)."""

    @T.prim_func
    def main(A: T.Tensor((M, N), T.float32), C: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(M, block), threads=128) as bx:
            A_shared = T.alloc_shared((block, N), T.float32)
            T.copy(A[bx * block, 0], A_shared)
            for t in T.serial(T.ceildiv(M, block) - bx):
                T.atomic_add(C[(bx + t) * block:(bx + t + 1) * block, :], A_shared)

    return main


def _block_prefix_reference(a, c, block):
    blocks = torch.zeros(-(-a.shape[0] // block) * block, a.shape[1], dtype=a.dtype, device=a.device)
    blocks[:a.shape[0]] = a
    sums = blocks.reshape(-1, block, a.shape[1]).cumsum(0).reshape(-1, a.shape[1])
    return c + sums[:a.shape[0]]


@pytest.mark.parametrize("backend", ["auto", "triton"])
@pytest.mark.parametrize("M", [256, 200])
def test_tile_atomic_in_a_loop_bounded_by_the_block_matches_torch(M, backend, device, assert_close):
    if backend == "triton" and device != "cpu":
        pytest.skip("the triton backend's CPU check (Triton's interpreter)")
    a = torch.randn(M, 64, device=device)
    storage = torch.randn(M + 64, 64, device=device)
    c, after = storage[:M], storage[M:].clone()
    expected = _block_prefix_reference(a, c, 64)
    tritile.compile(block_prefix_sums.fn(M, 64, 64), backend=backend)(a, c)
    assert_close(c, expected)
    assert torch.equal(storage[M:], after)


@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_a_loop_bounded_by_the_block_proves_its_rows_inside(backend):
    """t < ceildiv(M, 64) - bx keeps (bx + t) * 64 + 63 below M = 256 whatever bx is: a bound
    intervals alone lose (bx and t each up to 3), `NonNegative.upper_bound` finds it (t at its
    last value, bx cancels).  M = 200 leaves the last block ragged: the rows keep their test."""
    exact = tritile.compile(block_prefix_sums.fn(256, 64, 64), target="cuda:90", backend=backend)
    assert "mask=" not in _atomic_line(exact.get_source(backend))
    ragged = tritile.compile(block_prefix_sums.fn(200, 64, 64), target="cuda:90", backend=backend)
    assert re.search(r"mask=\(_i\d+\[:, None\] < 200\), sem=", _atomic_line(ragged.get_source(backend)))


# The specialisations tests/test_kernels_compile.py compiles for sm_90 and sm_80.
COMPILE_CASES = {f"matmul_splitk-{form}-{M}x{N}": (lambda form=form, M=M, N=N: matmul_splitk(
    M, N, K, 64, 64, 32, SPLIT_K, form)) for form, M, N in SPLITK_CASES}
COMPILE_CASES.update({f"block_prefix_sums-{M}": (lambda M=M: block_prefix_sums(M, 64, 64)) for M in (256, 200)})
COMPILE_CASES.update({f"step_accumulate-{dtype}-{M}x{N}": (lambda M=M, N=N, K_=K_, dtype=dtype: step_accumulate(
    M, N, K_, dtype)) for M, N, K_ in STEP_CASES for dtype in ("float32", "float16")})


@tritile.jit
def batch_edge_accumulate(batches: int, grid_batches: int, M=64, N=64, K=32):
    """C[bz] += A @ B for bz below `grid_batches`, C holding `batches`: the last programs' tiles
    leave C along the batch dim only (dropped there, TileLang's safe access)."""

    @T.prim_func
    def main(A: T.Tensor((M, K), T.float16), B: T.Tensor((K, N), T.float16), C: T.Tensor((batches, M, N), T.float32)):
        with T.Kernel(1, grid_batches, threads=128) as (bx, bz):
            A_shared = T.alloc_shared((M, K), T.float16)
            B_shared = T.alloc_shared((K, N), T.float16)
            acc = T.alloc_fragment((M, N), T.float32)
            T.copy(A, A_shared)
            T.copy(B, B_shared)
            T.clear(acc)
            T.gemm(A_shared, B_shared, acc)
            T.atomic_add(C[bz, 0:M, 0:N], acc)

    return main


def test_a_tile_atomic_tested_only_outside_the_tile(device, assert_close):
    """The batch index is the only dim tested: Gluon takes a mask of the tile's shape, not the
    scalar test (it failed to compile: the head-dim-128 FlashAttention backward on a producer
    warp fell back to the triton backend, bench/NOTES.md session 21); programs past C add nothing.
    No TMA reduce: C's rows view would clip only at its end, so bz = 3, 4 would reach past C."""
    a = torch.randn(64, 32, device=device).to(torch.float16)
    b = torch.randn(32, 64, device=device).to(torch.float16)
    c = torch.randn(3, 64, 64, device=device)
    expected = c + (a.float() @ b.float())
    batch_edge_accumulate(3, 5)(a, b, c)
    assert_close(c, expected)
    if device == "cpu":
        kernel = tritile.compile(batch_edge_accumulate.fn(3, 5), target="cuda:90", backend="gluon")
        line = _atomic_line(kernel.get_source("gluon"))
        assert re.search(r"mask=gl\.full\(\[64, 64\], 1, gl\.int1, layout=\w+\) & \(bz < 3\)", line), line
        assert _atomics(kernel.get_source("ptx"))
