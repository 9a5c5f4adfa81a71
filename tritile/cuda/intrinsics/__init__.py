"""`tilelang.cuda.intrinsics`: the shared-memory swizzle helpers of TileLang's MMA lowering
(see tritile/cuda/intrinsics/layout/mma_layout.py).  TileLang's MMA macro emitters
(`TensorCoreIntrinEmitter`, ...) are not provided: tritile's `T.gemm` picks its instructions."""
from tritile.cuda.intrinsics.layout.mma_layout import get_swizzle_layout, make_mma_swizzle_layout  # noqa: F401
