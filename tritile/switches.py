"""The environment switches that choose between schedules (TRITILE_WARP_SPECIALIZE,
TRITILE_PERSISTENT, TRITILE_CONSUMER_PARTITIONS): one spelling of on / off / auto for all."""
from __future__ import annotations

import os


def schedule_switch(variable: str, default: str = "auto") -> str:
    """"on", "off" or "auto" from environment variable `variable` (unset: `default`)."""
    value = os.environ.get(variable, default).strip().lower()
    if value in ("0", "off", "false", ""):
        return "off"
    return "on" if value in ("1", "on", "true") else "auto"
