"""A kernel function's source as the frontend sees it.

Assumes the function was defined in a file `inspect` can read.  Guarantees: `tree` is the
`ast.FunctionDef` of the function (decorators ignored), `loc(node)` gives the user's real
file, line, column and line text, and `lookup(name)` resolves a free name through the
closure, the locals of the scope that applied the decorator (names the function's
annotations use without capturing them), the module globals and the builtins.

A kernel's meaning depends on the module globals it reads, which the user may rebind after
compiling it.  `GlobalReads` records, while the frontend traces, each global a lookup
resolved (modules excepted: rebinding `T` or `torch` is not a way to change a kernel) with
the value it had; `globals_unchanged(guards)` tells whether they all still hold, which the
JIT checks before serving a cached kernel (a changed global means a new specialisation).
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import copy
import dis
import inspect
import sys
import textwrap
import threading
import types

from tritile.errors import CompileError
from tritile.ir.nodes import SourceLoc

# CPython before 3.11.8 / 3.12.2 shares `ast.parse`'s recursion counter between threads
# (gh-106905): two threads parsing at once can fail with a SystemError.  Every parse of the
# process takes this turn there: the frontend's here, Triton's (it parses each kernel it
# compiles) in `tritile.runtime.cache`.
_ast_parse_races = sys.version_info < (3, 11, 8) or (3, 12) <= sys.version_info < (3, 12, 2)
ast_parse_turn = threading.Lock() if _ast_parse_races else contextlib.nullcontext()

_MISSING = object()


# values that can change without being rebound: a guard keeps a copy to compare with
_MUTABLE = (list, dict, set, bytearray)


class GlobalReads:
    """The module globals one trace read: {(id of the globals dict, name): guard}."""

    def __init__(self):
        self._guards = {}

    def record(self, table: dict, name: str, value) -> None:
        if isinstance(value, types.ModuleType) or (id(table), name) in self._guards:
            return
        try:
            snapshot = copy.deepcopy(value) if isinstance(value, _MUTABLE) else _MISSING
        except Exception:  # noqa: BLE001 - an uncopyable container is then compared by identity only
            snapshot = _MISSING
        if snapshot is not _MISSING and not _equal(value, snapshot):
            snapshot = _MISSING  # contents without a plain == (tensors): identity only, never "always changed"
        self._guards[(id(table), name)] = (table, name, value, snapshot)

    def record_code(self, fn) -> None:
        """Record the globals that Python code `fn` (and the functions defined in it) loads:
        what a lazy-style `@tritile.jit` function, which Python runs, may have read."""
        table, stack = fn.__globals__, [fn.__code__]
        while stack:
            code = stack.pop()
            stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
            for instruction in dis.get_instructions(code):
                if instruction.opname == "LOAD_GLOBAL" and instruction.argval in table:
                    self.record(table, instruction.argval, table[instruction.argval])

    def add(self, guards) -> None:
        """Add the guards of another trace (`guards()` of another recorder)."""
        for guard in guards:
            self._guards.setdefault((id(guard[0]), guard[1]), guard)

    def guards(self) -> tuple:
        """((globals dict, name, value, copy of a mutable value or MISSING), ...)."""
        return tuple(self._guards.values())


def globals_unchanged(guards) -> bool:
    """Whether every guard's global is still bound to its value (the same object, or an equal
    one of the same type), with the same contents for a mutable container."""
    for table, name, value, snapshot in guards:
        current = table.get(name, _MISSING)
        if current is not value and not _equal(current, value):
            return False
        if snapshot is not _MISSING and not _equal(current, snapshot):
            return False
    return True


def _equal(a, b) -> bool:
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values without a plain ==, e.g. tensors: only identity counts
        return False


class FunctionSource:
    def __init__(self, fn, caller_locals: dict = None, reads: GlobalReads = None):
        self.fn = fn
        self.caller_locals = dict(caller_locals or {})
        self.reads = reads
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
        with ast_parse_turn:
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
        """The value of a free name, or `_MISSING`; a module global read is recorded in `reads`."""
        for table in (self.closure, self.caller_locals, self.globals, vars(builtins)):
            if name in table:
                value = table[name]
                if table is self.globals and self.reads is not None:
                    self.reads.record(table, name, value)
                return value
        return _MISSING


MISSING = _MISSING
