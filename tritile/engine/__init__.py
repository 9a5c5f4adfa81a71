"""`tilelang.engine` under its TileLang name: the source post-processing callbacks
(`tritile.engine.callback`).  TileLang's `lower` / `KernelParam` are not provided here
(`tritile.compile` / `tritile.jit` compile a program)."""
from tritile.engine.callback import (  # noqa: F401
    register_c_postproc,
    register_cuda_postproc,
    register_hip_postproc,
    register_metal_postproc,
)
