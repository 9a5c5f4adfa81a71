"""Each kernel of two TileLang examples timed by itself under tritile, at the examples' sizes:
where the time of `flash_attention/example_gqa_bwd.py` (8x32x1024, head dims 192 / 128, 16
groups) and `online_softmax/online_softmax.py` (8192x8192 fp16) goes.

    PYTHONPATH=$PWD python bench/tilelang_example_kernels.py EXAMPLES_DIR [--out results.json]

EXAMPLES_DIR is ../shared/tilelang-examples (TileLang's examples: test data, not ours); the
examples' functions are imported from their files with `import tilelang` resolving to tritile
(`tilelang_alias.py`), nothing in them changed.  Each kernel is checked against torch, then
timed with `triton.testing.do_bench` (median, L2 flushed between calls, as TileLang's
profiler); the table gives ms, TFLOP/s for the attention kernels and GB/s (bytes each input read
once and each output written once) for the memory-bound ones, and the registers and spill
bytes Triton reports for each kernel's cubin.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, os.path.dirname(__file__))
from timing import save  # noqa: E402


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def resources(kernel) -> dict:
    """Registers and spill bytes of `kernel`'s compiled cubin (Triton's report after loading)."""
    compiled = kernel._codegen(kernel.plan_target).compiled
    compiled._init_handles()
    return {"regs": compiled.n_regs, "spill_bytes": compiled.n_spills}


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def gqa_bwd_rows(examples: Path) -> list:
    g = load(examples / "flash_attention/example_gqa_bwd.py", "example_gqa_bwd")
    B, H, N, DQK, DV, G = 8, 32, 1024, 192, 128, 16  # the example's defaults (its argparse)
    HKV = H // G
    dev = "cuda"
    q = torch.randn(B, N, H, DQK, dtype=torch.half, device=dev)
    k = torch.randn(B, N, HKV, DQK, dtype=torch.half, device=dev)
    v = torch.randn(B, N, HKV, DV, dtype=torch.half, device=dev)
    do = torch.randn(B, N, H, DV, dtype=torch.half, device=dev)
    fwd = g.flashattn_fwd(B, H, N, DQK, DV, False, 128, 64, G)
    prep = g.flashattn_bwd_preprocess(B, H, N, DV)
    post = g.flashattn_bwd_postprocess(B, H, N, DQK)
    bwd = g.flashattn_bwd_atomic_add(B, H, N, DQK, DV, False, 128, 32, threads=256, num_stages=2, groups=G)
    o, lse = fwd(q, k, v)
    delta = prep(o, do)
    dq = torch.zeros(B, N, H, DQK, dtype=torch.float32, device=dev)
    dk = torch.zeros(B, N, HKV, DQK, dtype=torch.float32, device=dev)
    dv = torch.zeros(B, N, HKV, DV, dtype=torch.float32, device=dev)
    bwd(q, k, v, do, lse, delta, dq, dk, dv)
    dq_out = post(dq)

    # the check: torch's autograd on fp32 copies
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    ref = g.ref_program(qf, kf, vf, False, G)
    ref.backward(do.float())
    for name, got, want in (("O", o.float(), ref), ("dQ", dq_out.float(), qf.grad), ("dK", dk, kf.grad),
                            ("dV", dv, vf.grad)):
        err = ((got - want).norm() / want.norm()).item()
        assert err < 2e-2, f"gqa_bwd {name}: relative error {err:.3g}"

    flops_qk = 2.0 * B * H * N * N * DQK
    flops_v = 2.0 * B * H * N * N * DV
    rows = []

    def row(name, kernel, fn, flops=None, bytes_moved=None):
        ms = bench(fn)
        r = {"example": "gqa_bwd", "kernel": name, "ms": round(ms, 4), **resources(kernel)}
        if flops:
            r["tflops"] = round(flops / ms * 1e-9, 1)
        if bytes_moved:
            r["gb_s"] = round(bytes_moved / ms * 1e-6, 1)
        rows.append(r)

    row("flashattn_fwd", fwd, lambda: fwd(q, k, v), flops=flops_qk + flops_v)
    row("bwd_preprocess", prep, lambda: prep(o, do), bytes_moved=2 * o.numel() * 2 + delta.numel() * 4)
    row("bwd_atomic_add", bwd, lambda: bwd(q, k, v, do, lse, delta, dq, dk, dv), flops=2 * flops_qk + 2 * flops_v + flops_qk)
    row("bwd_postprocess", post, lambda: post(dq), bytes_moved=dq.numel() * (4 + 2))

    def backward():  # what the example's backward runs: the three kernels, zeroed grads, casts
        d = prep(o, do)
        gq, gk, gv = torch.zeros_like(dq), torch.zeros_like(dk), torch.zeros_like(dv)
        bwd(q, k, v, do, lse, d, gq, gk, gv)
        return post(gq), gk.half(), gv.half()

    ms = bench(backward)
    rows.append({"example": "gqa_bwd", "kernel": "backward (prep+bwd+post+zeros+casts)", "ms": round(ms, 4),
                 "tflops": round((3 * flops_qk + 2 * flops_v) / ms * 1e-9, 1)})
    return rows


def gqa_bwd_head_dim_rows(examples: Path, head_dims: list) -> list:
    """The backward kernel alone at other Q/K head dims (the example's 192 is padded to 256
    lanes, ir/padding.py): what the pad lanes cost, TFLOP/s counted on the real dims."""
    g = load(examples / "flash_attention/example_gqa_bwd.py", "example_gqa_bwd")
    B, H, N, DV, G = 8, 32, 1024, 128, 16
    rows = []
    for dqk in head_dims:
        bwd = g.flashattn_bwd_atomic_add(B, H, N, dqk, DV, False, 128, 32, threads=256, num_stages=2, groups=G)
        q, do = (torch.randn(B, N, H, d, dtype=torch.half, device="cuda") for d in (dqk, DV))
        k, v = (torch.randn(B, N, H // G, d, dtype=torch.half, device="cuda") for d in (dqk, DV))
        lse, delta = (torch.rand(B, H, N, device="cuda") for _ in range(2))
        grads = [torch.zeros(t.shape, device="cuda") for t in (q, k, v)]
        ms = bench(lambda: bwd(q, k, v, do, lse, delta, *grads))
        flops = 2.0 * B * H * N * N * (3 * dqk + 2 * DV)
        rows.append({"example": "gqa_bwd", "kernel": f"bwd_atomic_add d_qk={dqk}", "ms": round(ms, 4),
                     "tflops": round(flops / ms * 1e-9, 1), **resources(bwd)})
    return rows


def online_softmax_rows(examples: Path) -> list:
    # the file runs its own test at import: take the kernel's definition only, with its sizes
    text = (examples / "online_softmax/online_softmax.py").read_text().split("\nM = 8192")[0]
    path = Path(os.environ.get("TMPDIR", "/tmp")) / "online_softmax_kernel.py"
    path.write_text(text + "\nM = 8192\nN = 8192\n")
    softmax = load(path, "online_softmax_kernel").softmax_kernel
    x = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    y = softmax(x)
    err = ((y.float() - x.float().softmax(1)).norm() / x.float().softmax(1).norm()).item()
    assert err < 1e-2, f"online_softmax: relative error {err:.3g}"
    kernel = softmax._specialize((x,), {})[0]
    ms = bench(lambda: softmax(x))
    torch_ms = bench(lambda: x.softmax(dim=1))
    moved = 2 * x.numel() * 2
    return [{"example": "online_softmax", "kernel": "softmax_kernel", "ms": round(ms, 4),
             "gb_s": round(moved / ms * 1e-6, 1), **resources(kernel)},
            {"example": "online_softmax", "kernel": "torch softmax", "ms": round(torch_ms, 4),
             "gb_s": round(moved / torch_ms * 1e-6, 1)}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("examples", type=Path)
    parser.add_argument("--only", choices=("gqa_bwd", "online_softmax"), default=None)
    parser.add_argument("--head-dims", type=int, nargs="*", default=[],
                        help="also time gqa_bwd's backward kernel at these Q/K head dims")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "bench/results"),
                                                      "tilelang_example_kernels_h100.json"))
    args = parser.parse_args()
    examples = args.examples.resolve()
    sys.path.insert(0, str(examples))
    import tilelang_alias  # noqa: F401  (`import tilelang` -> tritile)

    rows = []
    for name, rows_of in (("online_softmax", online_softmax_rows), ("gqa_bwd", gqa_bwd_rows)):
        if args.only in (None, name):
            rows += rows_of(examples)
    if args.head_dims:
        rows += gqa_bwd_head_dim_rows(examples, args.head_dims)
    save(args.out, rows)
    for r in rows:
        extra = "  ".join(f"{k}={r[k]}" for k in ("tflops", "gb_s", "regs", "spill_bytes") if k in r)
        print(f"{r['example']:>15} {r['kernel']:<40} {r['ms']:9.4f} ms  {extra}", flush=True)


if __name__ == "__main__":
    main()
