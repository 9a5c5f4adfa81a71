"""TileLang's layout functions in tritile: `T.Layout` / `T.Fragment` evaluate their index and
thread maps, and `T.annotate_layout` takes them (a placement hint on on-chip buffers; logical
addressing kept on global tensors, see tritile/language/layout.py) with results unchanged."""
import pytest
import torch

import tritile
import tritile.language as T


def _dq_layout(shape):
    return T.Layout(shape, lambda b, l, d: [b, l // 8, d // 8, d % 2, 4 * (l % 8) + (d % 8) // 2])


def test_layout_maps_indices():
    layout = _dq_layout((2, 16, 16))
    assert layout(1, 9, 5) == [1, 1, 0, 1, 6]
    assert layout.get_input_shape() == (2, 16, 16)
    assert layout.get_output_shape() == (2, 2, 2, 2, 32)


def test_fragment_maps_threads_and_indices():
    frag = T.Fragment((16, 16), forward_thread_fn=lambda i, j: i * 2 + j // 8, forward_index_fn=lambda i, j: j % 8)
    assert frag.map_forward_thread([3, 9]) == 7 and frag.map_forward_index([3, 9]) == [1]
    assert frag.get_thread_size() == 32
    both = T.Fragment((4, 8), forward_fn=lambda i, j, rep: (i * 8 + j // 2 + rep * 32, j % 2), replicate=2)
    assert both.map_forward_thread([1, 3], rep=1) == 8 + 1 + 32 and both.get_thread_size() == 3 * 8 + 3 + 32 + 1


def _accumulate_then_read(B, L, D, annotate):
    """Two kernels as in FlashAttention's backward: one atomically accumulates into a float32
    tensor with a layout annotation, a second (the same annotation) reads it back."""

    @T.prim_func
    def accumulate(X: T.Tensor((B, L, D), T.float32), Acc: T.Tensor((B, L, D), T.float32)):
        with T.Kernel(B, threads=128) as b:
            tile = T.alloc_fragment((L, D), T.float32)
            if annotate:
                T.annotate_layout({Acc: _dq_layout(Acc.shape)})
            T.copy(X[b, 0, 0], tile)
            T.atomic_add(Acc[b, 0, 0], tile)

    @T.prim_func
    def read(Acc: T.Tensor((B, L, D), T.float32), Y: T.Tensor((B, L, D), T.float16)):
        with T.Kernel(B, threads=128) as b:
            tile = T.alloc_fragment((L, D), T.float32)
            if annotate:
                T.annotate_layout({Acc: _dq_layout(Acc.shape)})
            T.copy(Acc[b, 0, 0], tile)
            T.copy(tile, Y[b, 0, 0])

    return accumulate, read


@pytest.mark.parametrize("annotate", [False, True])
def test_annotated_global_accumulator_round_trip(annotate):
    accumulate, read = _accumulate_then_read(2, 16, 32, annotate)
    x = torch.randn(2, 16, 32)
    acc = torch.randn(2, 16, 32)
    expected = (acc + x).half()
    tritile.compile(accumulate)(x, acc)
    torch.testing.assert_close(tritile.compile(read, out_idx=[1])(acc), expected)


def test_fragment_layout_on_a_fragment_keeps_values():
    @T.prim_func
    def main(A: T.Tensor((16, 16), T.float32), B: T.Tensor((16, 16), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            tile = T.alloc_fragment((16, 16), T.float32)
            T.annotate_layout({tile: T.Fragment((16, 16), forward_thread_fn=lambda i, j: (i * 16 + j) // 2,
                                                 forward_index_fn=lambda i, j: j % 2)})
            T.copy(A[0, 0], tile)
            for i, j in T.Parallel(16, 16):
                tile[i, j] = tile[i, j] * 2.0 + 1.0
            T.copy(tile, B[0, 0])

    a = torch.randn(16, 16)
    torch.testing.assert_close(tritile.compile(main, out_idx=[1])(a), a * 2 + 1)
    assert "gl." in tritile.compile(main, out_idx=[1], target="cuda:90").get_source("gluon")


def test_layout_of_the_wrong_shape_is_an_error():
    with pytest.raises(tritile.CompileError, match="is for shape"):
        @T.prim_func
        def main(A: T.Tensor((16, 16), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                tile = T.alloc_shared((16, 16), T.float32)
                T.annotate_layout({tile: T.Layout((8, 16), lambda i, j: [i, j])})
                T.copy(A[0, 0], tile)


@pytest.mark.gpu
def test_annotated_global_accumulator_round_trip_gpu():
    accumulate, read = _accumulate_then_read(2, 16, 32, True)
    x = torch.randn(2, 16, 32, device="cuda")
    acc = torch.randn(2, 16, 32, device="cuda")
    expected = (acc + x).half()
    tritile.compile(accumulate)(x, acc)
    torch.testing.assert_close(tritile.compile(read, out_idx=[1])(acc), expected)


def _swizzled_copy(make_layout):
    @T.prim_func
    def main(A: T.Tensor((128, 64), T.float16), B: T.Tensor((128, 64), T.float16)):
        with T.Kernel(2, threads=128) as bx:
            A_shared = T.alloc_shared((64, 64), T.float16)
            T.annotate_layout({A_shared: make_layout(A_shared)})
            T.copy(A[bx * 64, 0], A_shared)
            T.copy(A_shared, B[bx * 64, 0])

    return main


@pytest.mark.parametrize("name", ["make_swizzled_layout", "make_full_bank_swizzled_layout",
                                  "make_half_bank_swizzled_layout", "make_quarter_bank_swizzled_layout"])
def test_swizzled_layouts_of_tilelang_layout_are_accepted(name, device):
    """TileLang's `T.annotate_layout({S: tilelang.layout.make_swizzled_layout(S)})`: tritile gives
    shared buffers their swizzle itself; the request is accepted and the values unchanged."""
    import tritile.layout

    kernel = tritile.compile(_swizzled_copy(getattr(tritile.layout, name)), out_idx=[1])
    a = torch.randn(128, 64, dtype=torch.float16, device=device)
    torch.testing.assert_close(kernel(a), a, rtol=0, atol=0)
    assert tritile.layout.Layout is T.Layout and tritile.layout.Fragment is T.Fragment


def test_swizzled_layout_of_a_fragment_is_an_error():
    import tritile.layout

    with pytest.raises(tritile.CompileError, match="swizzled layout is for shared buffers"):
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                f = T.alloc_fragment((64,), T.float32)
                T.annotate_layout({f: tritile.layout.make_swizzled_layout(f)})


def _tilelang_bank_swizzle(i, j, stride, continuous, element_size, bits):
    """TileLang's Make{Quarter,Half,Full}BankSwizzleLayout2D (src/layout/gemm_layouts.cc at
    a35008a) transcribed for one element: xor2x2(a, b) = (a + b) % 2, xor4x4 / xor8x8 by bits."""
    def xor2x2(a, b):
        return (a + b) % 2

    def xor4x4(a, b):
        return 2 * xor2x2(a // 2, b // 2) + xor2x2(a % 2, b % 2)

    def xor8x8(a, b):
        return 2 * xor4x4(a // 2, b // 2) + xor2x2(a % 2, b % 2)

    vector_size = 128 // element_size
    ts, s = i // 8, i % 8
    n = 1 << bits
    tc, c, vec = (j // vector_size) // n, (j // vector_size) % n, j % vector_size
    c_swizzle = {1: lambda: xor2x2(c, s // 4), 2: lambda: xor4x4(c, s // 2), 3: lambda: xor8x8(c, s)}[bits]()
    return [tc, ts, vec + (c_swizzle + s * n) * vector_size]


BANK_SWIZZLES = [("make_quarter_bank_swizzled_layout", 1), ("make_half_bank_swizzled_layout", 2),
                 ("make_full_bank_swizzled_layout", 3)]


@pytest.mark.parametrize("name, bits", BANK_SWIZZLES)
@pytest.mark.parametrize("stride, element_size, vectors", [(8, 16, 1), (32, 16, 2), (4, 16, 1), (16, 8, 1),
                                                           (8, 32, 3)])
def test_bank_swizzled_layout_of_integers_is_tilelang_map(name, bits, stride, element_size, vectors):
    """`make_*_bank_swizzled_layout(rows, cols, element_size)` (examples/plot_layout/layout_swizzle.py):
    a T.Layout whose map is TileLang's on every (row, col), a bijection onto its output, the same
    evaluated vectorised on index tensors."""
    import tritile.layout

    continuous = (128 // element_size) * (1 << bits) * vectors
    layout = getattr(tritile.layout, name)(stride, continuous, element_size)
    assert isinstance(layout, T.Layout) and layout.get_input_shape() == (stride, continuous)
    seen = set()
    for i in range(stride):
        for j in range(continuous):
            out = layout.map_forward_index([i, j])
            assert out == _tilelang_bank_swizzle(i, j, stride, continuous, element_size, bits), (i, j)
            seen.add(tuple(out))
    assert len(seen) == stride * continuous
    grid = layout._grid()
    tensors = [torch.as_tensor(x).expand(stride, continuous) for x in layout.map_forward_index(grid)]
    expected = [[_tilelang_bank_swizzle(i, j, stride, continuous, element_size, bits) for j in range(continuous)]
                for i in range(stride)]
    assert torch.equal(torch.stack(tensors, -1), torch.tensor(expected))
    if stride == 8 and vectors == 1:  # one tile: its offsets permute a row's 16-byte vectors only
        assert layout.get_output_shape() == (1, 1, stride * continuous)


def test_bank_swizzled_layout_checks_tilelang_shapes():
    import tritile.layout

    with pytest.raises(ValueError, match="multiple of 64"):
        tritile.layout.make_full_bank_swizzled_layout(8, 32, 16)
    with pytest.raises(ValueError, match="rows"):
        tritile.layout.make_half_bank_swizzled_layout(12, 32, 16)
    with pytest.raises(TypeError):
        tritile.layout.make_quarter_bank_swizzled_layout(8, 16)


@pytest.mark.parametrize("name, bits", BANK_SWIZZLES)
def test_bank_swizzled_layout_of_integers_annotates_a_shared_buffer(name, bits, device):
    """The integer form's T.Layout annotating a shared buffer of its shape: values unchanged."""
    import tritile.layout

    make = getattr(tritile.layout, name)

    @T.prim_func
    def main(A: T.Tensor((64, 64), T.float16), B: T.Tensor((64, 64), T.float16)):
        with T.Kernel(2, threads=128) as bx:
            A_shared = T.alloc_shared((32, 64), T.float16)
            T.annotate_layout({A_shared: make(32, 64, 16)})
            T.copy(A[bx * 32, 0], A_shared)
            for i, j in T.Parallel(32, 64):
                A_shared[i, j] = A_shared[i, j] * 2.0 + bx
            T.copy(A_shared, B[bx * 32, 0])

    a = torch.randn(64, 64, dtype=torch.float16, device=device)
    b = tritile.compile(main, out_idx=[1])(a)
    offset = torch.arange(2, device=device).repeat_interleave(32)[:, None]
    torch.testing.assert_close(b, (a.float() * 2 + offset).half(), rtol=0, atol=0)
    if device == "cpu" and bits == 3:
        for backend in ("gluon", "triton"):
            assert ".target sm_90" in tritile.compile(main, target="cuda:90", backend=backend).get_source("ptx")


def test_tilelang_math():
    import tritile.math

    assert [tritile.math.next_power_of_2(x) for x in (1, 2, 3, 192, 256)] == [1, 2, 4, 256, 256]
    assert tritile.math.cdiv(129, 64) == 3 and tritile.math.cdiv(128, 64) == 2
