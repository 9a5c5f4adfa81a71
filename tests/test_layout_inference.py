"""Layout inference: encodings per buffer, swizzle choice, reconciliation, order independence."""
from __future__ import annotations

import re

import pytest
from triton.experimental.gluon import language as gl

from test_codegen import A100, H100, pipelined_gemm, shared_operand_two_gemms, softmax_rows
from tritile.errors import CompileError
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


@pytest.mark.parametrize("m, n, num_warps, warps", [(192, 64, 12, (12, 1)), (64, 192, 12, (4, 3)), (256, 128, 8, (8, 1)),
                                                    (64, 256, 8, (4, 2)), (128, 128, 4, (4, 1))])
def test_square_policy_splits_warps_by_prime_factors(m, n, num_warps, warps):
    """Three warpgroups (12 warps) once doubled [4, 1] past 12 forever (a compiler hang)."""
    assert lay.wgmma_accumulator(m, n, num_warps, "Square", 16).warps_per_cta == warps


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


# ------------------------------------------------------------------ backend gaps closed
# (the kernels themselves compile to PTX in tests/test_kernels_compile.py; these pin down
# the layout / instruction decisions behind them)

def frontend_ir(jit_kernel):
    return jit_kernel.stages[0][1]


def gluon_source(func, target):
    from tritile.codegen.gluon.kernel_module import emit_module

    return emit_module(infer(func, target), target).source


TARGETS = pytest.mark.parametrize("target", [H100, A100], ids=["sm90", "sm80"])


@TARGETS
@pytest.mark.parametrize("trans_a, trans_b, operand", [(True, False, "A"), (True, True, "A"),
                                                       (False, True, "B"), (True, True, "B")])
def test_transposed_register_operand_is_permuted_in_registers(target, trans_a, trans_b, operand):
    from test_kernels_gemm import matmul_register_operand

    func = frontend_ir(matmul_register_operand(128, 128, 128, 64, 64, 32, trans_a, trans_b, operand, 0))
    got = layouts_by_name(infer(func, target))
    # stored (K, M) / (N, K): no operand layout of its own, the dot gets its permutation
    assert isinstance(got[f"{operand}_local"], lay.BlockedLayout)
    assert f"gl.permute({operand}_local, (1, 0))" in gluon_source(func, target)


@TARGETS
@pytest.mark.parametrize("trans_b", [False, True], ids=["B_KN", "B_NK"])
def test_register_b_operand_takes_mma_sync(target, trans_b):
    from test_kernels_gemm import matmul_register_operand
    from tritile.ir import instructions as isel

    func = before_layouts(frontend_ir(matmul_register_operand(128, 128, 128, 64, 64, 32, False, trans_b, "B", 0)),
                          target)
    gemm = next(n for n in walk(func.kernel.body) if isinstance(n, ir.Gemm))
    assert isel.gemm_engine(gemm, target, 4) == "mma_v2"  # wgmma reads B from shared only


@TARGETS
@pytest.mark.parametrize("block_K, home", [(8, True), (128, False)])
def test_fma_register_operand_is_its_home_layout_only_while_small(target, block_K, home):
    """An FMA dot operand layout gives each thread the whole K extent of its rows: 8 rows a
    thread here, 64 registers at K = 8 (kept: no conversion a k-step), 1024 at K = 128
    (converted at the gemm: held across the loop, ptxas spent minutes on such a tile)."""
    from test_kernels_gemm import matmul

    func = frontend_ir(matmul(128, 128, 256, 64, 64, block_K, False, False, "float32", "float32", "float32", 2,
                              register_operand="A"))
    got = layouts_by_name(infer(func, target))["A_local"]
    assert isinstance(got, lay.DotOperandLayout) == home
    if not home:
        assert isinstance(got, lay.BlockedLayout)
        assert re.search(r"gl\.dot_fma\(gl\.convert_layout\(A_local, layout\d+\)", gluon_source(func, target))


def test_fma_gemm_computes_in_the_accumulator_dtype():
    # K = 8 fp16: too short for mma.sync / wgmma, so the FMA engine with fp16 operands
    src = gluon_source(pipelined_gemm(M=64, N=64, K=64, BM=64, BN=64, BK=8, S=2), A100)
    dot = next(line for line in src.splitlines() if "gl.dot_fma(" in line)
    assert dot.count(".to(gl.float32)") == 2


