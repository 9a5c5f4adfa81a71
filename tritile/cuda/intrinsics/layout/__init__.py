"""`tilelang.cuda.intrinsics.layout` (see mma_layout.py)."""
from tritile.cuda.intrinsics.layout.mma_layout import get_swizzle_layout, make_mma_swizzle_layout  # noqa: F401
