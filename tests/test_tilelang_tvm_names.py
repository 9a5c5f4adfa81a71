"""The names of TVM that TileLang's programs import (`from tilelang import tvm as tvm`, `from tvm
import DataType, tirx`; examples/dequantize_gemm's bit-twiddling dequantizers, examples/gemv's
`DataType(dtype).bits`): tritile.tvm's `DataType` and `tirx` on tritile's expressions - a packed
fp4 (e2m1) decode to bfloat16 written with typed `tirx.const`s, `tirx.reinterpret`, `tirx.Min`,
`tirx.Select`, `tirx.Cast`, bit-exact against a torch bit-level reference on tritile's
interpreter and Triton's interpreter of the triton.language backend, and sm_90 PTX."""
import pytest
import torch

import tritile
import tritile.language as T
from tritile import tvm

BACKENDS = ["auto", "triton"]  # on CPU tensors: tritile's interpreter / Triton's interpreter
tirx = tvm.tirx


def fp4_to_bf16(nbit, packed, pos, scale):
    """An e2m1 nibble of `packed` (a uint16) as a bfloat16's bits, exponent rebased and shifted by
    `scale`, as TileLang's examples build it: every constant a uint16."""
    mask = tirx.const((1 << nbit) - 1, T.uint16)
    f4 = (packed >> (pos.astype(T.uint16) * tirx.const(nbit, T.uint16))) & mask
    sign = f4 >> tirx.const(3, T.uint16)
    exponent = tirx.Min(((f4 & tirx.const(6, T.uint16)) >> tirx.const(1, T.uint16)) + tirx.const(126, T.uint16) + scale,
                        tirx.const(255, T.uint16))
    mantissa = f4 & tirx.const(1, T.uint16)
    bits = (((sign << tirx.const(8, T.uint16)) | exponent) << tirx.const(7, T.uint16)) | (mantissa << tirx.const(6, T.uint16))
    return tirx.reinterpret(T.bfloat16, bits.astype(T.uint16))


def widened(packed):
    """TileLang's helpers check the element type of the access they are given."""
    assert packed.dtype == T.uint8
    return packed.astype(T.uint16)


def dequantize_program(n=128):
    @T.prim_func
    def main(Q: T.Tensor((n // 2,), T.uint8), S: T.Tensor((n,), T.uint8), O: T.Tensor((n,), T.bfloat16),
             Z: T.Tensor((n,), T.float32)):
        with T.Kernel(1, threads=128):
            for i in T.Parallel(n):
                O[i] = fp4_to_bf16(4, widened(Q[i // 2]), i % 2, tirx.Cast(T.uint16, S[i]))
                Z[i] = tirx.Select(O[i] == 0, tirx.const(1, T.float32), tirx.Cast(T.float32, O[i]))

    return main


def reference(q, s):
    nibbles = torch.stack([q.long() & 15, q.long() >> 4], dim=1).reshape(-1)
    exponent = torch.clamp(((nibbles & 6) >> 1) + 126 + s.long(), max=255)
    bits = ((((nibbles >> 3) << 8) | exponent) << 7) | ((nibbles & 1) << 6)
    out = bits.to(torch.int32).to(torch.int16).view(torch.bfloat16)
    return out, torch.where(out == 0, torch.ones(()), out.float())


@pytest.mark.parametrize("backend", BACKENDS)
def test_tirx_dequantizer_is_bit_exact(backend):
    torch.manual_seed(3)
    q = torch.randint(0, 256, (64,), dtype=torch.uint8)
    s = torch.randint(0, 4, (128,), dtype=torch.uint8)
    o, z = torch.empty(128, dtype=torch.bfloat16), torch.empty(128)
    tritile.compile(dequantize_program(), backend=backend)(q, s, o, z)
    want_o, want_z = reference(q, s)
    assert torch.equal(o.view(torch.int16), want_o.view(torch.int16))
    assert torch.equal(z, want_z)


@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_tirx_dequantizer_compiles_for_hopper(backend):
    kernel = tritile.compile(dequantize_program(), target="cuda:90", backend=backend)
    assert ".target sm_90" in kernel.get_source("ptx")


def test_datatype_and_constants():
    assert tvm.DataType("float16").bits == 16 and tvm.DataType(T.bfloat16).bits == 16
    assert tvm.DataType("int8").lanes == 1 and str(tvm.DataType("float32")) == "float32"
    constant = tirx.const(3, T.uint16)
    assert isinstance(constant, tirx.PrimExpr) and constant.dtype == T.uint16 and tirx.const(2).dtype == T.int32
    assert tirx.reinterpret("int32", 1.0) == 0x3F800000  # numbers fold, as T.reinterpret's
    with pytest.raises(AttributeError, match="tritile has no TVM.*DataType and tirx"):
        tvm.ir  # noqa: B018


def test_import_tvm_gives_tritiles_where_no_tvm_is_installed():
    """TileLang's programs write `from tvm import tirx` after `import tilelang` (and `from
    tilelang import DataType`); the finder `import tritile` installs goes last, after any real TVM."""
    import importlib.util

    spec = importlib.util.find_spec("tvm")
    if not isinstance(spec.loader, tritile.tvm_import._TileLangTVMFinder):
        pytest.skip("a real TVM is installed: tritile leaves it alone")
    from tvm import DataType, tirx as imported_tirx

    assert DataType("uint8").bits == 8 and imported_tirx is tirx and tritile.DataType("int16").bits == 16
    assert tvm.__spec__.name == "tritile.tvm"  # the alias does not rename the module
