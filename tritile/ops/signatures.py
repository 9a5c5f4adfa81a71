"""What the torch operators remember per call signature, so that a repeated call (every step of
a model) skips its argument checks and kernel choice.

Contract:
* `signature(*tensors)` is everything an operator's checks and kernel choice read of its tensor
  arguments: each one's type, dtype, shape, strides and device (None for an absent optional
  argument).  For an argument that is not a strided tensor it raises one of `MISSES`.
* `Remembered()` maps a call's signature (with its other arguments) to what the first call of that
  signature worked out (its compiled kernel, prepared for the tensors the signature's calls pass
  it - `JITKernel.prepare`, whose checks a warm call then skips too -, its layout decisions);
  `remember(key, value)` stores it, starting over past `limit` entries.
An operator looks its call up first (`remembered[key]`, the key built inside `try: ...
except MISSES`) and on a miss takes its first-call path: the argument checks (TypeError /
ValueError naming the argument), then `remember`.  An entry is only
stored after the checks passed, and its key fixes everything they read, so a call that finds one
would pass them again; every bad argument still reaches the checks and their messages.
"""
from __future__ import annotations

# a call not remembered (KeyError), or an argument that is not a strided tensor (no dtype, shape
# or strides: AttributeError, TypeError; a sparse tensor's strides: RuntimeError)
MISSES = (KeyError, AttributeError, TypeError, RuntimeError)


def signature(*tensors) -> tuple:
    """Each tensor's (type, dtype, shape, strides, device), or None for a None."""
    return tuple([None if t is None else (type(t), t.dtype, t.shape, t.stride(), t.device) for t in tensors])


class Remembered(dict):
    """call key -> what the first call of that key worked out; at most `limit` entries."""

    def __init__(self, limit: int = 256):
        super().__init__()
        self.limit = limit

    def remember(self, key, value):
        """Store and return `value` (after the call's checks passed)."""
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value
