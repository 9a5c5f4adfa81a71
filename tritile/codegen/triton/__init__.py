"""triton.language backend: tile IR after `accumulator_init` -> generated ``@triton.jit`` source
-> Triton's own TTIR / TTGIR pipeline -> PTX (NVIDIA) or AMDGCN (AMD).

`compile_kernel(func, target) -> TritonKernel` is the entry point (`compiler.py`); `emit_module`
only produces the source text.  Parts, as in the Gluon backend: `rules.py` (one rule per IR
node kind), `emitter.py` (the emission state), `kernel_module.py` (the module: kernel + host
launcher).  See docs/architecture.md for why it starts before the pipeline passes.
"""
from tritile.codegen.triton.compiler import TritonKernel, compile_kernel  # noqa: F401
from tritile.codegen.triton.kernel_module import emit_module  # noqa: F401
