"""Gluon (Triton 3.6) backend: final tile IR -> generated ``@gluon.jit`` source -> cubin.

`compile_kernel(func, target) -> GluonKernel` is the entry point (implemented with its
caches in `tritile.runtime.compiler`); `emit_module` only produces the source text.
"""
from tritile.codegen.gluon.kernel_module import emit_module  # noqa: F401


def compile_kernel(func, target):
    from tritile.runtime.compiler import compile_kernel as _compile

    return _compile(func, target)


def __getattr__(name):
    if name == "GluonKernel":
        from tritile.runtime.compiler import GluonKernel

        return GluonKernel
    raise AttributeError(name)
