"""Rewrites of the PTX Triton generates for tritile's kernels, around faults of ptxas.

Both CUDA backends compile through Triton, whose NVIDIA pipeline ends ``llir -> ptx -> cubin``;
`applied()` makes the ``ptx`` stage of the compiles inside it return `fixed_ptx` of Triton's PTX,
so the cubin, Triton's cache and ``get_source("ptx")`` all hold the fixed text.  A fault is fixed
here, at the instruction ptxas compiles wrong, rather than at the source forms that lead LLVM to
emit it: LLVM finds the same instruction behind forms no pattern in the generators anticipates.

* **int16 negation and abs** (bench/NOTES.md sessions 26-27): ptxas negates a 16-bit integer in
  its sign-extended 32-bit register and then takes the result for sign-extended, so
  ``neg.s16`` / ``abs.s16`` of -32768 read as +32768 once divided, shifted, compared or widened
  (measured on the H100; `-x`, `0 - x`, `x * -1`, `~x + 1` and `T.abs` all reach ``neg.s16`` /
  ``abs.s16``).  Each becomes the 32-bit operation on the sign-extended operand, truncated back;
  ptxas then sign-extends the truncated result again.

The hook is installed only for the duration of `applied()` and acts only on the thread inside
it; a hook of the user's (``knobs.runtime.add_stages_inspection_hook``) still runs.  Triton's
cache key does not cover the hook, but tritile's sources are part of it (`runtime/cache.py`), so
a change of this module never serves PTX fixed otherwise.
"""
from __future__ import annotations

import contextlib
import re
import threading

_INT16_SIGN = re.compile(r"^(?P<indent>[ \t]*)(?P<guard>@!?%\w+[ \t]+)?(?P<op>neg|abs)\.s16[ \t]+"
                         r"(?P<dst>%\w+),[ \t]*(?P<src>%\w+);", re.MULTILINE)


def _int16_sign_as_32_bit(match: re.Match) -> str:
    wide = "%tritile_wide"
    return (f"{match['indent']}{{ .reg .b32 {wide}; cvt.s32.s16 {wide}, {match['src']}; "
            f"{match['op']}.s32 {wide}, {wide}; {match['guard'] or ''}cvt.u16.u32 {match['dst']}, {wide}; }}")


def fixed_ptx(ptx: str) -> str:
    """`ptx` with every instruction of the module docstring rewritten (the rest unchanged)."""
    return _INT16_SIGN.sub(_int16_sign_as_32_bit, ptx)


_lock = threading.Lock()
_inside = threading.local()  # .depth: how many `applied()` blocks this thread is in
_installed = {"blocks": 0, "users_hook": None}


def _hook(backend, stages, options, language, capability):
    users_hook = _installed["users_hook"]
    if users_hook is not None:
        users_hook(backend, stages, options, language, capability)
    if getattr(_inside, "depth", 0) and "ptx" in stages:
        make_ptx = stages["ptx"]
        stages["ptx"] = lambda src, metadata: fixed_ptx(make_ptx(src, metadata))


@contextlib.contextmanager
def applied():
    """Triton compiles on this thread inside the block get `fixed_ptx` as their PTX.  The hook is
    Triton's knob while any thread is inside a block; the user's hook is restored after the last."""
    from triton import knobs

    with _lock:
        if _installed["blocks"] == 0:
            _installed["users_hook"] = knobs.runtime.add_stages_inspection_hook
            knobs.runtime.add_stages_inspection_hook = _hook
        _installed["blocks"] += 1
    _inside.depth = getattr(_inside, "depth", 0) + 1
    try:
        yield
    finally:
        _inside.depth -= 1
        with _lock:
            _installed["blocks"] -= 1
            if _installed["blocks"] == 0 and knobs.runtime.add_stages_inspection_hook is _hook:
                knobs.runtime.add_stages_inspection_hook = _installed["users_hook"]
