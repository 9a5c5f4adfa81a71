"""`T.print` (TileLang's signature): the interpreter's output (captured), the IR through every
pass, the Gluon source and sm_90 PTX (`vprintf`), its user errors, and a GPU run whose printed
values are checked."""
import re

import pytest
import torch

import tritile
import tritile.language as T
from kernels import compile_error
from tritile.lowering import PASS_NAMES


@tritile.jit(out_idx=[-1])
def printing_copy(M, N, block_M):
    @T.prim_func
    def kernel(A: T.Tensor((M, N), T.float32), B: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            tile = T.alloc_shared((block_M, N), T.float32)
            acc = T.alloc_fragment((block_M, N), T.float32)
            count = T.alloc_var(T.int32, 0)
            T.copy(A[bx * block_M, 0], tile)
            T.copy(tile, acc)
            for i, j in T.Parallel(block_M, N):
                acc[i, j] = acc[i, j] * 2.0
            T.print(acc, msg="acc")
            T.print(tile)
            T.print(A[bx * block_M, 1])
            count = count + bx * 10
            T.print(count, msg="count")
            T.print(msg="done")
            T.copy(acc, B[bx * block_M, 0])

    return kernel


def _tile_lines(pid, msg, values):
    rows, cols = values.shape
    return [f"pid ({pid}, 0, 0) idx ({i}, {j}) {msg}: {float(values[i, j]):f}"
            for i in range(rows) for j in range(cols)]


def test_interpreter_prints_each_block_in_order(capsys):
    a = torch.randn(8, 4)
    b = printing_copy(8, 4, 4)(a)
    torch.testing.assert_close(b, a * 2.0)
    expected = []
    for bx in range(2):
        rows = a[bx * 4:(bx + 1) * 4]
        expected += _tile_lines(bx, "acc", rows * 2.0)
        expected += _tile_lines(bx, "buffer<tile, float32>", rows)
        expected.append(f"pid ({bx}, 0, 0) idx () expr<A[bx * 4, 1]>: {float(a[bx * 4, 1]):f}")
        expected.append(f"pid ({bx}, 0, 0) idx () count: {bx * 10}")
        expected.append(f"pid ({bx}, 0, 0) done")
    assert capsys.readouterr().out.splitlines() == expected


def test_print_survives_every_pass_and_compiles_to_vprintf():
    kernel = printing_copy(64, 32, 16)
    for stage in ("tile", *PASS_NAMES):
        text = kernel.get_source(stage)
        assert "T.print(acc[:, :], msg='acc')" in text and "T.print(None, msg='done')" in text, stage
    gluon = kernel.get_source("gluon")
    assert "gl.device_print('acc', acc)" in gluon
    assert re.search(r"gl\.device_print\('count', count\w*\)", gluon)
    assert "gl.device_print(' done')" in gluon
    assert re.search(r"gl\.device_print\('buffer<tile, float32>', tile\.load\(\w+\)\)", gluon)
    assert "vprintf" in kernel.get_source("ptx")


def test_print_in_a_pipelined_loop_follows_the_schedule(capsys):
    @T.prim_func
    def summed(A: T.Tensor((64, 32), T.float32), B: T.Tensor((16, 32), T.float32)):
        with T.Kernel(1, threads=128):
            tile = T.alloc_shared((16, 32), T.float32)
            acc = T.alloc_fragment((16, 32), T.float32)
            T.clear(acc)
            for k in T.Pipelined(4, num_stages=2):
                T.copy(A[k * 16, 0], tile)
                T.print(k, msg="k")
                for i, j in T.Parallel(16, 32):
                    acc[i, j] = acc[i, j] + tile[i, j]
            T.copy(acc, B[0, 0])

    kernel = tritile.compile(summed, out_idx=[-1], target="cpu")
    assert "software-pipelined" in kernel.get_source("pipeline_injection")
    a = torch.randn(64, 32)
    torch.testing.assert_close(kernel(a), a.view(4, 16, 32).sum(0), rtol=1e-5, atol=1e-5)
    assert capsys.readouterr().out.splitlines() == [f"pid (0, 0, 0) idx () k: {k}" for k in range(4)]


def test_eager_style_and_message_munging(capsys):
    @tritile.jit
    def show(A):
        N = T.const("N")
        A: T.Tensor[[N], T.int32]
        with T.Kernel(1, threads=32):
            T.print(A[2], msg="value:")
            T.print(msg="ok")

    a = torch.randint(-100, 100, (8,), dtype=torch.int32)
    show(a)
    assert capsys.readouterr().out.splitlines() == [f"pid (0, 0, 0) idx () value: {int(a[2])}", "pid (0, 0, 0) ok"]




def test_print_errors_quote_the_line():
    def in_parallel():
        @T.prim_func
        def f(A: T.Tensor((16,), T.float32)):
            with T.Kernel(1):
                frag = T.alloc_fragment((16,), T.float32)
                for i in T.Parallel(16):
                    T.print(frag[i])

    def global_tensor():
        @T.prim_func
        def f(A: T.Tensor((16,), T.float32)):
            with T.Kernel(1):
                T.print(A)

    def string_object():
        @T.prim_func
        def f(A: T.Tensor((16,), T.float32)):
            with T.Kernel(1):
                T.print("hello")

    def nothing():
        @T.prim_func
        def f(A: T.Tensor((16,), T.float32)):
            with T.Kernel(1):
                T.print()

    assert "inside T.Parallel" in compile_error(in_parallel)
    assert "global tensor A" in compile_error(global_tensor) and "T.print(A)" in compile_error(global_tensor)
    assert "msg=" in compile_error(string_object)
    assert "non-empty msg" in compile_error(nothing)


@pytest.mark.gpu
def test_gpu_prints_the_values(capfd):
    a = torch.randn(32, 16, device="cuda")
    kernel = printing_copy(32, 16, 16)
    torch.cuda.synchronize()
    capfd.readouterr()
    b = kernel(a)
    torch.cuda.synchronize()
    torch.testing.assert_close(b, a * 2.0)
    out = capfd.readouterr().out
    pattern = re.compile(r"pid \((\d+), 0, 0\) idx \(\s*(\d+),\s*(\d+)\) acc: (\S+)")
    seen = {}
    for bx, i, j, value in pattern.findall(out):
        seen[(int(bx), int(i), int(j))] = float(value)  # threads holding a replica print it again
    expected = {(bx, i, j): float(a[bx * 16 + i, j] * 2.0) for bx in range(2) for i in range(16) for j in range(16)}
    assert seen.keys() == expected.keys()
    for key, value in expected.items():
        assert seen[key] == pytest.approx(value, abs=1e-5)
    counts = set(re.findall(r"pid \((\d+), 0, 0\) idx \(\) count: (-?\d+)", out))
    assert counts == {("0", "0"), ("1", "10")}
    assert re.search(r"pid \(1, 0, 0\) done", out)
