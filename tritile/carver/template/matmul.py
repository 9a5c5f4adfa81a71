"""`MatmulTemplate` (TileLang's `tilelang/carver/template/matmul.py`): C = A @ B (+ Bias).

Mirrored: the fields (`M`, `N`, `K`, `trans_A`, `trans_B` - B stored (N, K) by default -,
`in_dtype`, `out_dtype`, `accum_dtype`, `with_bias`), `params_as_dict`, `class_attributes`, the
repr, `equivalent_function()` and `recommend_hints(topk)`.
Simplified: `equivalent_function()` is a tritile `@T.prim_func` computing the product with a
fixed 64 x 64 x 32 tiling (TileLang's is a TE compute definition, untiled); the hints come from
`tritile.carver.roller.recommend` (a documented enumeration, not TileLang's TE-graph roller).
Added: `program(hint)`, the tiled program of a hint (its block, warps, block_K, stages and
rasterization), which compiles and runs like any `@T.prim_func`.
"""
from __future__ import annotations

from dataclasses import dataclass

import tritile.language as T
from tritile.carver.arch import TileDevice
from tritile.carver.roller.hint import Hint
from tritile.carver.roller.rasterization import NoRasterization
from tritile.carver.roller.recommend import recommend_matmul_hints
from tritile.carver.template.base import BaseTemplate
from tritile.ops.gemm_loop import accumulate_tiles


def matmul_program(M: int, N: int, K: int, block_M: int = 64, block_N: int = 64, block_K: int = 32,
                   num_stages: int = 2, threads: int = 128, trans_A: bool = False, trans_B: bool = True,
                   in_dtype="float16", out_dtype="float16", accum_dtype="float32", with_bias: bool = False,
                   rasterization=None):
    """The tiled GEMM of TileLang's examples: operand tiles through shared memory in a pipelined K
    loop, an accumulator fragment, the output through shared memory; parameters (A, B[, Bias], C)."""
    rasterization = rasterization or NoRasterization()
    panel = rasterization.panel_width if rasterization.enabled else 10
    order = rasterization.order or "row"
    a_shape, a_tile = ((K, M), (block_K, block_M)) if trans_A else ((M, K), (block_M, block_K))
    b_shape, b_tile = ((N, K), (block_N, block_K)) if trans_B else ((K, N), (block_K, block_N))

    @T.macro
    def product_tile(A, B, C_local, bx, by):
        A_shared = T.alloc_shared(a_tile, in_dtype)
        B_shared = T.alloc_shared(b_tile, in_dtype)
        T.use_swizzle(panel_size=panel, order=order, enable=rasterization.enabled)
        accumulate_tiles(A, B, A_shared, B_shared, C_local, bx, by, K, block_M, block_N, block_K, num_stages,
                         trans_A, trans_B)

    @T.macro
    def store_tile(C_local, C, bx, by):
        C_shared = T.alloc_shared((block_M, block_N), out_dtype)
        T.copy(C_local, C_shared)
        T.copy(C_shared, C[by * block_M, bx * block_N])

    @T.prim_func
    def main(A: T.Tensor(a_shape, in_dtype), B: T.Tensor(b_shape, in_dtype), Bias: T.Tensor((N,), accum_dtype),
             C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            product_tile(A, B, C_local, bx, by)
            bias = T.alloc_fragment((block_N,), accum_dtype)
            T.copy(Bias[bx * block_N], bias)
            for i, j in T.Parallel(block_M, block_N):
                C_local[i, j] = C_local[i, j] + bias[j]
            store_tile(C_local, C, bx, by)

    @T.prim_func
    def main_no_bias(A: T.Tensor(a_shape, in_dtype), B: T.Tensor(b_shape, in_dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            product_tile(A, B, C_local, bx, by)
            store_tile(C_local, C, bx, by)

    return main if with_bias else main_no_bias


@dataclass
class MatmulTemplate(BaseTemplate):
    M: int = None
    N: int = None
    K: int = None
    trans_A: bool = False
    trans_B: bool = True
    in_dtype: str = "float16"
    out_dtype: str = "float16"
    accum_dtype: str = "float16"
    with_bias: bool = False

    def get_hardware_aware_configs(self, arch: TileDevice = None, topk: int = 10) -> list:
        return recommend_matmul_hints(self.M, self.N, self.K, arch or self._arch, in_dtype=self.in_dtype,
                                      accum_dtype=self.accum_dtype, out_dtype=self.out_dtype, topk=topk)

    def initialize_function(self) -> None:
        M, N, K = self.M, self.N, self.K
        assert isinstance(M, int) and isinstance(N, int) and isinstance(K, int), "Only Support Integer M, N, K"
        assert M > 0 and N > 0 and K > 0, "M, N, K should be positive"
        self.set_function(self._program(64, 64, 32, 2, 128, NoRasterization()))

    def program(self, hint: Hint):
        """The tiled program of `hint` (threads: one warp of `hint.warp_size` per warp tile)."""
        return self._program(hint.block[0], hint.block[1], hint.rstep[0], hint.pipeline_stage, hint.threads,
                             hint.rasterization_plan)

    def _program(self, block_M, block_N, block_K, num_stages, threads, rasterization):
        return matmul_program(self.M, self.N, self.K, block_M, block_N, block_K, num_stages, threads,
                              self.trans_A, self.trans_B, self.in_dtype, self.out_dtype, self.accum_dtype,
                              self.with_bias, rasterization)

    def params_as_dict(self) -> dict:
        return {"M": self.M, "N": self.N, "K": self.K, "trans_A": self.trans_A, "trans_B": self.trans_B,
                "in_dtype": self.in_dtype, "out_dtype": self.out_dtype, "accum_dtype": self.accum_dtype,
                "with_bias": self.with_bias}

    @property
    def class_attributes(self) -> dict:
        return self.params_as_dict()

    def __repr__(self) -> str:
        fields = ", ".join(f"{key}={value!r}" for key, value in self.class_attributes.items())
        return f"{type(self).__name__}({fields})"
