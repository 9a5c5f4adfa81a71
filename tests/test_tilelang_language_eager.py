"""TileLang's `tilelang.language.eager` package in tritile (`tritile.language.eager`): its entry
points on tritile's own frontend and JIT, `ast.mutate`, the subscript form of `T.Tensor`, and
augmented assignment to an immutable scalar (a rebind), inside a kernel and in a `@T.prim_func`
of host code only (which builds, as in TileLang, and does not compile)."""
import pytest
import torch

import tritile
import tritile.language as T
import tritile.language.eager as eager
from tritile.errors import CompileError
from tritile.ir.printer import format_func
from tritile.language.eager.ast import mutate


def test_tensor_subscript_is_the_call():
    for subscript, call in [(T.Tensor[(1,), T.int32], T.Tensor((1,), T.int32)),
                            (T.Tensor[1, T.int32], T.Tensor(1, T.int32)),
                            (T.Tensor[[4, 8], "float16"], T.Tensor([4, 8], "float16")),
                            (T.Tensor[4, 8], T.Tensor((4, 8))),
                            (T.Tensor[(4, 8)], T.Tensor((4, 8)))]:
        assert (subscript.shape, subscript.dtype) == (call.shape, call.dtype)


def test_augassign_on_an_immutable_scalar_rebinds_in_a_kernel(device):
    @T.prim_func
    def main(A: T.Tensor[(4,), T.int32], B: T.Tensor[(4,), T.int32]):
        with T.Kernel(1, threads=32) as _:
            x = A[0]
            x -= 1
            x *= A[1]
            B[0] = x
            B[1] = A[0]  # the element itself is unchanged

    assert "x = x - 1" in format_func(main)
    kernel = tritile.compile(main, out_idx=[1])
    a = torch.randint(-50, 50, (4,), dtype=torch.int32, device=device)
    b = kernel(a)
    assert b[0].item() == (a[0].item() - 1) * a[1].item() and b[1].item() == a[0].item()
    assert ".target sm_90" in kernel.get_source("ptx")


def test_prim_func_of_host_code_only_builds_and_does_not_compile():
    @T.prim_func
    def main(A: T.Tensor[(1,), T.int32], B: T.Tensor[(1,), T.int32]):
        x = A[0]
        x -= 1
        B[0] = x

    assert main.kernel is None and [p.name for p in main.params] == ["A", "B"]
    assert "host code only" in format_func(main)
    with pytest.raises(CompileError, match="main has no `with T.Kernel"):
        tritile.compile(main, out_idx=[1])


def test_host_statements_beside_a_kernel_are_an_error():
    def main(A: T.Tensor((1,), T.int32), B: T.Tensor((1,), T.int32)):
        B[0] = A[0]
        with T.Kernel(1) as _:
            B[0] = A[0]

    with pytest.raises(CompileError, match="outside `with T.Kernel") as err:
        T.prim_func(main)
    assert "B[0] = A[0]" in str(err.value)


def test_mutate_source_and_type_hints():
    def demo(A: T.Tensor[(1,), T.int32], B: T.Tensor[(1,), T.int32]):
        value = A[0]
        value -= 1
        B[0] = value

    def eager_style(X, n):
        X: T.Tensor[[4], T.float16]
        n: T.int32
        return X

    generator = mutate(demo)
    assert generator.source.splitlines() == [
        "def demo(A: T.Tensor[(1,), T.int32], B: T.Tensor[(1,), T.int32]):",
        "    value = A[0]", "    value -= 1", "    B[0] = value"]
    assert generator.extra_type_hints == {}
    assert mutate(eager_style).extra_type_hints == {"X": T.Tensor, "n": T.int32}
    with pytest.raises(NotImplementedError, match="IRGenerator.gen of demo"):
        generator.gen


def test_eager_entry_points_are_tritiles():
    assert eager.macro is T.macro and eager.const is T.const and eager.float16 is T.float16
    assert eager.PrimFunc is tritile.ir.nodes.PrimFunc

    def double(A: T.Tensor((64,), T.float32), B: T.Tensor((64,), T.float32)):
        with T.Kernel(1, threads=64) as _:
            for i in T.Parallel(64):
                B[i] = A[i] * 2

    func = eager.prim_func(double)
    assert isinstance(func, eager.PrimFunc)
    a = torch.randn(64)
    torch.testing.assert_close(tritile.compile(func, out_idx=[1])(a), a * 2)

    def triple(A, block: int = 32):
        N = T.const("N")
        A: T.Tensor[[N], T.float32]
        B = T.empty([N], T.float32)
        with T.Kernel(T.ceildiv(N, block), threads=32) as bx:
            for i in T.Parallel(block):
                B[bx * block + i] = A[bx * block + i] * 3
        return B

    jitted = eager.prim_func(triple, eager_jit=True)
    assert isinstance(jitted, eager.JITFunc)
    a = torch.randn(96)
    torch.testing.assert_close(jitted(a), a * 3)


@pytest.mark.parametrize("name", ["annotate_compile_flags", "annotate_pass_configs"])
def test_eager_names_without_a_counterpart_say_so(name):
    with pytest.raises(NotImplementedError, match=f"tilelang.language.eager.{name} has no counterpart"):
        getattr(eager, name)(None)
    assert eager.Ref is T.Ref  # tests/test_tilelang_language_eager_jit.py
