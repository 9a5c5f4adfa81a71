"""`tilelang.language.eager` (TileLang's eager builder package) on tritile's own machinery.

TileLang builds TIR by rewriting a kernel's Python AST into calls on a builder object
(`tilelang.language.eager.builder`).  tritile's frontend has no builder: it walks the
function's AST itself (`tritile.frontend`).  So the entry points below are tritile's own:

* `prim_func(fn, eager_jit=False)`: `T.prim_func`; with `eager_jit=True` the JIT function
  `tritile.jit(fn)` (what TileLang's `tilelang.jit` builds through it);
* `macro`, `const`, `Ref`: `T.macro`, `T.const`, `T.Ref` (a macro parameter referring to the
  caller's buffer element or `T.alloc_var` variable);
* `PrimFunc`: tritile's tile-IR `PrimFunc` (what `prim_func` returns); `JITFunc`: the class of
  what `prim_func(eager_jit=True)` / `tritile.jit` return (lazy and eager style);
* the dtypes (`float16`, `int32`, ...), as in `tritile.language`.

`annotate_compile_flags` and `annotate_pass_configs` have no counterpart in tritile: using them
raises NotImplementedError naming them (`compile_flags=` / `pass_configs=` of `tritile.jit` set what the latter two would).
`tritile.language.eager.ast.mutate` is in `ast.py`.
"""
from __future__ import annotations

from tritile import language as _T
from tritile.ir.dtypes import DType as _DType
from tritile.ir.nodes import PrimFunc  # noqa: F401  (re-exported)
from tritile.language import Ref, const, macro  # noqa: F401  (re-exported)
from tritile.language import prim_func as _prim_func
from tritile.runtime.jit import JITFunction as JITFunc  # noqa: F401  (re-exported)

_DTYPE_NAMES = tuple(name for name, value in vars(_T).items() if isinstance(value, _DType) and not name.startswith("_"))
globals().update({name: getattr(_T, name) for name in _DTYPE_NAMES})  # float16, int32, ... as T spells them


def prim_func(func=None, *, eager_jit: bool = False):
    """TileLang's `prim_func(func, eager_jit=False)`: `T.prim_func(func)`, or with `eager_jit`
    the JIT function `tritile.jit(func)`."""
    if eager_jit:
        from tritile.runtime.jit import jit

        return jit(func) if func is not None else jit
    if func is None:
        return _prim_func
    import sys

    from tritile.frontend import parse_prim_func

    # annotations may use the decorating scope's locals, as with T.prim_func
    return parse_prim_func(func, sys._getframe(1).f_locals)


def _not_in_tritile(name: str, instead: str):
    def unsupported(*args, **kwargs):
        raise NotImplementedError(f"tilelang.language.eager.{name} has no counterpart in tritile; {instead}")

    unsupported.__name__ = unsupported.__qualname__ = name
    return unsupported


annotate_compile_flags = _not_in_tritile("annotate_compile_flags", "pass compile_flags= to tritile.jit")
annotate_pass_configs = _not_in_tritile("annotate_pass_configs", "pass pass_configs= to tritile.jit")

__all__ = ("prim_func", "macro", "PrimFunc", "JITFunc", "Ref", "const", "annotate_compile_flags",
           "annotate_pass_configs", *_DTYPE_NAMES)
