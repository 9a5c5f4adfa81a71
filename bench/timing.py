"""What the session-16 benchmark scripts share: CUDA-event timing, loading an example program,
writing a result.

`median_ms(fn, repeats)` - the median of `repeats` timed calls of `fn` after 3 warm-up calls,
each call between two CUDA events and synchronised; `median_batched_ms(fn)` - the same per call
of batches of back-to-back calls (host call paths hidden); `load_example(name)` - examples/<name>.py
as a module (the benchmarks time the examples' own kernels); `save(path, rows)` - the rows as
json with the run's device, versions and date; `save_report(path, fields)` - a replay's fields so.
"""
from __future__ import annotations

import datetime
import importlib.util
import json
import os
from pathlib import Path

import torch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def median_ms(fn, repeats: int = 20) -> float:
    return median_batched_ms(fn, calls=1, rounds=repeats)


def median_batched_ms(fn, calls: int = 20, rounds: int = 7) -> float:
    """Per-call time of `calls` back-to-back calls of `fn` between two CUDA events, the median of
    `rounds` such batches: the queue stays full, so a host call path shorter than the kernel
    (tritile's warm call, ~15 us) does not count, as it does for `median_ms`'s single calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def save(path, rows: list) -> None:
    import triton

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (interpreter: a dry run)"
    result = {"device": device, "torch": torch.__version__, "triton": triton.__version__,
              "date": datetime.datetime.now().isoformat(timespec="seconds"), "rows": rows}
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def save_report(path, fields: dict) -> None:
    """A GPU replay's report: the device, versions and date (UTC), then `fields`, as json at `path`."""
    import triton

    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **fields}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {path}")
