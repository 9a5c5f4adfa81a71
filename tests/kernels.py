"""The TileLang-style kernels several test suites share, written once.

* `load_operand_tiles` - the `@T.macro` both GEMM bodies load their K tiles with.
* `gemm(...)` - the lazy-style GEMM body: a plain function returning a `@T.prim_func` for
  C = op(A) @ op(B), with knobs for the transposes, dtypes, tiles, `num_stages` or a manual
  `order=`/`stage=` schedule, a register operand (TileLang's matmul_rs / matmul_sr),
  `T.use_swizzle` and the thread count.  `M, N, K` may be `T.dynamic` vars.
* `matmul` - `gemm` under `@tritile.jit(out_idx=[-1])`: `matmul(M, N, K, ...)` -> a `JITKernel`.
* `gemm_eager(A, B, ...)` - the eager-style GEMM body (`T.const` or `T.dynamic` dims, `T.empty`,
  `return C`), and `matmul_eager` - it under `@tritile.jit`.
* `splitk_gemm(...)` - split-K GEMM accumulating into C with `T.atomic_add` (tile or scalar form).
* `make_operands` / `gemm_reference` - random inputs of a GEMM and its float32 torch reference.

Every builder is deterministic in its arguments, so the jit caches and the disk cache key (module,
qualname, source) are the same from every importing suite.
"""
import torch

import tritile
import tritile.language as T
from tritile.ops.gemm_loop import load_operand_tiles  # noqa: F401  (the GEMM bodies here and in pipeline_kernels)


