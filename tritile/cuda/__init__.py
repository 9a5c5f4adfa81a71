"""`tilelang.cuda` under its TileLang name.  Only `tilelang.cuda.intrinsics`' shared-memory
swizzle helpers (`make_mma_swizzle_layout`, `get_swizzle_layout`) are provided: tritile compiles
through Triton, so TileLang's CUDA backend, code generator and MMA macro emitters have no
counterpart."""
