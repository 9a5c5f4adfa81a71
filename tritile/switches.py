"""The environment switches that choose between schedules (TRITILE_WARP_SPECIALIZE,
TRITILE_PERSISTENT, TRITILE_CONSUMER_PARTITIONS): one spelling of on / off / auto for all.
`overridden(settings)` sets some for the passes run inside it (a kernel's `pass_configs`), in
this thread and context only, over the environment.  `interpret_requested()` reads
TRITILE_INTERPRET, which every kernel call reads; `blocks_reversed()` TRITILE_BLOCK_ORDER, the
interpreter's order of blocks."""
from __future__ import annotations

import contextlib
import contextvars
import os

# (the settings `overridden` holds here, the same as a sorted tuple: the key a kernel cache takes
# on every call, built once per `overridden` rather than per call)
_overrides = contextvars.ContextVar("tritile_schedule_overrides", default=({}, ()))


@contextlib.contextmanager
def overridden(settings: dict):
    merged = {**_overrides.get()[0], **settings}
    token = _overrides.set((merged, tuple(sorted(merged.items()))))
    try:
        yield
    finally:
        _overrides.reset(token)


def current_overrides() -> tuple:
    """The settings `overridden` holds here, as a hashable key."""
    return _overrides.get()[1]


def schedule_switch(variable: str, default: str = "auto") -> str:
    """"on", "off" or "auto" from an override, else environment variable `variable` (unset: `default`)."""
    value = str(_overrides.get()[0].get(variable, os.environ.get(variable, default))).strip().lower()
    if value in ("0", "off", "false", ""):
        return "off"
    return "on" if value in ("1", "on", "true") else "auto"


def fp_fusion() -> bool:
    """Whether the GPU backends let Triton contract a float multiply and an add into one fused
    multiply-add (one rounding: Triton's `enable_fp_fusion`, nvcc's `-fmad`), from
    TRITILE_FP_FUSION: "off" rounds every operation, as docs/semantics.md and the interpreter do;
    on by default.  Read when a kernel is compiled (part of its cache key)."""
    return schedule_switch("TRITILE_FP_FUSION", "on") != "off"


def blocks_reversed() -> bool:
    """TRITILE_BLOCK_ORDER=reversed: the reference interpreter runs a grid's blocks last to first
    instead of in launch order.  A kernel whose result changes with it has blocks that race (one
    reads or writes what another writes), which the GPU runs in no fixed order.  Read per call."""
    return os.environ.get("TRITILE_BLOCK_ORDER", "launch").strip().lower() == "reversed"


def interpret_requested() -> bool:
    """TRITILE_INTERPRET is set, to anything but "" or "0": CUDA tensors run on the reference
    interpreter too.  Every kernel call on CUDA tensors reads it, so through `os.environ`'s own
    dict (CPython's `_Environ`: bytes keys on POSIX) where it has one: `os.environ.get` of an
    unset variable raises and catches a KeyError inside, ~1.7 us on the CPU machine against
    ~0.2 here.  The same value either way."""
    environ = os.environ
    data = getattr(environ, "_data", None)
    if data is None or _INTERPRET_KEY is None:
        return environ.get("TRITILE_INTERPRET", "0") not in ("", "0")
    value = data.get(_INTERPRET_KEY)
    return value is not None and environ.decodevalue(value) not in ("", "0")


# the name as `os.environ` keys its dict
_INTERPRET_KEY = os.environ.encodekey("TRITILE_INTERPRET") if hasattr(os.environ, "encodekey") else None
