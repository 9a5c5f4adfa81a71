"""User-facing errors.

`CompileError` points at the user's source line; `HazardError` is raised by the reference
interpreter when an asynchronous schedule would read or overwrite data in flight.
"""
from __future__ import annotations

from typing import Optional

from tritile.ir.nodes import SourceLoc


class CompileError(Exception):
    """An invalid tile program.  The message quotes the user's file:line and source line."""

    def __init__(self, message: str, loc: Optional[SourceLoc] = None):
        self.message = message
        self.loc = loc
        super().__init__(self._format())

    def _format(self) -> str:
        if self.loc is None:
            return self.message
        text = f"{self.loc.filename}:{self.loc.lineno}: {self.message}"
        if self.loc.line:
            text += f"\n    {self.loc.line.strip()}"
        return text


class DeviceAssertError(AssertionError):
    """A `T.device_assert` whose condition the interpreter found false (a GPU kernel compiled
    in Triton's debug mode traps there instead)."""

    def __init__(self, message: str, loc: Optional[SourceLoc] = None):
        self.message = message
        self.loc = loc
        super().__init__(message if loc is None else f"{loc.filename}:{loc.lineno}: {message}")


class HazardError(RuntimeError):
    """An async copy or async gemm was used in a way that real hardware would race on."""
