"""`Hint`, one schedule the carver recommends (TileLang's `tilelang/carver/roller/hint.py`).

Mirrored: the fields TileLang's programs read - `block` (block_M, block_N), `warp` (warp_M,
warp_N: each warp's part of the block), `rstep` ([block_K]), `pipeline_stage`, `use_async`,
`rasterization_plan`, `use_tc`, `arch`, `thread`, `reduce_thread`, `split_k_factor`,
`block_reduction_depth`, `vectorize`, `opt_shapes`, `pass_context` - and `to_dict` /
`from_dict` / `tensorcore_legalization` / `raxis_order` / `step` / the dict-like repr.
Simplified: no `Stride` / `TileDict` / `IntrinInfo` / `complete_config` (TVM schedule state).
Added: `threads` (warps x warp size), `smem_bytes` and `score` (the recommender's estimate, see
`tritile.carver.roller.recommend`), and `config()`, the dict of TileLang's GEMM examples
(block_M, block_N, block_K, num_stages, thread_num, enable_rasteration).
"""
from __future__ import annotations

import math

from tritile.carver.roller.rasterization import NoRasterization


class Hint:
    def __init__(self) -> None:
        self.arch = None
        self.use_tc = None
        self.block = []
        self.thread = []
        self.warp = []
        self.rstep = []
        self.reduce_thread = []
        self.rasterization_plan = NoRasterization()
        self.cached_tensors = []
        self.output_strides = {}
        self.schedule_stages = None
        self.block_reduction_depth = None
        self.split_k_factor: int = 1
        self._raxis_order = []
        self._step = []
        self.vectorize: dict = {}
        self.pipeline_stage = 1
        self.use_async = False
        self.opt_shapes: dict = {}
        self.shared_scope: str = "shared"
        self.pass_context: dict = {}
        # tritile: what the recommender computed
        self.warp_size: int = 32
        self.smem_bytes: int = 0
        self.score: tuple = ()

    @property
    def threads(self) -> int:
        """Threads of a block: one warp per `warp` tile of `block`."""
        warps = math.prod(b // w for b, w in zip(self.block, self.warp)) if self.warp else 1
        return warps * self.warp_size

    def config(self) -> dict:
        """The configuration dict TileLang's GEMM examples build from a hint (threads counted in
        warps of 32, as they count them)."""
        block_m, block_n = self.block
        warp_m, warp_n = self.warp
        return {"block_M": block_m, "block_N": block_n, "block_K": self.rstep[0],
                "num_stages": self.pipeline_stage if self.pipeline_stage > 1 else 0,
                "thread_num": (block_m // warp_m) * (block_n // warp_n) * 32,
                "enable_rasteration": not isinstance(self.rasterization_plan, NoRasterization)}

    def to_dict(self) -> dict:
        dic = {"block": self.block}
        if self.use_tc:
            dic["warp"] = self.warp
        else:
            dic["thread"] = self.thread
        dic["rstep"] = self.rstep
        if math.prod(self.reduce_thread) > 1:
            dic["reduce_thread"] = self.reduce_thread
        if self.use_tc:
            dic["use_tc"] = self.use_tc
        if math.prod(self._step) > 1:
            dic["step"] = self._step
        if self._raxis_order:
            dic["raxis_order"] = self._raxis_order
        if self.vectorize:
            dic["vectorize"] = self.vectorize
        if self.pipeline_stage != 1:
            dic["pipeline_stage"] = self.pipeline_stage
        if self.block_reduction_depth is not None:
            dic["block_reduction_depth"] = self.block_reduction_depth
        return dic

    @classmethod
    def from_dict(cls, dic: dict) -> "Hint":
        hint = cls()
        for k, v in dic.items():
            setattr(hint, k, v)
        return hint

    def tensorcore_legalization(self) -> "Hint":
        self.warp = self.warp[-2:]
        self.block = self.block[-2:]
        return self

    @property
    def raxis_order(self) -> list:
        return self._raxis_order if self._raxis_order else list(range(len(self.rstep)))

    @property
    def step(self) -> list:
        return self._step if self._step else [1 for _ in self.block]

    def key(self) -> tuple:
        """What makes two hints different schedules."""
        return (tuple(self.block), tuple(self.warp), tuple(self.rstep), self.pipeline_stage,
                self.rasterization_plan)

    def __repr__(self) -> str:
        return str(self.to_dict())
