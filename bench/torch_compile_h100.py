"""torch.compile(backend="tritile") against eager and inductor on one GPU, in one run (issue #18).

Two workloads, bf16:
* train - 4 pre-LN transformer blocks (d_model 1024, 16 heads, causal SDPA, GELU-tanh MLP of 4096),
  batch 8 x 2048 tokens, one forward + backward of ``out.float().square().mean()``;
* decode - the same blocks in inference, batch 64, one new token attending to a 4096-token cache.
For each backend: the first call (compile included) and the median step of timed repeats (each
backend compiled once, then the median over `--rounds` passes taking the backends in turn), and
for tritile the `explain` report of each workload (which ops became tritile.attention,
tritile.linear - the GEMMs with a fused bias / GELU / residual epilogue -, tritile.mm,
tritile.bmm, and which stayed with inductor, with the measured times that decided it).
Backends: eager, inductor, tritile (each op tritile's only where measured not slower, the
default), tritile-all (`options={"gemms": "tritile"}`: every op tritile can take, unmeasured).
With --profile, the top CUDA kernels of one train step under inductor and tritile (where the
time goes).

    python bench/torch_compile_h100.py --out bench/results/torch_compile_h100.json [--profile]
"""
from __future__ import annotations

import argparse
import datetime
import json
import time

import torch
import torch.nn.functional as F

import tritile.contrib.torch_backend as tritile_backend
from timing import median_ms

D_MODEL, HEADS, D_FF, LAYERS = 1024, 16, 4096, 4


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(D_MODEL), torch.nn.LayerNorm(D_MODEL)
        self.qkv = torch.nn.Linear(D_MODEL, 3 * D_MODEL)
        self.proj = torch.nn.Linear(D_MODEL, D_MODEL)
        self.fc1, self.fc2 = torch.nn.Linear(D_MODEL, D_FF), torch.nn.Linear(D_FF, D_MODEL)

    def attend(self, x, cache=None):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, D_MODEL // HEADS).permute(2, 0, 3, 1, 4)
        if cache is not None:  # decode: the new token against the cache (and itself)
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None)
        return x + self.proj(o.transpose(1, 2).reshape(b, t, D_MODEL))

    def forward(self, x, cache=None):
        x = self.attend(x, cache)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))

    def forward(self, x, caches=None):
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i])
        return x


def _compiled(model, backend: str):
    if backend == "tritile-all":
        return torch.compile(model, backend="tritile", options={"gemms": "tritile"})
    return model if backend == "eager" else torch.compile(model, backend=backend)


def compiled_step(workload: str, backend: str, model, inputs):
    """(the step under `backend`, its first call's seconds - compilation included)."""
    fn = _compiled(model, backend)
    if workload == "train":
        def step():
            model.zero_grad(set_to_none=True)
            fn(*inputs).float().square().mean().backward()
    else:
        def step():
            with torch.no_grad():
                fn(*inputs)
    torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    for _ in range(3):
        step()
    return step, round(first, 2)


def profile_step(model, inputs, backend: str, top: int = 30) -> list:
    torch._dynamo.reset()
    fn = _compiled(model, backend)
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        fn(*inputs).float().square().mean().backward()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        model.zero_grad(set_to_none=True)
        fn(*inputs).float().square().mean().backward()
        torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: e.device_time_total, reverse=True)[:top]
    return [{"kernel": r.key[:120], "calls": r.count, "cuda_ms": round(r.device_time_total / 1e3, 3)} for r in rows]


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=6, help="passes over the backends; each keeps its median")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--backends", default="eager,inductor,tritile,tritile-all")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = Stack().cuda().to(torch.bfloat16)
    train_inputs = (torch.randn(8, 2048, D_MODEL, device="cuda", dtype=torch.bfloat16),)
    cache_shape = (64, HEADS, 4096, D_MODEL // HEADS)
    caches = [tuple(torch.randn(cache_shape, device="cuda", dtype=torch.bfloat16) for _ in range(2))
              for _ in range(LAYERS)]
    decode_inputs = (torch.randn(64, 1, D_MODEL, device="cuda", dtype=torch.bfloat16), caches)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": __import__("triton").__version__, "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "model": f"{LAYERS} blocks, d_model {D_MODEL}, {HEADS} heads, MLP {D_FF}, bf16", "runs": {}}
    for workload, inputs in (("train", train_inputs), ("decode", decode_inputs)):
        # every backend compiled once (Dynamo keeps one entry per backend), then rounds over the
        # backends in turn in the same process, the median step of each: session 23 found the
        # decode step's rounds 3-8 % apart when each round compiled again (an inductor graph and
        # tritile's, the same kernels with the same device time: bench/NOTES.md)
        torch._dynamo.reset()
        steps = {}
        for backend in args.backends.split(","):
            steps[backend], first = compiled_step(workload, backend, model, inputs)
            result["runs"][f"{workload}/{backend}"] = {"first_call_s": first}
            print(f"{workload:6s} {backend:9s} first call {first:6.2f} s", flush=True)
        samples = {backend: [] for backend in steps}
        for r in range(args.rounds):
            backends = list(samples)
            for backend in backends[r % len(backends):] + backends[:r % len(backends)]:  # rotated: no backend always follows another
                samples[backend].append(round(median_ms(steps[backend], args.repeats), 3))
                print(f"{workload:6s} {backend:9s} round {r} step {samples[backend][-1]:8.3f} ms", flush=True)
        for backend, times in samples.items():
            entry = result["runs"][f"{workload}/{backend}"]
            entry["step_ms"], entry["step_ms_rounds"] = sorted(times)[len(times) // 2], times
            print(f"{workload:6s} {backend:9s} step {entry['step_ms']:8.3f} ms (median of {times})", flush=True)
    for workload, inputs in (("train", train_inputs), ("decode", decode_inputs)):
        with torch.set_grad_enabled(workload == "train"):
            report = tritile_backend.explain(model, *inputs)
        result[f"explain_{workload}"] = str(report)
        print(workload, report, sep="\n")
    if args.profile:
        result["profile_train"] = {b: profile_step(model, train_inputs, b) for b in ("inductor", "tritile")}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
