"""Which kernel serves an op of the compiled model on a GPU: tritile's, or the one it replaces.

The torch.compile backend hands an op to tritile only where that does not make the model
slower: on a CUDA device, `choose(...)` times `torch.ops.tritile.mm` against `torch.mm` (the
cuBLAS call inductor would make) on random operands of the node's shape, dtype and layout
(transposed-in-place operands included), once per device name and problem, and picks tritile
where it is at least 3 % faster (`MARGIN`), each side's time the larger of two: calls made back to
back (what a step's stream sees: a call's host path hidden behind the kernels queued before it
unless it is the longer) and one call with the L2 cache flushed first (a step's operands are not
left in L2 by the op's previous call), tritile's side through the operators a compiled graph calls
(`tritile.mm_compiled`, ...: no autograd formula); `choose_bmm` does the same for `tritile.bmm`
against `torch.bmm`, `choose_product_sum` for the rewrite of `addmm` / `baddbmm` (`bias +
tritile.mm(a, b)`, the sum a separate elementwise pass) against `torch.addmm` / `torch.baddbmm`
(cuBLAS adds the bias in its epilogue), `choose_linear` for the fused `tritile.linear` (GEMM +
bias / activation / residual epilogue) against the unfused torch ops, and `choose_attention` for
`tritile.attention` against `F.scaled_dot_product_attention` (forward, plus backward when the
model's graph needs one).
The choice is kept in memory and in ``$TRITILE_CACHE_DIR/torch_backend/gemm_choice.json`` (an
unusable file or directory only costs the measurement again).  CPU tensors always take tritile
(the interpreter path the tests exercise: there is no speed to win there).

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
_CALLS_PER_SAMPLE = 10
_HOST_HEAD_START_CYCLES = 2_000_000  # ~1 ms at the H100's clocks
# tritile takes an op only when at least this much faster in isolation: on the H100 a train step
# whose ops were each chosen by <= 2 % was 1.5-2.9 % slower than inductor's (bench/NOTES.md,
# session 19) - an op timed alone does not see the step's L2 contents, clocks and fusions
MARGIN = 0.97
# "graph-ops": tritile's side times the operators a compiled graph calls (`tritile.mm_compiled`, ...,
# without the autograd formula's host time); "margin": the choice needs MARGIN; "cold": each side's
# time is also taken with the L2 cache flushed (`_median_ms`), the host given a head start;
# "residual-folded": a fused linear's rival leaves the residual add to the next kernel;
# "graph-backward": attention's backward timed as the backward graph calls it; choices timed or
# decided before are measured again
_METHOD = f"{_CALLS_PER_SAMPLE}-back-to-back-graph-ops-margin{MARGIN}-cold-host-head-start-residual-folded-graph-backward"


@dataclass(frozen=True)
class Choice:
    tritile: bool
    tritile_ms: float = 0.0
    fallback_ms: float = 0.0
    rival: str = "cuBLAS"

    @property
    def reason(self) -> str:
        if self.tritile:
            return ""
        if self.tritile_ms < self.fallback_ms:
            return (f"tritile is faster on this shape by less than the {1 - MARGIN:.0%} margin ({self.tritile_ms:.3f} "
                    f"ms against {self.rival}'s {self.fallback_ms:.3f} ms)")
        return (f"{self.rival} is faster on this shape ({self.fallback_ms:.3f} ms against tritile's "
                f"{self.tritile_ms:.3f} ms)")


def _path():
    return cache.cache_dir() / "torch_backend" / "gemm_choice.json"


def _key(device: torch.device, m: int, n: int, k: int, dtype: torch.dtype, trans_a: bool, trans_b: bool) -> str:
    return f"{torch.cuda.get_device_name(device)}|{m}x{n}x{k}|{dtype}|{int(trans_a)}{int(trans_b)}"


def _operand(rows: int, cols: int, transposed: bool, dtype, device, batch: int = None) -> torch.Tensor:
    """A random (rows, cols) matrix (a batch of them when `batch`); `transposed`: the transpose of
    a contiguous (cols, rows) one, as the backward's w.t()."""
    lead = () if batch is None else (batch,)
    if transposed:
        return torch.randn(*lead, cols, rows, device=device).to(dtype).transpose(-1, -2)
    return torch.randn(*lead, rows, cols, device=device).to(dtype)


