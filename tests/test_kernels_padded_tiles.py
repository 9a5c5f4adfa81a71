"""Tiles whose extents are not powers of two (192, 96, 576, ...), written the TileLang way.

Both backends pad such a tile to the next power of two and mask the pad lanes
(tritile/ir/padding.py): masked global loads and stores, pad lanes 0 in every on-chip tile,
reductions over the identity, gemms over zero-padded operands.  Each kernel runs on the
`device` fixture's tensors (CPU: the tile-IR interpreter, or with TRITILE_BACKEND=triton
Triton's interpreter of the generated code; CUDA: the compiled kernel) against torch, and
`test_compiles_for_sm90_on_both_backends` compiles each for Hopper on both backends.
Also here: TileLang's composable index (`B_local[i * block_N + j] = A_local[i, j]`, a reshape
of a fragment, lowering/flat_reshapes.py), with block_N = 576.
"""
import importlib.util
from pathlib import Path

import pytest
import torch

import tritile
import tritile.language as T
from tritile.runtime.target import Target

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "flash_attention.py"
_spec = importlib.util.spec_from_file_location("tritile_example_flash_attention_padded", EXAMPLE)
flash_attention = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(flash_attention)


@tritile.jit(out_idx=[1])
def composable_copy(M, N, block_M, block_N, dtype="float16"):
    """TileLang's test_tilelang_language_composable_index program."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M * N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_local = T.alloc_fragment([block_M, block_N], dtype)
            B_local = T.alloc_fragment([block_M * block_N], dtype)
            T.copy(A[by * block_M, bx * block_N], A_local)
            for i, j in T.Parallel(block_M, block_N):
                B_local[i * block_N + j] = A_local[i, j]
            for i in T.Parallel(block_M * block_N):
                B[by * block_M * N + bx * block_N + i // block_N * N + i % block_N] = B_local[i]

    return main


@pytest.mark.parametrize("M, N, block_M, block_N, dtype", [
    (64, 64, 32, 32, "float16"), (64, 576, 8, 576, "float16"), (48, 576, 16, 576, "float32")])
def test_composable_index(M, N, block_M, block_N, dtype, device, assert_close):
    a = torch.randn(M, N, dtype=getattr(torch, dtype), device=device)
    b = composable_copy(M, N, block_M, block_N, dtype)(a)
    assert torch.equal(b.flatten(), a.flatten())


@tritile.jit(out_idx=[2])
def gemm(M, N, K, block_M, block_N, block_K, dtype="float16", num_stages=2, threads=128):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), "float32")
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[k * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return main


# (M, N, K, block_M, block_N, block_K): a non-pow2 N (192), K (48, 96), M (96) and ragged edges
GEMM_SHAPES = [(128, 384, 96, 64, 192, 48), (96, 192, 192, 96, 192, 96), (100, 200, 72, 64, 192, 48)]


@pytest.mark.parametrize("shape", GEMM_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_padded_tiles(shape, device, assert_close):
    M, N, K, bm, bn, bk = shape
    a = torch.randn(M, K, dtype=torch.float16, device=device)
    b = torch.randn(K, N, dtype=torch.float16, device=device)
    c = gemm(M, N, K, bm, bn, bk)(a, b)
    assert_close(c, (a.float() @ b.float()).half())


@tritile.jit(out_idx=[1, 2, 3])
def row_reductions(M, N, block_M):
    """max / sum / absmax of each row of a (block_M, N) fragment; N = 96 or 576 pads to 128 / 1024
    lanes (and block_M = 24 to 32 rows)."""

    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Mx: T.Tensor((M,), "float32"), S: T.Tensor((M,), "float32"),
             Am: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            x = T.alloc_fragment((block_M, N), "float32")
            mx = T.alloc_fragment((block_M,), "float32")
            s = T.alloc_fragment((block_M,), "float32")
            am = T.alloc_fragment((block_M,), "float32")
            T.copy(X[bx * block_M, 0], x)
            for i, j in T.Parallel(block_M, N):
                x[i, j] = x[i, j] - 4.0  # all negative: pad lanes taken as 0 would win the max
            T.reduce_max(x, mx, dim=1)
            T.reduce_sum(x, s, dim=1)
            T.reduce_absmax(x, am, dim=1)
            T.copy(mx, Mx[bx * block_M])
            T.copy(s, S[bx * block_M])
            T.copy(am, Am[bx * block_M])

    return main


@pytest.mark.parametrize("M, N, block_M", [(48, 96, 24), (32, 576, 16)])
def test_reductions_over_padded_rows(M, N, block_M, device, assert_close):
    x = torch.rand(M, N, device=device)
    mx, s, am = row_reductions(M, N, block_M)(x)
    y = x - 4.0
    assert_close(mx, y.amax(dim=1))
    assert_close(s, y.sum(dim=1))
    assert_close(am, y.abs().amax(dim=1))


@pytest.mark.parametrize("dim", [192, 96])
def test_flash_attention_padded_head_dim(dim, device, assert_close):
    batch, heads, seq = 1, 2, 128
    kernel = flash_attention.flashattn(batch, heads, seq, seq, dim, False, block_M=64, block_N=64, num_stages=1)
    q, k, v = (torch.randn(batch, heads, seq, dim, dtype=torch.float16, device=device) for _ in range(3))
    assert_close(kernel(q, k, v), flash_attention.ref_program(q, k, v, False))


# one stage: the padded tiles of two stages exceed sm_80's shared memory (they fit the H100's)
COMPILE_CASES = {
    "composable_copy-576": lambda: composable_copy(64, 576, 8, 576, "float16"),
    **{f"gemm-{'x'.join(map(str, s))}": (lambda s=s: gemm(*s, num_stages=1)) for s in GEMM_SHAPES},
    "row_reductions-96": lambda: row_reductions(48, 96, 24),
    "row_reductions-576": lambda: row_reductions(32, 576, 16),
    "flashattn-d192": lambda: flash_attention.flashattn(1, 2, 128, 128, 192, False, block_M=64, block_N=64,
                                                        num_stages=1),
}


@pytest.mark.parametrize("backend", ["gluon", "triton"])
@pytest.mark.parametrize("case", sorted(COMPILE_CASES))
def test_compiles_for_sm90_on_both_backends(case, backend):
    kernel = tritile.compile(COMPILE_CASES[case]().stages[0][1], target=Target("cuda", 90), backend=backend)
    assert ".entry" in kernel.get_source("ptx")


def test_triton_interpreter_runs_the_padded_code(assert_close):
    """The generated triton.language code of padded tiles, run by Triton's interpreter on CPU
    tensors, gives torch's values (whatever TRITILE_BACKEND says)."""
    def on_triton(kernel):
        return tritile.compile(kernel.stages[0][1], backend="triton")

    a = torch.randn(48, 576)
    assert torch.equal(on_triton(composable_copy(48, 576, 16, 576, "float32"))(a).flatten(), a.flatten())
    x = torch.rand(48, 96)
    mx, s, am = on_triton(row_reductions(48, 96, 24))(x)
    assert_close(mx, (x - 4).amax(dim=1))
    assert_close(s, (x - 4).sum(dim=1))
    assert_close(am, (x - 4).abs().amax(dim=1))
    a, b = torch.randn(100, 72, dtype=torch.float16), torch.randn(72, 200, dtype=torch.float16)
    assert_close(on_triton(gemm(100, 200, 72, 64, 192, 48))(a, b), (a.float() @ b.float()).half())


@tritile.jit(out_idx=[1])
def transposed_flat_copy(M, N):
    """A flat index that is not the row-major linearisation of the loop vars: a register scatter."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M * N,), "float32")):
        with T.Kernel(1, threads=128) as _:
            A_local = T.alloc_fragment([M, N], "float32")
            B_local = T.alloc_fragment([M * N], "float32")
            T.copy(A[0, 0], A_local)
            for i, j in T.Parallel(M, N):
                B_local[j * M + i] = A_local[i, j]
            for i in T.Parallel(M * N):
                B[i] = B_local[i]

    return main


@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_a_flat_index_other_than_the_linearisation_is_a_compile_error(backend):
    kernel = transposed_flat_copy(16, 32)
    a = torch.randn(16, 32)
    interpreted = tritile.compile(kernel.stages[0][1], backend="auto")  # CPU: the tile-IR interpreter
    assert torch.equal(interpreted(a), a.t().flatten())
    with pytest.raises(tritile.CompileError, match=r"B_local") as err:
        tritile.compile(kernel.stages[0][1], target=Target("cuda", 90), backend=backend).get_source("ptx")
    assert "B_local[j * M + i] = A_local[i, j]" in str(err.value)
