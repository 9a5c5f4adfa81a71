"""TileLang's `tilelang.cuda.intrinsics.make_mma_swizzle_layout` (tritile/cuda/intrinsics/layout/
mma_layout.py) as examples/hadamard_transform/example_hadamard.py uses it: a swizzle request
that `T.annotate_layout` accepts and that never changes results; TVM's `T.tvm_warp_shuffle` in
kernels of one thread; and `tilelang.engine.callback`'s post-processing decorators
(tritile/engine/callback.py), which import and refuse to register."""
import importlib

import pytest
import torch

import tritile
import tritile.language as T
from tritile.cuda.intrinsics import get_swizzle_layout, make_mma_swizzle_layout
from tritile.layout import SwizzledLayout


def sylvester(n):
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def hadamard_gemm(M, N, block_M):
    """Y = X @ H through shared tiles annotated with make_mma_swizzle_layout (128-byte rows)."""

    @T.prim_func
    def main(X: T.Tensor((M, N), T.float16), Hm: T.Tensor((N, N), T.float16), Y: T.Tensor((M, N), T.float32)):
        with T.Kernel(M // block_M, threads=128) as bx:
            X_shared = T.alloc_shared((block_M, N), T.float16)
            H_shared = T.alloc_shared((N, N), T.float16)
            acc = T.alloc_fragment((block_M, N), T.float32)
            T.annotate_layout({X_shared: make_mma_swizzle_layout(X_shared),
                               H_shared: make_mma_swizzle_layout(H_shared)})
            T.copy(X[bx * block_M, 0], X_shared)
            T.copy(Hm, H_shared)
            T.gemm(X_shared, H_shared, acc, clear_accum=True)
            T.copy(acc, Y[bx * block_M, 0])

    return main


def test_swizzled_shared_tiles_keep_the_gemm_result():
    M, N = 64, 64
    x = torch.randn(M, N).half()
    hm = sylvester(N).half()
    kernel = tritile.compile(hadamard_gemm(M, N, 32), out_idx=[2])
    torch.testing.assert_close(kernel(x, hm), x.float() @ hm.float(), atol=1e-2, rtol=1e-3)
    assert "gl." in tritile.compile(hadamard_gemm(M, N, 32), out_idx=[2], target="cuda:90").get_source("gluon")


def butterfly(batch, n):
    """example_hadamard.py's steps 1, 2 and 5 in a kernel of one thread (its thread count for
    n <= 8), with its shared exchange buffer annotated and a warp shuffle of the one lane."""

    @T.prim_func
    def main(A: T.Tensor((batch, n), T.float32), B: T.Tensor((batch, n), T.float32)):
        with T.Kernel(batch, threads=1) as bx:
            local = T.alloc_local((n,), T.float32)
            other = T.alloc_local((n,), T.float32)
            shared = T.alloc_shared((1, n), T.float32)
            T.annotate_layout({shared: make_mma_swizzle_layout(shared)})
            tx = T.get_thread_binding(0)
            for i in T.vectorized(n):
                local[i] = A[bx, tx * n + i]
            for r in T.serial(n.bit_length() - 1):
                size = 1 << (r + 1)
                for j in T.serial(n // size):
                    for k in T.serial(size // 2):
                        local[j * size + k] = local[j * size + k] + local[j * size + k + size // 2]
                        local[j * size + k + size // 2] = local[j * size + k] - 2 * local[j * size + k + size // 2]
            for j in T.serial(n):
                other[j] = T.tvm_warp_shuffle(0xFFFFFFFF, local[j], (tx ^ 1) % 1, 1, 1)
            for j in T.vectorized(n):
                shared[tx, j] = other[j]
            for i in T.vectorized(n):
                B[bx, tx * n + i] = shared[tx, i]

    return main


@pytest.mark.parametrize("n", [2, 8])
def test_in_thread_butterfly_with_an_unswizzled_annotation(n):
    a = torch.randn(3, n)
    out = tritile.compile(butterfly(3, n), out_idx=[1])(a)
    torch.testing.assert_close(out, a @ sylvester(n).T, atol=1e-5, rtol=1e-5)


def test_make_mma_swizzle_layout_is_tilelangs_choice():
    @T.prim_func
    def main(A: T.Tensor((32, 64), T.float16)):
        with T.Kernel(1, threads=128) as bx:
            wide = T.alloc_shared((32, 64), T.float16)  # 128-byte rows: swizzled
            narrow = T.alloc_shared((4, 8), T.float32)  # 32-byte rows: TileLang's identity layout
            assert isinstance(make_mma_swizzle_layout(wide), SwizzledLayout)
            assert not isinstance(make_mma_swizzle_layout(wide, is_smooth=True), SwizzledLayout)
            identity = make_mma_swizzle_layout(narrow)
            assert identity(3, 5) == [3, 5] and identity.get_output_shape() == (4, 8)
            T.annotate_layout({wide: make_mma_swizzle_layout(wide), narrow: identity})
            T.copy(A, wide)


def test_get_swizzle_layout_permutes_16_byte_vectors_in_each_row():
    rows, cols = torch.arange(8).view(-1, 1), torch.arange(64).view(1, -1)
    tile, row, col = get_swizzle_layout(rows, cols, 64, T.float16)  # 128-byte rows, 8 vectors of 8
    assert int(torch.as_tensor(tile).max()) == 0 and torch.equal(row.expand(8, 64), rows.expand(8, 64))
    assert torch.equal(col[0], cols[0])  # row 0 is not moved
    for r in range(8):
        assert sorted(col[r].tolist()) == list(range(64))
        assert torch.equal(col[r] // 8, (cols[0] // 8) ^ r) and torch.equal(col[r] % 8, cols[0] % 8)
    assert get_swizzle_layout(3, 9, 64, "float16") == (0, 3, 17)
    assert get_swizzle_layout(5, 9, 32, "float16") == (0, 5, 25)  # 64-byte rows: vector 1 of row 5 -> 1 ^ 2


def test_warp_shuffle_needs_one_thread():
    with pytest.raises(tritile.CompileError) as info:
        @T.prim_func
        def main(A: T.Tensor((128,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                for i in T.Parallel(128):
                    A[i] = T.tvm_warp_shuffle(0xFFFFFFFF, A[i], 0, 32, 32)

    text = str(info.value)
    assert "threads=128" in text and "T.tvm_warp_shuffle(0xFFFFFFFF, A[i], 0, 32, 32)" in text, text
    assert "generator" not in text  # the message of the random-number builtins is not given here


# ---------------------------------------------------------------- tilelang.engine.callback

CALLBACKS = ("cuda", "hip", "c", "metal")


def test_engine_and_cuda_modules_import_under_their_tilelang_paths():
    callback = importlib.import_module("tritile.engine.callback")
    for kind in CALLBACKS:
        assert callable(getattr(callback, f"register_{kind}_postproc"))
        assert callable(getattr(callback, f"register_{kind}_postproc_callback"))
    assert tritile.engine.register_cuda_postproc is callback.register_cuda_postproc  # `import tilelang` only
    assert tritile.cuda.intrinsics.make_mma_swizzle_layout is make_mma_swizzle_layout
    assert importlib.import_module("tritile.cuda.intrinsics.layout.mma_layout").get_swizzle_layout is get_swizzle_layout


@pytest.mark.parametrize("kind", CALLBACKS)
def test_registering_a_postproc_callback_is_refused(kind):
    from tritile.engine import callback

    def postproc(code, target):
        return "// edited\n" + code

    deco = getattr(callback, f"register_{kind}_postproc_callback")
    for use in (lambda: deco(postproc), lambda: deco()(postproc), lambda: deco(override=False)(postproc),
                lambda: deco(False)(postproc), lambda: getattr(callback, f"register_{kind}_postproc")(postproc)):
        with pytest.raises(NotImplementedError, match="postproc.*not supported by tritile"):
            use()
    with pytest.raises(TypeError):
        deco("not a function or a bool")