def _median_ms(fn) -> float:
    """The time a call of `fn` costs a compiled model's step: the larger of two medians over
    `_REPEATS` samples - the time per call of `_CALLS_PER_SAMPLE` calls made back to back (the
    host path of a call overlaps the kernels queued before it and counts only where it is the
    longer: a host-bound step), and one call timed alone after the L2 cache is overwritten (in a
    step the operands come from other kernels, not from this op's previous call, whereas
    back-to-back calls leave an operand that fits in L2 there: two GEMMs chosen 3 % faster back to
    back took 14 % longer than cuBLAS's in the train step, bench/NOTES.md session 19)."""
    fn()  # compile / warm up
    torch.cuda.synchronize()
    back_to_back, cold = [], []
    flush = _l2_flush_buffer()
    for _ in range(_REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(_CALLS_PER_SAMPLE):
            fn()
        end.record()
        end.synchronize()
        back_to_back.append(start.elapsed_time(end) / _CALLS_PER_SAMPLE)
        flush.zero_()
        # the GPU waits ~1 ms past the flush while the host issues the call, so the host's path
        # (an attention's forward and backward: a few hundred microseconds of Python) does not
        # count: in a compiled step the queue ahead hides it (session 20: the flush alone, ~85 us,
        # left the fused out-projection 0.159 ms cold against 0.078 with do_bench)
        torch.cuda._sleep(_HOST_HEAD_START_CYCLES)
        start.record()
        fn()
        end.record()
        end.synchronize()
        cold.append(start.elapsed_time(end))
    return max(sorted(times)[len(times) // 2] for times in (back_to_back, cold))


_L2_FLUSH_BYTES = 256 * 2 ** 20  # over twice an H100's 50 MB L2 (triton.testing.do_bench's choice)
_flush_buffers: dict = {}


def _l2_flush_buffer() -> torch.Tensor:
    """A buffer on the current CUDA device whose overwriting evicts the L2 cache, made once."""
    device = torch.cuda.current_device()
    if device not in _flush_buffers:
        _flush_buffers[device] = torch.empty(_L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    return _flush_buffers[device]


def _timed(tritile_fn, fallback_fn, rival: str) -> Choice:
    tritile_ms, fallback_ms = _median_ms(tritile_fn), _median_ms(fallback_fn)
    return Choice(tritile_ms <= MARGIN * fallback_ms, round(tritile_ms, 4), round(fallback_ms, 4), rival)


def measure(m: int, n: int, k: int, dtype: torch.dtype, trans_a: bool, trans_b: bool, device) -> Choice:
    """Time both GEMMs on random operands of this problem (the uncached part of `choose`)."""
    a = _operand(m, k, trans_a, dtype, device)
    b = _operand(k, n, trans_b, dtype, device)
    return _timed(lambda: torch.ops.tritile.mm_compiled(a, b), lambda: torch.mm(a, b), "cuBLAS")


def _cached(device, make_key, measure_fn) -> Choice:
    """tritile on a CPU; on CUDA the choice kept for `make_key()`, else `measure_fn()` kept."""
    device = torch.device(device)
    if device.type != "cuda":
        return Choice(True)
    key = f"{_METHOD}|{make_key()}"  # choices timed another way are measured again
    with _lock:
        if key not in _memory:
            _memory.update(_load())
        if key in _memory:
            return _memory[key]
        choice = _memory[key] = measure_fn()
        _store()
    return choice


def choose(m: int, n: int, k: int, dtype: torch.dtype, trans_a: bool, trans_b: bool, device) -> Choice:
    """The faster GEMM for this problem on `device` (tritile on CPU, measured once on CUDA)."""
    return _cached(device, lambda: _key(torch.device(device), m, n, k, dtype, trans_a, trans_b),
                   lambda: measure(m, n, k, dtype, trans_a, trans_b, device))


def measure_bmm(batch: int, m: int, n: int, k: int, dtype: torch.dtype, trans_a: bool, trans_b: bool,
                device) -> Choice:
    a = _operand(m, k, trans_a, dtype, device, batch)
    b = _operand(k, n, trans_b, dtype, device, batch)
    return _timed(lambda: torch.ops.tritile.bmm_compiled(a, b), lambda: torch.bmm(a, b), "cuBLAS")


def choose_bmm(batch: int, m: int, n: int, k: int, dtype: torch.dtype, trans_a: bool, trans_b: bool,
               device) -> Choice:
    """The faster batched GEMM (`tritile.bmm` or `torch.bmm`) for this problem on `device`."""
    return _cached(device, lambda: f"bmm|{batch}x" + _key(torch.device(device), m, n, k, dtype, trans_a, trans_b),
                   lambda: measure_bmm(batch, m, n, k, dtype, trans_a, trans_b, device))


def measure_product_sum(batch, m: int, n: int, k: int, dtype: torch.dtype, trans_a: bool, trans_b: bool,
                        bias_shape: tuple, device) -> Choice:
    """`bias + tritile.mm(a, b)` (`tritile.bmm` when `batch` is not None) against torch.addmm /
    torch.baddbmm: timing the product alone would miss the separate pass the sum costs, which
    cuBLAS folds into its epilogue."""
    a = _operand(m, k, trans_a, dtype, device, batch)
    b = _operand(k, n, trans_b, dtype, device, batch)
    bias = torch.randn(bias_shape, device=device).to(dtype)
    if batch is None:
        return _timed(lambda: bias + torch.ops.tritile.mm_compiled(a, b), lambda: torch.addmm(bias, a, b),
                      "cuBLAS addmm")
    return _timed(lambda: bias + torch.ops.tritile.bmm_compiled(a, b), lambda: torch.baddbmm(bias, a, b),
                  "cuBLAS baddbmm")


def choose_product_sum(batch, m: int, n: int, k: int, dtype: torch.dtype, trans_a: bool, trans_b: bool,
                       bias_shape: tuple, device) -> Choice:
    """tritile's rewrite of addmm (`batch` None) / baddbmm or the op itself, on `device`."""
    problem = (batch, m, n, k, dtype, trans_a, trans_b, tuple(bias_shape), device)
    return _cached(device, lambda: (f"{'addmm' if batch is None else f'baddbmm|{batch}x'}|{tuple(bias_shape)}|"
                                    + _key(torch.device(device), m, n, k, dtype, trans_a, trans_b)),
                   lambda: measure_product_sum(*problem))


def measure_linear(m: int, n: int, k: int, dtype: torch.dtype, bias: bool, activation: str, residual: bool,
                   keep_preactivation: bool, device) -> Choice:
    """The rival is eager's addmm and activation kernel (inductor would fuse the elementwise
    ones into one: a slightly slower rival than inductor's), without the residual add: in a
    compiled step inductor folds that add into the kernel that reads the sum next (the next
    LayerNorm), where it costs next to nothing - timed as its own kernel it made the fused
    out-projection and fc2 linears look >= 3 % faster, and the train step with them came out
    1.3-1.5 % slower than inductor's (bench/NOTES.md, sessions 19-21)."""
    from tritile.ops.linear import activation_fn  # the fused op's own epilogue semantics

    x, weight = (torch.randn(rows, k, device=device).to(dtype) for rows in (m, n))
    b = torch.randn(n, device=device).to(dtype) if bias else None
    res = torch.randn(m, n, device=device).to(dtype) if residual else None

    def unfused():
        return activation_fn(activation)(torch.nn.functional.linear(x, weight, b))

    return _timed(lambda: torch.ops.tritile.linear_compiled(x, weight, b, res, activation, keep_preactivation),
                  unfused, "cuBLAS + torch epilogue")


def choose_linear(m: int, n: int, k: int, dtype: torch.dtype, bias: bool, activation: str, residual: bool,
                  keep_preactivation: bool, device) -> Choice:
    """`tritile.linear` (one GEMM with the epilogue) or the unfused torch ops, on `device`."""
    problem = (m, n, k, dtype, bias, activation, residual, keep_preactivation, device)
    return _cached(device, lambda: (f"linear|{int(bias)}{activation}{int(residual)}{int(keep_preactivation)}|"
                                    + _key(torch.device(device), m, n, k, dtype, False, True)),
                   lambda: measure_linear(*problem))


def measure_attention(batch: int, heads: int, heads_kv: int, seq_q: int, seq_kv: int, dim: int, dtype: torch.dtype,
                      is_causal: bool, scale, backward: bool, device) -> Choice:
    q = torch.randn(batch, heads, seq_q, dim, device=device).to(dtype).requires_grad_(backward)
    k, v = (torch.randn(batch, heads_kv, seq_kv, dim, device=device).to(dtype).requires_grad_(backward)
            for _ in range(2))
    grad = torch.randn_like(q)

    def ours():
        # what the compiled graphs call: the forward's twin without the autograd formula, then
        # (the backward graph) the backward op itself - autograd's layer (the engine and the formula)
        # cost ~0.35 ms of host time a step on the H100 machine (bench/NOTES.md, session 21), which a
        # compiled graph does not pay
        with torch.no_grad():
            out, lse = torch.ops.tritile.attention_compiled(q, k, v, is_causal, scale)
            if backward:
                torch.ops.tritile.attention_backward(grad, q, k, v, out, lse, is_causal, scale)

    def sdpa():
        with torch.enable_grad():  # the backend measures under no_grad
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=is_causal, scale=scale, enable_gqa=heads != heads_kv)
            if backward:
                q.grad = k.grad = v.grad = None
                out.backward(grad)

    return _timed(ours, sdpa, "SDPA")


def choose_attention(batch: int, heads: int, heads_kv: int, seq_q: int, seq_kv: int, dim: int, dtype: torch.dtype,
                     is_causal: bool, scale, backward: bool, device) -> Choice:
    """`tritile.attention` or `F.scaled_dot_product_attention` (whichever kernel SDPA picks) on
    `device`: the forward, and the backward too when `backward`."""
    problem = (batch, heads, heads_kv, seq_q, seq_kv, dim, dtype, is_causal, scale, backward, device)
    return _cached(device, lambda: (f"attention|{batch}x{heads}/{heads_kv}x{seq_q}x{seq_kv}x{dim}|{dtype}|"
                                    f"{int(is_causal)}|{scale}|{int(backward)}|{torch.cuda.get_device_name(device)}"),
                   lambda: measure_attention(*problem))


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
