"""Layout inference: encodings per buffer, swizzle choice, reconciliation, order independence."""
from __future__ import annotations

import pytest
from triton.experimental.gluon import language as gl

from test_codegen import A100, H100, pipelined_gemm, shared_operand_two_gemms, softmax_rows
from tritile.ir import dtypes as dt
from tritile.ir import layouts as lay
from tritile.ir import nodes as ir
from tritile.ir.transform import walk
from tritile.lowering import layout_inference
from tritile.runtime.target import Target


def before_layouts(func, target):
    """The IR layout inference receives: the pass list up to the shared-memory budget."""
    from tritile.lowering import run_passes

    return run_passes(func, target, stop_after="shared_memory_budget")[-1][1]


def infer(func, target):
    return layout_inference.run(before_layouts(func, target), target)


def layouts_by_name(func) -> dict:
    return {n.buffer.name: n.buffer.layout for n in walk(func.kernel.body) if isinstance(n, ir.Alloc)}


@pytest.mark.parametrize("shape,bits,transposed,swizzle", [
    ([128, 64], 16, False, 128), ([64, 32], 16, False, 64), ([64, 16], 16, False, 32),
    ([64, 8], 16, False, 0), ([4, 64], 16, False, 0), ([64, 128], 8, False, 128),
    ([32, 64], 32, False, 128), ([64, 128], 16, True, 128), ([16, 64], 16, True, 32),
])
def test_nvmma_swizzle_matches_gluon_default(shape, bits, transposed, swizzle):
    ours = lay.nvmma_default_for(shape, bits, transposed)
    gl_dtype = {8: gl.float8e4nv, 16: gl.float16, 32: gl.float32}[bits]
    theirs = gl.NVMMASharedLayout.get_default_for(shape, gl_dtype, transposed=transposed)
    assert ours.swizzle_byte_width == theirs.swizzle_byte_width == swizzle
    assert ours.element_bitwidth == theirs.element_bitwidth
    assert ours.transposed == theirs.transposed


def test_layouts_print_as_gluon_constructors():
    acc = lay.wgmma_accumulator(128, 128, 4, "Square", 16)
    text = str(lay.SliceLayout(1, acc))
    built = eval(text, {"gl": gl})
    assert isinstance(built, gl.SliceLayout)
    assert built.parent == gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16])


def test_pipelined_gemm_sm90_encodings_and_identity_chain():
    func = before_layouts(pipelined_gemm(BM=128, BN=128, BK=64, S=3), H100)
    old = {n.buffer.name: n.buffer for n in walk(func.kernel.body) if isinstance(n, ir.Alloc)}
    out = layout_inference.run(func, H100)
    got = layouts_by_name(out)
    # versioned [3, 128, 64] buffer: the encoding of one [128, 64] tile
    assert got["A_shared"] == lay.NVMMASharedLayout(128, 16, 2, False)
    assert got["B_shared"] == lay.NVMMASharedLayout(128, 16, 2, False)
    assert got["C_local"] == lay.NVMMADistributedLayout((3, 0), (4, 1), (16, 128, 16))
    new = {n.buffer.name: n.buffer for n in walk(out.kernel.body) if isinstance(n, ir.Alloc)}
    assert new["A_shared"].origin is old["A_shared"]
    assert new["A_shared"].root is old["A_shared"].root
    assert new["A_shared"].num_versions == 3
    # every reference was substituted: no stale buffer without a layout remains
    for n in walk(out.kernel.body):
        if isinstance(n, ir.Region) and n.buffer.scope != "global":
            assert n.buffer.layout is not None


def test_pipelined_gemm_sm80_encodings():
    got = layouts_by_name(infer(pipelined_gemm(BK=32), A100))
    assert isinstance(got["A_shared"], lay.SwizzledSharedLayout)
    assert got["A_shared"].vec == 8
    assert got["C_local"].version == (2, 0)


def test_eight_warps_square_policy_splits_m_first():
    got = layouts_by_name(infer(pipelined_gemm(threads=256), H100))
    assert got["C_local"].warps_per_cta == (8, 1)


@pytest.mark.parametrize("target", [H100, A100], ids=["sm90", "sm80"])
def test_seed003_reconciliation_is_order_independent(target):
    first = layouts_by_name(infer(shared_operand_two_gemms(order=(0, 1)), target))
    second = layouts_by_name(infer(shared_operand_two_gemms(order=(1, 0)), target))
    assert first == second
    # one encoding for X_s serves the K-major (transpose_B) and the MN-major use
    assert first["X_s"] == first["Y_s"]
    if target is H100:
        assert first["X_s"] == lay.NVMMASharedLayout(128, 16, 2, False)


def test_reduction_results_are_slices_of_their_source():
    got = layouts_by_name(infer(softmax_rows(), H100))
    assert got["row_max"] == lay.SliceLayout(1, got["x_frag"])
    assert got["row_sum"] == lay.SliceLayout(1, got["x_frag"])


def test_annotated_layout_is_kept():
    func = before_layouts(pipelined_gemm(), H100)
    alloc = func.kernel.body.stmts[0]
    pinned = lay.NVMMASharedLayout(64, 16, 2, False)
    alloc.buffer.annotated_layout = pinned
    got = layouts_by_name(layout_inference.run(func, H100))
    assert got["A_shared"] is pinned


def test_cpu_target_is_untouched():
    func = pipelined_gemm()
    assert layout_inference.run(func, Target("cpu")) is func


def test_fp32_gemm_uses_fma_blocked_accumulator():
    got = layouts_by_name(infer(pipelined_gemm(dtype=dt.float32, BK=32), H100))
    assert isinstance(got["C_local"], lay.BlockedLayout)
