"""A kernel function's source as the frontend sees it.

Assumes the function was defined in a file `inspect` can read.  Guarantees: `tree` is the
`ast.FunctionDef` of the function (decorators ignored), `loc(node)` gives the user's real
file, line, column and line text, and `lookup(name)` resolves a free name through the
closure, the locals of the scope that applied the decorator (names the function's
annotations use without capturing them), the module globals and the builtins.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import textwrap

from tritile.errors import CompileError
from tritile.ir.nodes import SourceLoc

_MISSING = object()


class FunctionSource:
    def __init__(self, fn, caller_locals: dict = None):
        self.fn = fn
        self.caller_locals = dict(caller_locals or {})
        self.name = fn.__name__
        try:
            lines, first_lineno = inspect.getsourcelines(fn)
            self.filename = inspect.getsourcefile(fn) or inspect.getfile(fn)
        except (OSError, TypeError) as exc:
            raise CompileError(f"cannot read the source of {fn.__qualname__}: {exc}") from None
        self.first_lineno = first_lineno
        self.lines = lines
        text = textwrap.dedent("".join(lines))
        self.indent = len(lines[0]) - len(lines[0].lstrip())
        module = ast.parse(text)
        defs = [n for n in module.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        if not defs:
            raise CompileError(f"{fn.__qualname__} is not a plain function definition")
        self.tree = defs[0]
        self.globals = fn.__globals__
        self.closure = {}
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                self.closure[name] = cell.cell_contents
            except ValueError:  # a cell not yet assigned
                pass

    def loc(self, node) -> SourceLoc:
        lineno = getattr(node, "lineno", 1)
        index = lineno - 1
        line = self.lines[index].rstrip("\n") if 0 <= index < len(self.lines) else ""
        return SourceLoc(self.filename, self.first_lineno + index, getattr(node, "col_offset", 0) + self.indent,
                         line)

    def lookup(self, name: str):
        """The value of a free name, or `_MISSING`."""
        for table in (self.closure, self.caller_locals, self.globals, vars(builtins)):
            if name in table:
                return table[name]
        return _MISSING


MISSING = _MISSING
