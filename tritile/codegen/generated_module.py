"""Executing a backend's generated Python module (both backends' kernels are Python source that
Triton's front end reads back with `inspect`)."""
from __future__ import annotations

import linecache
import sys
import types


def load_module(name: str, source: str, filename: str):
    """The generated module `name`, executed from `source` (not read back from the cache file,
    which another process may be rewriting or removing) and published in `sys.modules` only
    once it has finished executing: a thread that finds it there sees every name defined.
    `filename` (the cache file, or a pseudo-name when the module lives in memory only) is
    registered in `linecache` with `source`, where `@gluon.jit` / `@triton.jit` read the
    kernel's source (`inspect.getsourcelines`) and tracebacks read their lines; an entry
    without an mtime is never invalidated by `linecache.checkcache`."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module = types.ModuleType(name)
    module.__file__ = filename
    exec(compile(source, filename, "exec"), module.__dict__)
    return sys.modules.setdefault(name, module)
