"""Gluon (Triton 3.6) backend: final tile IR -> generated ``@gluon.jit`` source -> cubin.

`compile_kernel(func, target) -> GluonKernel` is the entry point (`compiler.py`, with its
caches); `emit_module` only produces the source text.  Parts: `rules.py` (one rule per IR node
kind), `emitter.py` (the emission state), `kernel_module.py` (the module: kernel + host launcher).
"""
from tritile.codegen.gluon.compiler import GluonKernel, compile_kernel  # noqa: F401
from tritile.codegen.gluon.kernel_module import emit_module  # noqa: F401
