"""Which GEMM serves a matmul of the compiled model on a GPU: tritile.mm, or the one it replaces.

The torch.compile backend hands a matmul to tritile only where that does not make the model
slower: on a CUDA device, `choose(...)` times `torch.ops.tritile.mm` against `torch.mm` (the
cuBLAS call inductor would make) on random operands of the node's shape, dtype and layout
(transposed-in-place operands included), once per device name and problem, and picks the
faster.  The choice is kept in memory and in ``$TRITILE_CACHE_DIR/torch_backend/gemm_choice.json``
(an unusable file or directory only costs the measurement again).  CPU tensors always take
tritile (the interpreter path the tests exercise: there is no speed to win there).

`Choice.reason` says why tritile was not chosen, for `explain`.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass

import torch

from tritile.runtime import cache

_lock = threading.Lock()
_memory: dict = {}
_REPEATS = 20


@dataclass(frozen=True)
class Choice:
    tritile: bool
    tritile_ms: float = 0.0
    fallback_ms: float = 0.0

    @property
    def reason(self) -> str:
        if self.tritile:
            return ""
        return f"cuBLAS is faster on this shape ({self.fallback_ms:.3f} ms against tritile's {self.tritile_ms:.3f} ms)"


def _path():
    return cache.cache_dir() / "torch_backend" / "gemm_choice.json"


def _key(device: torch.device, m: int, n: int, k: int, dtype: torch.dtype, trans_a: bool, trans_b: bool) -> str:
    return f"{torch.cuda.get_device_name(device)}|{m}x{n}x{k}|{dtype}|{int(trans_a)}{int(trans_b)}"


def _operand(rows: int, cols: int, transposed: bool, dtype, device) -> torch.Tensor:
    if transposed:  # the transpose of a contiguous (cols, rows) matrix, as the backward's w.t()
        return torch.randn(cols, rows, device=device).to(dtype).t()
    return torch.randn(rows, cols, device=device).to(dtype)


def _median_ms(fn) -> float:
    fn()  # compile / warm up
    torch.cuda.synchronize()
    times = []
    for _ in range(_REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def measure(m: int, n: int, k: int, dtype: torch.dtype, trans_a: bool, trans_b: bool, device) -> Choice:
    """Time both GEMMs on random operands of this problem (the uncached part of `choose`)."""
    a = _operand(m, k, trans_a, dtype, device)
    b = _operand(k, n, trans_b, dtype, device)
    tritile_ms = _median_ms(lambda: torch.ops.tritile.mm(a, b))
    fallback_ms = _median_ms(lambda: torch.mm(a, b))
    return Choice(tritile_ms <= fallback_ms, round(tritile_ms, 4), round(fallback_ms, 4))


def choose(m: int, n: int, k: int, dtype: torch.dtype, trans_a: bool, trans_b: bool, device) -> Choice:
    """The faster GEMM for this problem on `device` (tritile on CPU, measured once on CUDA)."""
    device = torch.device(device)
    if device.type != "cuda":
        return Choice(True)
    key = _key(device, m, n, k, dtype, trans_a, trans_b)
    with _lock:
        if key not in _memory:
            _memory.update(_load())
        if key in _memory:
            return _memory[key]
        choice = _memory[key] = measure(m, n, k, dtype, trans_a, trans_b, device)
        _store()
    return choice


def _load() -> dict:
    try:
        entries = json.loads(_path().read_text())
        return {key: Choice(**value) for key, value in entries.items()}
    except (OSError, ValueError, TypeError):
        return {}


def _store() -> None:
    data = json.dumps({key: vars(choice) for key, choice in _memory.items()}, indent=1).encode()
    try:
        cache.write_atomic(_path(), data)
    except OSError as err:
        cache.warn_unusable(_path().parent, err, "GEMM choices are kept in memory")
