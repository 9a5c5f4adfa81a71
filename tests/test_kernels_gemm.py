"""GEMM kernels written the TileLang way, run on the `device` fixture's tensors (CPU: the
reference interpreter; CUDA: the Gluon kernel, tests marked `gpu`).

Covers both `@tritile.jit` styles (lazy: returns a `@T.prim_func`; eager: `T.const` / `T.empty` /
`return C`) over the NN/TN/NT/TT layouts, fp16/bf16/fp32 and `num_stages` 0–3, padded shapes
(out-of-bounds reads give 0, writes are dropped), register operands (`T.copy(A_shared, A_local)`
then `T.gemm(A_local, ...)`), runtime `T.dynamic` sizes, a block-sparse GEMM guarded by a mask
inside `T.Pipelined`, and `T.use_swizzle`.  References are torch matmuls in float32 of the same
(rounded) inputs.
"""
import pytest
import torch

import tritile
import tritile.language as T
from kernels import gemm, gemm_eager, gemm_reference, make_operands, matmul, matmul_eager

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
LAYOUTS = [(False, False), (True, False), (False, True), (True, True)]  # (trans_A, trans_B)
LAYOUT_IDS = ["NN", "TN", "NT", "TT"]


@pytest.mark.parametrize("num_stages", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("trans_A, trans_B", LAYOUTS, ids=LAYOUT_IDS)
def test_gemm_lazy(trans_A, trans_B, dtype, num_stages, device, assert_close):
    M = N = K = 128
    kernel = matmul(M, N, K, 64, 64, 32, trans_A, trans_B, dtype, dtype, "float32", num_stages)
    a, b = make_operands(M, N, K, trans_A, trans_B, DTYPES[dtype], device)
    c = kernel(a, b)
    assert_close(c, gemm_reference(a, b, trans_A, trans_B, DTYPES[dtype]))


@pytest.mark.parametrize("num_stages", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("trans_A, trans_B", LAYOUTS, ids=LAYOUT_IDS)
def test_gemm_eager(trans_A, trans_B, dtype, num_stages, device, assert_close):
    M = N = K = 128
    tl_dtype = getattr(T, dtype)
    a, b = make_operands(M, N, K, trans_A, trans_B, DTYPES[dtype], device)
    c = matmul_eager(a, b, trans_A=trans_A, trans_B=trans_B, num_stages=num_stages,
                     in_dtype=tl_dtype, out_dtype=tl_dtype)
    assert_close(c, gemm_reference(a, b, trans_A, trans_B, DTYPES[dtype]))


def test_gemm_lazy_kernel_is_cached_per_arguments():
    args = (128, 128, 128, 64, 64, 32, False, False, "float16", "float16", "float32", 2)
    assert matmul(*args) is matmul(*args)


def test_gemm_eager_compile_returns_a_kernel(device, assert_close):
    kernel = matmul_eager.compile(M=128, N=128, K=128, num_stages=2)
    a, b = make_operands(128, 128, 128, False, False, torch.float16, device)
    assert_close(kernel(a, b), gemm_reference(a, b, False, False, torch.float16))


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("trans_A, trans_B", LAYOUTS, ids=LAYOUT_IDS)
def test_gemm_padded_shape(trans_A, trans_B, dtype, device, assert_close):
    M, N, K = 200, 136, 72  # none a multiple of its tile: edge tiles read zeros, drop writes
    kernel = matmul(M, N, K, 64, 64, 32, trans_A, trans_B, dtype, dtype, "float32", 2)
    a, b = make_operands(M, N, K, trans_A, trans_B, DTYPES[dtype], device)
    assert_close(kernel(a, b), gemm_reference(a, b, trans_A, trans_B, DTYPES[dtype]))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("M, N, K", [(128, 128, 128), (200, 136, 72)], ids=["whole", "padded"])
def test_gemm_shared_epilogue(M, N, K, dtype, device, assert_close):
    """C stored through a shared tile, as TileLang's quickstart does: on sm_90 a TMA store read
    straight from C_shared, which clips the padded shape's edge tiles."""
    kernel = matmul(M, N, K, 64, 64, 32, False, False, dtype, dtype, "float32", 2, shared_epilogue=True)
    a, b = make_operands(M, N, K, False, False, DTYPES[dtype], device)
    assert_close(kernel(a, b), gemm_reference(a, b, False, False, DTYPES[dtype]))


@pytest.mark.parametrize("num_stages", [0, 3])
def test_gemm_padded_shape_eager(num_stages, device, assert_close):
    a, b = make_operands(200, 136, 72, False, False, torch.float16, device)
    c = matmul_eager(a, b, num_stages=num_stages)
    assert_close(c, gemm_reference(a, b, False, False, torch.float16))


def matmul_register_operand(M, N, K, block_M, block_N, block_K, trans_A, trans_B, operand, num_stages):
    """`operand` "A" gives TileLang's matmul_rs (A from registers), "B" its matmul_sr."""
    return matmul(M, N, K, block_M, block_N, block_K, trans_A, trans_B, num_stages=num_stages,
                  register_operand=operand)


@pytest.mark.parametrize("num_stages", [0, 2])
@pytest.mark.parametrize("operand", ["A", "B"], ids=["rs", "sr"])
@pytest.mark.parametrize("trans_A, trans_B", LAYOUTS, ids=LAYOUT_IDS)
def test_gemm_register_operand(trans_A, trans_B, operand, num_stages, device, assert_close):
    M = N = K = 128
    kernel = matmul_register_operand(M, N, K, 64, 64, 32, trans_A, trans_B, operand, num_stages)
    a, b = make_operands(M, N, K, trans_A, trans_B, torch.float16, device)
    assert_close(kernel(a, b), gemm_reference(a, b, trans_A, trans_B, torch.float16))


def test_gemm_fp32_register_operand_of_a_wide_k(device, assert_close):
    """A float32 register A of 128 K columns feeds CUDA-core FMAs (no tensor-core dtype): held in
    the FMA operand layout it would copy its rows into every thread (1024 registers each), so it
    keeps a blocked layout and is converted at the gemm (seed 3201 #221 compiled for minutes)."""
    M, N, K = 128, 128, 256
    kernel = matmul(M, N, K, 64, 64, 128, False, False, "float32", "float32", "float32", 2, register_operand="A")
    a, b = make_operands(M, N, K, False, False, torch.float32, device)
    assert_close(kernel(a, b), gemm_reference(a, b, False, False, torch.float32))


@tritile.jit(out_idx=[-1])
def matmul_dynamic(block_M, block_N, block_K, num_stages):
    M, N, K = T.dynamic("m, n, k")
    return gemm(M, N, K, block_M, block_N, block_K, num_stages=num_stages)


RUNTIME_SIZES = [(128, 128, 128), (200, 136, 72), (64, 192, 96)]


def test_gemm_dynamic_shapes_one_kernel(device, assert_close):
    kernel = matmul_dynamic(64, 64, 32, 2)
    for M, N, K in RUNTIME_SIZES:
        a, b = make_operands(M, N, K, False, False, torch.float16, device)
        assert_close(kernel(a, b), gemm_reference(a, b, False, False, torch.float16))
    # the lazy cache hands back the same kernel, compiled once for every runtime size
    assert matmul_dynamic(64, 64, 32, 2) is kernel
    assert len(kernel.func.dynamic_vars) == 3


# its own jit object, so its cache statistics count only the calls of the test below
matmul_dynamic_eager = tritile.jit(gemm_eager)


def test_gemm_dynamic_shapes_eager(device, assert_close):
    matmul_dynamic_eager.cache_clear()
    for M, N, K in RUNTIME_SIZES:
        a, b = make_operands(M, N, K, False, False, torch.float16, device)
        c = matmul_dynamic_eager(a, b, dynamic_dims=True)
        assert_close(c, gemm_reference(a, b, False, False, torch.float16))
    # T.dynamic dims are not part of the specialisation: three sizes, one compiled kernel
    info = matmul_dynamic_eager.cache_info()
    assert (info.misses, info.hits, info.currsize) == (1, 2, 1)


@tritile.jit(out_idx=[-1])
def blocksparse_matmul(M, N, K, block_M, block_N, block_K, num_stages, mask_via_local,
                       dtype="float16", accum_dtype="float32"):
    """`mask_via_local`: first load the mask bit into a `T.alloc_local` scalar, then test it
    (the form of TileLang's test_blocksparse_matmul); else test the global mask directly."""
    block_mask_shape = (M // block_M, N // block_N, K // block_K)

    @T.prim_func
    def main(
            A: T.Tensor((M, K), dtype),
            B: T.Tensor((K, N), dtype),
            BlockMask: T.Tensor(block_mask_shape, "bool"),
            C: T.Tensor((M, N), dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            block_mask = T.alloc_local((1,), "bool")
            T.clear(C_local)
            if mask_via_local:
                for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                    block_mask[0] = BlockMask[by, bx, k]
                    if block_mask[0]:
                        T.copy(A[by * block_M, k * block_K], A_shared)
                        T.copy(B[k * block_K, bx * block_N], B_shared)
                        T.gemm(A_shared, B_shared, C_local)
            else:
                for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                    if BlockMask[by, bx, k]:
                        T.copy(A[by * block_M, k * block_K], A_shared)
                        T.copy(B[k * block_K, bx * block_N], B_shared)
                        T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return main


@pytest.mark.parametrize("mask_via_local", [False, True], ids=["global_mask", "local_mask"])
@pytest.mark.parametrize("num_stages", [0, 1, 2, 3])
def test_gemm_block_sparse(num_stages, mask_via_local, device, assert_close):
    M, N, K, bM, bN, bK = 128, 128, 128, 64, 64, 32
    kernel = blocksparse_matmul(M, N, K, bM, bN, bK, num_stages, mask_via_local)
    a, b = make_operands(M, N, K, False, False, torch.float16, device)
    mask = torch.rand(M // bM, N // bN, K // bK, device=device) > 0.5
    mask[..., 0] = True  # every output tile has some work ...
    mask[0, 0, 1] = False  # ... and at least one tile skips some
    ref = torch.zeros(M, N, device=device)
    for i in range(M // bM):
        for j in range(N // bN):
            for k in range(K // bK):
                if mask[i, j, k]:
                    ref[i * bM:(i + 1) * bM, j * bN:(j + 1) * bN] += (
                        a[i * bM:(i + 1) * bM, k * bK:(k + 1) * bK].float()
                        @ b[k * bK:(k + 1) * bK, j * bN:(j + 1) * bN].float())
    assert_close(kernel(a, b, mask), ref.to(torch.float16))


def matmul_swizzled(M, N, K, block_M, block_N, block_K, panel_size, order):
    return matmul(M, N, K, block_M, block_N, block_K, swizzle_panel=panel_size, swizzle_order=order)


@pytest.mark.parametrize("order", ["row", "column"])
def test_gemm_use_swizzle(order, device, assert_close):
    M, N, K = 256, 192, 64  # a 3 x 4 grid: the panel size does not divide it
    kernel = matmul_swizzled(M, N, K, 64, 64, 32, 2, order)
    a, b = make_operands(M, N, K, False, False, torch.float16, device)
    assert_close(kernel(a, b), gemm_reference(a, b, False, False, torch.float16))


# The specialisations tests/test_kernels_compile.py compiles for sm_90 and sm_80: every kernel of
# this module over every layout and dtype the tests above run, each num_stages at least once.
COMPILE_CASES = {
    **{f"matmul-{lid}-{dtype}-s2": (lambda ta=ta, tb=tb, dtype=dtype: matmul(
        128, 128, 128, 64, 64, 32, ta, tb, dtype, dtype, "float32", 2))
       for (ta, tb), lid in zip(LAYOUTS, LAYOUT_IDS) for dtype in DTYPES},
    **{f"matmul-NN-float16-s{stages}": (lambda stages=stages: matmul(
        128, 128, 128, 64, 64, 32, False, False, "float16", "float16", "float32", stages)) for stages in (0, 1, 3)},
    **{f"matmul-padded-{lid}-{dtype}": (lambda ta=ta, tb=tb, dtype=dtype: matmul(
        200, 136, 72, 64, 64, 32, ta, tb, dtype, dtype, "float32", 2))
       for (ta, tb), lid in zip(LAYOUTS, LAYOUT_IDS) for dtype in ("float16", "float32")},
    **{f"matmul_eager-{lid}-float16": (lambda ta=ta, tb=tb: matmul_eager.compile(M=128, N=128, K=128, trans_A=ta,
                                                                               trans_B=tb))
       for (ta, tb), lid in zip(LAYOUTS, LAYOUT_IDS)},
    **{f"matmul_register_operand-{lid}-{op}-s{stages}": (
        lambda ta=ta, tb=tb, op=op, stages=stages: matmul_register_operand(128, 128, 128, 64, 64, 32, ta, tb, op, stages))
       for (ta, tb), lid in zip(LAYOUTS, LAYOUT_IDS) for op in ("A", "B") for stages in (0, 2)},
    "matmul_dynamic": lambda: matmul_dynamic(64, 64, 32, 2),
    **{f"matmul-shared-epilogue-{dtype}": (lambda dtype=dtype: matmul(
        200, 136, 72, 64, 64, 32, False, False, dtype, dtype, "float32", 2, shared_epilogue=True)) for dtype in DTYPES},
    "matmul_dynamic_eager": lambda: matmul_dynamic_eager.compile(dynamic_dims=True),
    **{f"blocksparse_matmul-{'local' if local else 'global'}-s{stages}": (
        lambda stages=stages, local=local: blocksparse_matmul(128, 128, 128, 64, 64, 32, stages, local))
       for stages in (0, 1, 2, 3) for local in (False, True)},
    **{f"matmul_swizzled-{order}": (lambda order=order: matmul_swizzled(256, 192, 64, 64, 64, 32, 2, order))
       for order in ("row", "column")},
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("trans_A, trans_B", LAYOUTS, ids=LAYOUT_IDS)
def test_mma_sync_gemm_loads_shared_operands_a_k_chunk_at_a_time(trans_A, trans_B, dtype, device, assert_close):
    # a 32-row tile is too short for wgmma: mma.sync, with both operands in shared memory; its
    # 128-deep K is loaded 32 at a time (64 where K is an operand's contiguous dim: a chunk
    # covers a 128-byte swizzle row), not whole (gqa_bwd's dQ gemm spilled registers so)
    M, N, K = 64, 256, 256
    kernel = matmul(M, N, K, 32, 128, 128, trans_A, trans_B, dtype, dtype, "float32", 2, threads=256)
    chunk = 64 if (not trans_A or trans_B) else 32
    source = kernel.get_source("gluon")
    assert f"gl.static_range(0, 128, {chunk}):" in source
    assert f".slice(_k" in source and "mma_v2(" in source
    assert "mma.sync.aligned" in kernel.get_source("ptx")
    a, b = make_operands(M, N, K, trans_A, trans_B, DTYPES[dtype], device)
    assert_close(kernel(a, b), gemm_reference(a, b, trans_A, trans_B, DTYPES[dtype]))


def test_mma_sync_gemm_of_a_short_k_loads_its_operands_whole():
    kernel = matmul(64, 128, 64, 32, 128, 32, False, False, "float16", "float16", "float32", 2, threads=256)
    source = kernel.get_source("gluon")
    assert "mma_v2(" in source and "gl.static_range(0, 32" not in source and ".slice(_k" not in source
