"""`tilelang.carver` under its TileLang name: schedule recommendation for tile programs.

* `arch` - the devices (`CUDA`, `CDNA`, `TileDevice`; numbers from torch.cuda, or from a table of
  known GPUs when none is present) and `arch.driver`'s queries of the current CUDA device;
* `roller` - `Hint`, the rasterization plans, and `recommend_matmul_hints`: a small enumeration of
  GEMM tilings ranked by a roofline with wave quantization (TileLang's roller walks TVM TE graphs;
  see `roller/recommend.py` for what is modelled);
* `template` - `MatmulTemplate(M=, N=, K=, ...).with_arch(arch).recommend_hints(topk)`, its
  `equivalent_function()` a tritile `@T.prim_func`.

TileLang's other templates, its TIR analyses (`normalize_prim_func`, `get_block`, ...) and the
RDNA / Metal / CPU devices are not provided.
"""
from tritile.carver.arch import CDNA, CUDA, TileDevice  # noqa: F401
from tritile.carver.roller import (Hint, NoRasterization, Rasterization2DColumn, Rasterization2DRow,  # noqa: F401
                                   recommend_matmul_hints)
from tritile.carver.template import MatmulTemplate  # noqa: F401
