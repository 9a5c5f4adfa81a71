"""`tilelang.carver.roller`: `Hint`, the rasterization plans and tritile's GEMM recommender
(`recommend_matmul_hints`, in place of TileLang's TVM-graph `DefaultPolicy` / `TensorCorePolicy`)."""
from tritile.carver.arch import CUDA, TileDevice  # noqa: F401
from tritile.carver.roller.hint import Hint  # noqa: F401
from tritile.carver.roller.rasterization import (NoRasterization, Rasterization, Rasterization2DColumn,  # noqa: F401
                                                 Rasterization2DRow)
from tritile.carver.roller.recommend import recommend_matmul_hints  # noqa: F401
