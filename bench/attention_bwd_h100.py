"""FlashAttention backward: examples/flash_attention_bwd.py against SDPA's cuDNN backend, one run.

For each shape (fp16, [batch, heads, seq, dim]): the backward time of both (tritile: preprocess +
backward + the dQ cast; cuDNN: `out.backward(do)` of an SDPA forward under
`sdpa_kernel(CUDNN_ATTENTION)`, its forward excluded by timing the backward alone), as TFLOP/s
with the backward counted as 2.5x the forward's 4 * b * h * s^2 * d (half when causal), and the
largest difference of tritile's dq / dk / dv from cuDNN's.

    python bench/attention_bwd_h100.py --out bench/results/attention_bwd_h100.json
    python bench/attention_bwd_h100.py --out ... --sweep   # also every config of SWEEP, per shape
    python bench/attention_bwd_h100.py --out ... --kernels # also each call's kernels (torch.profiler)
"""
from __future__ import annotations

import argparse
import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from timing import load_example, median_ms, save

from tritile import switches
from tritile.ops.attention import BACKWARD_SWITCHES

SHAPES = [(4, 32, 4096, 128, False), (4, 32, 4096, 128, True), (16, 16, 1024, 64, False), (16, 16, 1024, 64, True),
          (8, 16, 2048, 64, True)]  # the last: bench/torch_compile_h100.py's train step
# backward tiles (block_M keys, block_N queries, threads, stages) tried by --sweep, per head dim: the
# example's neighbours (a third stage, the other query step) and TileLang's (example_mha_bwd_bhsd: 64 x 64
# at head dim 64, 64 x 32 at 128, one warpgroup)
SWEEP = {64: [(128, 128, 256, 3), (128, 64, 256, 2), (128, 64, 256, 3), (64, 64, 128, 2)],
         128: [(128, 64, 256, 3), (128, 32, 256, 2), (128, 32, 256, 3), (64, 32, 128, 2)]}


def on_backend(jit_function, backend):
    """`jit_function` (an example's `@tritile.jit` function) with its kernels built by `backend`
    ("gluon" / "triton"; None: the function itself)."""
    import tritile

    return jit_function if backend is None else tritile.jit(**{**jit_function.options, "backend": backend})(
        jit_function.fn)


def tritile_backward(F, q, k, v, do, causal, bwd_config=None, backend=None):
    """A call running examples/flash_attention_bwd.py's backward (preprocess, backward, dQ's cast)
    of the forward of q, k, v (run once here) -> (dq, dk, dv); `bwd_config` (block_M, block_N,
    threads, num_stages) replaces the example's backward tiles."""
    batch, heads, seq, dim = q.shape
    config = F.tile_config("cuda", dim, causal)
    if bwd_config is not None:
        config["bwd"] = dict(zip(("block_M", "block_N", "threads", "num_stages"), bwd_config))
    o, lse = on_backend(F.flashattn_fwd, backend)(batch, heads, seq, dim, causal, **config["fwd"])(q, k, v)
    pre = on_backend(F.flashattn_bwd_preprocess, backend)(batch, heads, seq, dim)
    with switches.overridden(BACKWARD_SWITCHES):  # the attention op's schedule
        bwd = on_backend(F.flashattn_bwd, backend)(batch, heads, seq, dim, causal, **config["bwd"])
    dq32 = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)

    def backward():
        dq32.zero_()
        bwd(q, k, v, do, lse, pre(o, do), dq32, dk, dv)
        return dq32.to(q.dtype), dk, dv

    delta = pre(o, do)
    backward.config = config["bwd"]
    backward.kernel_alone = lambda: bwd(q, k, v, do, lse, delta, dq32, dk, dv)  # for a profiler's range
    return backward


def sdpa_backward(q, k, v, do, causal, backend=SDPBackend.CUDNN_ATTENTION):
    """A call running SDPA's backward on `backend` (an `SDPBackend` or a list of them, the first
    that takes the inputs; its forward run once here) -> (dq, dk, dv)."""
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(backend):
        out = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)

    def backward():
        qr.grad = kr.grad = vr.grad = None
        with sdpa_kernel(backend):
            out.backward(do, retain_graph=True)
        return qr.grad, kr.grad, vr.grad

    return backward


def kernel_times(fn, calls: int = 5) -> list:
    """[kernel name, microseconds a call] of the CUDA kernels (memsets and copies too) `fn`
    launches, averaged over `calls` profiled calls after a warm-up: where a backward's time goes."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    totals = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] = totals.get(event.name, 0.0) + event.device_time / calls
    return [[name[:90], round(us, 1)] for name, us in sorted(totals.items(), key=lambda item: -item[1])]


def run_shape(F, batch, heads, seq, dim, causal, bwd_config=None, kernels=False) -> dict:
    q, k, v, do = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.float16) for _ in range(4))
    ours = tritile_backward(F, q, k, v, do, causal, bwd_config)
    cudnn = sdpa_backward(q, k, v, do, causal)
    ours_ms, cudnn_ms = median_ms(ours), median_ms(cudnn)
    flops = 2.5 * 4 * batch * heads * seq * seq * dim * (0.5 if causal else 1.0)
    errors = {name: (mine.float() - theirs.float()).abs().max().item()
              for name, mine, theirs in zip(("dq", "dk", "dv"), ours(), cudnn())}
    return {"shape": [batch, heads, seq, dim], "causal": causal, "bwd_config": ours.config,
            "tritile_ms": round(ours_ms, 4), "cudnn_ms": round(cudnn_ms, 4),
            "tritile_tflops": round(flops / ours_ms / 1e9, 1), "cudnn_tflops": round(flops / cudnn_ms / 1e9, 1),
            "ratio": round(cudnn_ms / ours_ms, 3), "max_abs_diff": {n: round(e, 4) for n, e in errors.items()},
            **({"tritile_kernels_us": kernel_times(ours), "cudnn_kernels_us": kernel_times(cudnn)} if kernels else {})}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--sweep", action="store_true", help="also time the backward tile configs of SWEEP")
    parser.add_argument("--kernels", action="store_true", help="also list each call's kernels and their times")
    args = parser.parse_args(argv)
    F = load_example("flash_attention_bwd")
    rows = []
    for shape in SHAPES:
        for bwd_config in [None] + (SWEEP[shape[3]] if args.sweep else []):
            try:
                row = run_shape(F, *shape, bwd_config=bwd_config, kernels=args.kernels and bwd_config is None)
            except Exception as err:  # a config that does not compile or fit is a row with its error
                row = {"shape": list(shape[:4]), "causal": shape[4], "bwd_config": bwd_config,
                       "error": f"{type(err).__name__}: {str(err).splitlines()[-1] if str(err) else ''}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    save(args.out, rows)


if __name__ == "__main__":
    main()