def gemm(M, N, K, block_M, block_N, block_K, trans_A=False, trans_B=False, in_dtype="float16",
         out_dtype="float16", accum_dtype="float32", num_stages=2, threads=128, register_operand=None,
         swizzle_panel=None, swizzle_order="row", order=None, stage=None, shared_epilogue=False):
    """C = op(A) @ op(B) (op = transpose where `trans_*`) as a `@T.prim_func`.

    `register_operand` "A" copies the A tile to a fragment before the gemm (matmul_rs), "B" the B
    tile (matmul_sr); `swizzle_panel` adds `T.use_swizzle(swizzle_panel, order=swizzle_order)`;
    `order`/`stage` give the pipelined loop a manual schedule instead of `num_stages`;
    `shared_epilogue` stores C through a shared tile, as TileLang's quickstart does
    (``T.copy(C_local, C_shared); T.copy(C_shared, C[...])``).
    """
    A_shape = (K, M) if trans_A else (M, K)
    B_shape = (N, K) if trans_B else (K, N)
    A_shared_shape = (block_K, block_M) if trans_A else (block_M, block_K)
    B_shared_shape = (block_N, block_K) if trans_B else (block_K, block_N)
    schedule = dict(order=order, stage=stage) if order is not None else dict(num_stages=num_stages)

    @T.prim_func
    def main(
            A: T.Tensor(A_shape, in_dtype),
            B: T.Tensor(B_shape, in_dtype),
            C: T.Tensor((M, N), out_dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared(A_shared_shape, in_dtype)
            B_shared = T.alloc_shared(B_shared_shape, in_dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            if register_operand == "A":
                A_local = T.alloc_fragment(A_shared_shape, in_dtype)
            elif register_operand == "B":
                B_local = T.alloc_fragment(B_shared_shape, in_dtype)
            if swizzle_panel is not None:
                T.use_swizzle(swizzle_panel, order=swizzle_order)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), **schedule):
                load_operand_tiles(A, B, A_shared, B_shared, k, bx, by, block_M, block_N, block_K, trans_A, trans_B)
                if register_operand == "A":
                    T.copy(A_shared, A_local)
                    T.gemm(A_local, B_shared, C_local, trans_A, trans_B)
                elif register_operand == "B":
                    T.copy(B_shared, B_local)
                    T.gemm(A_shared, B_local, C_local, trans_A, trans_B)
                else:
                    T.gemm(A_shared, B_shared, C_local, trans_A, trans_B)
            if shared_epilogue:
                C_shared = T.alloc_shared((block_M, block_N), out_dtype)
                T.copy(C_local, C_shared)
                T.copy(C_shared, C[by * block_M, bx * block_N])
            else:
                T.copy(C_local, C[by * block_M, bx * block_N])

    return main


matmul = tritile.jit(out_idx=[-1])(gemm)


def gemm_eager(A, B, trans_A: bool = False, trans_B: bool = False, num_stages: int = 2, block_M: int = 64,
               block_N: int = 64, block_K: int = 32, in_dtype=T.float16, out_dtype=T.float16,
               accum_dtype=T.float32, dynamic_dims: bool = False):
    """The eager form of `gemm`: sizes are `T.const` dims read from A and B (`T.dynamic` runtime
    dims with `dynamic_dims`), C comes from `T.empty` and is returned."""
    if dynamic_dims:
        M, N, K = T.dynamic("m, n, k")
    else:
        M, N, K = T.const("M, N, K")
    A_shape = (K, M) if trans_A else (M, K)
    B_shape = (N, K) if trans_B else (K, N)
    A: T.Tensor(A_shape, in_dtype)  # both annotation forms: the call ...
    B: T.Tensor[B_shape, in_dtype]  # ... and the subscript
    C = T.empty((M, N), out_dtype)

    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
        A_shared = T.alloc_shared((block_K, block_M) if trans_A else (block_M, block_K), in_dtype)
        B_shared = T.alloc_shared((block_N, block_K) if trans_B else (block_K, block_N), in_dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
        T.clear(C_local)
        for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
            load_operand_tiles(A, B, A_shared, B_shared, k, bx, by, block_M, block_N, block_K, trans_A, trans_B)
            T.gemm(A_shared, B_shared, C_local, transpose_A=trans_A, transpose_B=trans_B)
        T.copy(C_local, C[by * block_M, bx * block_N])
    return C


matmul_eager = tritile.jit(gemm_eager)


def splitk_gemm(M, N, K, block_M, block_N, block_K, split_k, form, num_stages=2, dtype="float16",
                accum_dtype="float32", out_dtype="float32"):
    """C += A @ B with the grid's third dimension splitting K, each split adding its partial product
    with `T.atomic_add`: `form` "tile_region" / "tile_head" adds the C tile (region / head address),
    "scalar" adds element by element inside `T.Parallel`, guarded for a padded shape,
    "scalar_unguarded" without the guard (the adds past C's edges are dropped, as TileLang's safe
    memory access drops them)."""
    split_len = K // split_k

    @T.prim_func
    def main(
            A: T.Tensor((M, K), dtype),
            B: T.Tensor((K, N), dtype),
            C: T.Tensor((M, N), out_dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), split_k, threads=128) as (bx, by, bz):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_shared = T.alloc_shared((block_M, block_N), out_dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(split_len, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, bz * split_len + ko * block_K], A_shared)
                T.copy(B[bz * split_len + ko * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C_shared)
            if form == "tile_region":
                T.atomic_add(C[by * block_M:(by + 1) * block_M, bx * block_N:(bx + 1) * block_N], C_shared)
            elif form == "tile_head":
                T.atomic_add(C[by * block_M, bx * block_N], C_shared)
            elif form == "scalar":
                for i, j in T.Parallel(block_M, block_N):
                    if by * block_M + i < M and bx * block_N + j < N:
                        T.atomic_add(C[by * block_M + i, bx * block_N + j], C_shared[i, j])
            else:
                for i, j in T.Parallel(block_M, block_N):
                    T.atomic_add(C[by * block_M + i, bx * block_N + j], C_shared[i, j])

    return main


def make_operands(M, N, K, trans_A=False, trans_B=False, dtype=torch.float16, device="cpu"):
    """Random A and B of a GEMM, stored transposed where `trans_*`."""
    a = torch.randn((K, M) if trans_A else (M, K), dtype=dtype, device=device)
    b = torch.randn((N, K) if trans_B else (K, N), dtype=dtype, device=device)
    return a, b


def gemm_reference(a, b, trans_A=False, trans_B=False, out_dtype=None):
    """op(a) @ op(b) in float32, rounded to `out_dtype` (default: a's dtype)."""
    out_dtype = out_dtype or a.dtype
    a = a.float().T if trans_A else a.float()
    b = b.float().T if trans_B else b.float()
    return (a @ b).to(out_dtype)


def compile_error(build) -> str:
    """The message of the `tritile.CompileError` that `build()` raises, checked to quote the file
    `build` was written in (the user's line)."""
    import os

    import pytest

    with pytest.raises(tritile.CompileError) as info:
        build()
    message = str(info.value)
    assert os.path.basename(build.__code__.co_filename) + ":" in message
    return message
