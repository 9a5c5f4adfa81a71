"""The environment switches that choose between schedules (TRITILE_WARP_SPECIALIZE,
TRITILE_PERSISTENT, TRITILE_CONSUMER_PARTITIONS): one spelling of on / off / auto for all.
`overridden(settings)` sets some for the passes run inside it (a kernel's `pass_configs`), in
this thread and context only, over the environment."""
from __future__ import annotations

import contextlib
import contextvars
import os

_overrides = contextvars.ContextVar("tritile_schedule_overrides", default={})


@contextlib.contextmanager
def overridden(settings: dict):
    token = _overrides.set({**_overrides.get(), **settings})
    try:
        yield
    finally:
        _overrides.reset(token)


def current_overrides() -> tuple:
    """The settings `overridden` holds here, as a hashable key."""
    return tuple(sorted(_overrides.get().items()))


def schedule_switch(variable: str, default: str = "auto") -> str:
    """"on", "off" or "auto" from an override, else environment variable `variable` (unset: `default`)."""
    value = str(_overrides.get().get(variable, os.environ.get(variable, default))).strip().lower()
    if value in ("0", "off", "false", ""):
        return "off"
    return "on" if value in ("1", "on", "true") else "auto"
