"""TileLang's source post-processing callbacks (`tilelang.engine.callback`).

In TileLang, `register_cuda_postproc(func)` (and the HIP, C-host and Metal ones) registers
``func(code: str, target) -> str``, which TileLang's code generator calls on the CUDA / HIP /
C / Metal source it emits, and compiles what the function returns; the `*_callback` forms are
the same as decorators (``@register_cuda_postproc_callback``, ``@...()``,
``@...(override=False)``).

tritile emits Triton / Gluon Python, never CUDA, HIP, C or Metal source, so there is nothing
such a function could be given: registering one raises `NotImplementedError` (rather than
accepting a function that would silently never run, or never apply its edits).  The names
import, so programs that only import them (TileLang's gdn examples, whose
``@register_cuda_postproc_callback`` is commented out) run unchanged.  To see what tritile
compiles, use ``kernel.get_kernel_source()`` / ``kernel.get_source("gluon")``.
"""
from __future__ import annotations

from collections.abc import Callable

__all__ = ["register_cuda_postproc", "register_hip_postproc", "register_c_postproc", "register_metal_postproc",
           "register_cuda_postproc_callback", "register_hip_postproc_callback", "register_c_postproc_callback",
           "register_metal_postproc_callback"]


def _refuse(kind: str, func) -> None:
    name = getattr(func, "__name__", repr(func))
    raise NotImplementedError(
        f"tilelang.engine.callback: a {kind} post-processing callback ({name}) is not supported by tritile: it "
        f"compiles through Triton and emits no {kind} source for the callback to rewrite, so the callback would "
        f"never run. Read what tritile compiles with kernel.get_kernel_source().")


def _register(kind: str, name: str):
    def register(func: Callable[[str, object], str], override: bool = True):
        if not callable(func):
            raise TypeError(f"{name} takes a callable, got {func!r}")
        _refuse(kind, func)

    register.__name__ = register.__qualname__ = name
    register.__doc__ = (f"TileLang's `{name}(func, override=True)`: raises NotImplementedError in tritile (no "
                        f"{kind} source is emitted; see the module docstring).")
    return register


def _decorator(register, name: str):
    """TileLang's decorator form: ``@deco``, ``@deco()``, ``@deco(override)``, ``@deco(override=...)``."""

    def decorator(func: Callable | bool = None, override: bool = True):
        if callable(func):
            register(func, override)
            return func
        if func is None or isinstance(func, bool):
            _override = func if isinstance(func, bool) else override

            def _apply(fn):
                register(fn, _override)
                return fn

            return _apply
        raise TypeError("Invalid decorator usage")

    decorator.__name__ = decorator.__qualname__ = name
    decorator.__doc__ = (f"TileLang's decorator `@{name}` (also `@{name}()`, `@{name}(override=False)`): raises "
                         f"NotImplementedError when applied to a function in tritile (see the module docstring).")
    return decorator


register_cuda_postproc = _register("CUDA", "register_cuda_postproc")
register_hip_postproc = _register("HIP", "register_hip_postproc")
register_c_postproc = _register("C host", "register_c_postproc")
register_metal_postproc = _register("Metal", "register_metal_postproc")

register_cuda_postproc_callback = _decorator(register_cuda_postproc, "register_cuda_postproc_callback")
register_hip_postproc_callback = _decorator(register_hip_postproc, "register_hip_postproc_callback")
register_c_postproc_callback = _decorator(register_c_postproc, "register_c_postproc_callback")
register_metal_postproc_callback = _decorator(register_metal_postproc, "register_metal_postproc_callback")
