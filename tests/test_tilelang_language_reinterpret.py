"""TileLang's `T.reinterpret(value, dtype)`: a value's bits read as another type of the same width
(deepseek_v4/act_quant.py's fast_log2_ceil / fast_pow2, IEEE-754 exponent arithmetic), on
tritile's interpreter, the triton.language backend under Triton's interpreter, and sm_90 PTX of
both backends."""
import pytest
import torch

import tritile
import tritile.language as T

BACKENDS = ["auto", "triton"]  # on CPU tensors: tritile's interpreter / Triton's interpreter


def fast_log2_ceil(x):
    bits_x = T.reinterpret(x, "uint32")
    exp_x = (bits_x >> 23) & 0xFF
    man_bits = bits_x & ((1 << 23) - 1)
    return T.Cast("int32", exp_x - 127 + T.if_then_else(man_bits != 0, 1, 0))


def fast_pow2(x):
    bits_x = (x + 127) << 23
    return T.reinterpret(bits_x, "float32")


def exponent_program(n=128):
    @T.prim_func
    def main(X: T.Tensor((n,), T.float32), H: T.Tensor((n,), T.bfloat16), E: T.Tensor((n,), T.int32),
             P: T.Tensor((n,), T.float32), Bits: T.Tensor((n,), T.int16), Back: T.Tensor((n,), T.bfloat16)):
        with T.Kernel(1, threads=128):
            x = T.alloc_fragment((n,), T.float32)
            T.copy(X, x)
            for i in T.Parallel(n):
                E[i] = fast_log2_ceil(x[i])
                P[i] = fast_pow2(fast_log2_ceil(x[i]))
                Bits[i] = T.reinterpret(H[i], "int16")
                Back[i] = T.reinterpret(T.reinterpret(H[i], "int16"), "bfloat16")

    return main


def reference(x, h):
    bits = x.view(torch.int32).long() & 0xFFFFFFFF
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & ((1 << 23) - 1)) != 0).long()
    p = ((e + 127) << 23).int().view(torch.float32)
    return e.int(), p, h.view(torch.int16), h


@pytest.mark.parametrize("backend", BACKENDS)
def test_reinterpret_matches_torch_bit_views(backend):
    torch.manual_seed(7)
    x = torch.rand(128) * 1000 + 1e-3
    x[:8] = torch.tensor([1.0, 2.0, 0.5, 448.0, 3.0, 1024.0, 0.75, 300.0])  # exact powers of two and not
    h = torch.randn(128).bfloat16()
    outs = [torch.zeros(128, dtype=torch.int32), torch.zeros(128), torch.zeros(128, dtype=torch.int16),
            torch.zeros(128, dtype=torch.bfloat16)]
    kernel = tritile.compile(exponent_program(), backend=backend)
    kernel(x, h, *outs)
    for got, want in zip(outs, reference(x, h)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_reinterpret_compiles_for_hopper(backend):
    kernel = tritile.compile(exponent_program(), target="cuda:90", backend=backend)
    assert ".target sm_90" in kernel.get_source("ptx")


def test_reinterpret_folds_python_numbers_and_refuses_other_widths():
    assert T.reinterpret(1.0, "int32") == 0x3F800000
    assert T.reinterpret(0x40000000, "float32") == 2.0

    with pytest.raises(tritile.CompileError, match="float32 and float16 are not of the same width"):
        @T.prim_func
        def wrong(X: T.Tensor((16,), T.float32), Y: T.Tensor((16,), T.float16)):
            with T.Kernel(1, threads=32):
                for i in T.Parallel(16):
                    Y[i] = T.reinterpret(X[i], "float16")
