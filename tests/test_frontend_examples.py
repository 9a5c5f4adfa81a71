"""TileLang's reference kernels (elementwise, FlashAttention fwd from examples/flash_attention.py,
reductions, split-K atomic_add, a `@T.macro` helper), written exactly as TileLang users write
them, parse and (where the frontend alone decides the result) run correctly through the
interpreter."""
import pytest
import torch

import tritile
import tritile.language as T
from tritile.ir import nodes as ir
from tritile.ir.transform import walk
from kernels import splitk_gemm
from test_kernels_examples import load_example


def elementwise_add(M=128, N=128, block_M=32, block_N=32, dtype="float16"):
    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                y = by * block_M + i
                x = bx * block_N + j
                C[y, x] = A[y, x] + B[y, x]

    return main


def row_reduce(M=64, N=128, dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), S: T.Tensor((M,), dtype), X: T.Tensor((M,), dtype)):
        with T.Kernel(1, threads=128) as bx:
            A_local = T.alloc_fragment((M, N), dtype)
            sums = T.alloc_fragment((M,), dtype)
            maxes = T.alloc_fragment((M,), dtype)
            T.copy(A, A_local)
            T.reduce_sum(A_local, sums, dim=1)
            T.reduce_absmax(A_local, maxes, dim=-1)
            T.copy(sums, S)
            T.copy(maxes, X)

    return main


@pytest.mark.parametrize("causal", [True, False])
def test_flash_attention_parses(causal):
    # the example's @tritile.jit function; its __wrapped__ body returns the @T.prim_func
    flashattn = load_example("flash_attention").flashattn.__wrapped__
    func = flashattn(batch=1, heads=2, seq_q=128, seq_kv=128, dim=64, is_causal=causal)
    nodes = list(walk(func.kernel.body))
    assert any(isinstance(n, ir.Reduce) and n.kind == "max" and not n.clear for n in nodes)
    assert any(isinstance(n, ir.Call) and n.fn == "infinity" for n in nodes)
    gemms = [n for n in nodes if isinstance(n, ir.Gemm)]
    assert [g.transpose_b for g in gemms] == [True, False] and {g.policy for g in gemms} == {"FullRow"}
    (loop,) = [n for n in nodes if isinstance(n, ir.For)]
    assert loop.kind == "pipelined" and isinstance(loop.stop, ir.Var if causal else ir.Const)


def test_macro_inlines_at_each_call_site(assert_close):
    @T.macro
    def scale_tile(tile, factor):
        for i, j in T.Parallel(32, 64):
            tile[i, j] = tile[i, j] * factor

    @T.prim_func
    def scale_twice(X: T.Tensor((32, 64), "float32"), Y: T.Tensor((32, 64), "float32")):
        with T.Kernel(1, threads=128) as bx:
            tile = T.alloc_fragment((32, 64), "float32")
            T.copy(X, tile)
            scale_tile(tile, 2.0)
            scale_tile(tile, 3.0)
            T.copy(tile, Y)

    assert len([n for n in walk(scale_twice.kernel.body) if isinstance(n, ir.Parallel)]) == 2
    kernel = tritile.compile(scale_twice, out_idx=-1, target="cpu")
    x = torch.randn(32, 64)
    assert_close(kernel(x), x * 6.0)


def test_elementwise_runs(assert_close):
    kernel = tritile.compile(elementwise_add(), out_idx=-1, target="cpu")
    a, b = torch.randn(128, 128, dtype=torch.float16), torch.randn(128, 128, dtype=torch.float16)
    assert_close(kernel(a, b), a + b)


def test_reductions_run(assert_close):
    kernel = tritile.compile(row_reduce(), out_idx=[1, 2], target="cpu")
    a = torch.randn(64, 128)
    sums, maxes = kernel(a)
    assert_close(sums, a.sum(dim=1))
    assert_close(maxes, a.abs().amax(dim=1))


@pytest.mark.parametrize("tile_form", [False, True], ids=["scalar", "tile"])
def test_split_k_atomic_add(tile_form):
    func = splitk_gemm(128, 128, 128, 64, 64, 32, split_k=2, form="tile_head" if tile_form else "scalar",
                       num_stages=0)
    (atomic,) = [n for n in walk(func.kernel.body) if isinstance(n, ir.AtomicAdd)]
    assert isinstance(atomic.value, ir.Region if tile_form else ir.Expr)
    assert atomic.dst.extents == ((1, 64, 64)[1:] if tile_form else (1, 1))
    kernel = tritile.compile(func, target="cpu")
    a, b = torch.randn(128, 128, dtype=torch.float16), torch.randn(128, 128, dtype=torch.float16)
    c = torch.zeros(128, 128)  # the split-K partial sums accumulate into C
    kernel(a, b, c)
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-4, atol=1e-3)
