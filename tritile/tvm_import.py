"""TileLang's programs write `from tvm import tirx` after `import tilelang`: TileLang ships TVM
and puts it on the path.  `install()` (run by `import tritile`) makes `import tvm` / `import
tvm.tirx` load tritile.tvm (tritile/tvm: the few TVM names those programs use) - but only where
no TVM is installed: the finder goes last on `sys.meta_path`, so any real `tvm` is found first.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

_MODULES = {"tvm": "tritile.tvm", "tvm.tirx": "tritile.tvm.tirx"}


class _TileLangTVMFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in _MODULES else None

    def __init__(self):
        self._own_specs = {}

    def create_module(self, spec):
        module = importlib.import_module(_MODULES[spec.name])
        self._own_specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self._own_specs.pop(module.__name__)  # the import set the alias's spec on it


def install() -> None:
    if not any(isinstance(finder, _TileLangTVMFinder) for finder in sys.meta_path):
        sys.meta_path.append(_TileLangTVMFinder())