@TARGETS
@pytest.mark.parametrize("dim", [0, 1])
def test_keep_dim_reduction_result_shares_its_source_layout(target, dim):
    from test_kernels_reduce import reduce_rows_or_cols

    func = frontend_ir(reduce_rows_or_cols(64, 128, "sum", dim, False, keep_dim=True))
    got = layouts_by_name(infer(func, target))
    assert got["B_local"] == got["A_local"]
    assert "gl.expand_dims(" in gluon_source(func, target)


def _async_copy(shape, dtype, starts, extents):
    src = ir.Buffer("A", shape, dtype, "global")
    dst = ir.Buffer("A_shared", tuple(extents), dtype, "shared")
    return ir.AsyncCopy(ir.Region(src, tuple(starts), tuple(extents)), ir.Region.full(dst))


@pytest.mark.parametrize("shape, dtype, last_start, extents, ok", [
    ((128, 128), dt.float16, ir.BinOp("*", ir.Var("k"), ir.const(32)), (64, 32), True),
    ((128, 34), dt.float16, ir.const(0), (64, 32), True),  # 4-byte aligned rows
    ((128, 33), dt.float16, ir.const(0), (64, 32), False),  # odd fp16 row stride
    ((128, ir.Var("K")), dt.float16, ir.const(0), (64, 32), False),  # runtime row stride
    ((128, 128), dt.float16, ir.Var("k"), (64, 32), False),  # column start of unknown parity
    ((128, 128), dt.float16, ir.const(0), (64, 1), False),  # a column: 2-byte vectors
    ((128, ir.Var("K")), dt.float32, ir.Var("k"), (64, 32), True),  # 4-byte elements: always
    ((128, 130), dt.int8, ir.const(0), (64, 32), False),  # 1-byte elements need 4 | row stride
])
def test_cp_async_only_where_4_byte_vectors_are_provable(shape, dtype, last_start, extents, ok):
    from tritile.ir import instructions as isel

    assert isel.uses_cp_async(_async_copy(shape, dtype, (ir.const(0), last_start), extents)) is ok


@TARGETS
def test_unaligned_async_copy_falls_back_to_a_synchronous_store(target):
    from test_kernels_pipeline import COMPILE_CASES

    src = gluon_source(frontend_ir(COMPILE_CASES["matmul_plain-K33-s2"]()), target)
    a_copies = [line for line in src.splitlines() if "gl.load(A + " in line]
    assert a_copies and all(".store(gl.load(A + " in line for line in a_copies)  # A (M, 33): synchronous
    # B (33, 128): rows stay 16-byte aligned, B keeps its asynchronous path
    b_copy = "tma.async_copy_global_to_shared(B_desc" if target is H100 else "cp.async_copy_global_to_shared(B_shared"
    assert b_copy in src


@TARGETS
def test_shared_vector_broadcast_in_parallel_loads_a_slice(target):
    from test_kernels_elementwise import bias_add_tiles

    src = gluon_source(frontend_ir(bias_add_tiles(128, 192, 64, 64, "col")), target)
    assert re.search(r"bias_col\.load\(\w+\)\[:, None\]", src)


def test_unsupported_unit_dim_copy_is_a_compile_error_at_the_statement():
    from test_codegen import compile_for

    loc = ir.SourceLoc("kernel.py", 7, 0, "T.copy(v_shared, row)")
    g = ir.Buffer("G", (128,), dt.float32, "global")
    out = ir.Buffer("O", (1, 128), dt.float32, "global")
    v = ir.Buffer("v_shared", (128,), dt.float32, "shared")
    row = ir.Buffer("row", (1, 128), dt.float32, "fragment")
    stmts = [ir.Alloc(v), ir.Alloc(row), ir.Copy(ir.Region.full(g), ir.Region.full(v)),
             ir.Copy(ir.Region.full(v), ir.Region.full(row), loc=loc), ir.Copy(ir.Region.full(row), ir.Region.full(out))]
    bx = ir.Var("bx")
    func = ir.PrimFunc("unit_dims", [g, out], ir.Kernel((ir.const(1),), (bx,), 128, ir.Seq(stmts)), out_idx=[1])
    with pytest.raises(CompileError) as info:
        compile_for(func, H100)
    assert info.value.loc == loc
    assert "not supported by the Gluon backend" in info.value.message
