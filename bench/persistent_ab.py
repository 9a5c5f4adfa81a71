"""A/B of persistent scheduling for the split attention kernel, in one process: the same
lowered kernel launched one CTA per tile ("split"), persistent with rounds alternating
direction ("snake"), and persistent with tiles of different costs dealt from a schedule
table where that evens the programs' work out ("table", the default; for non-causal tiles,
all equal, it is the snake).  Variants are timed interleaved, `ROUNDS` times, each result
checked against torch first.  VARIANTS (default all) picks variants by name.
Run: PYTHONPATH=$PWD python bench/persistent_ab.py  (writes $OUT/persistent_ab.json)."""
import json
import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ["TRITILE_PERSISTENT"] = "0"

from examples.flash_attention import flashattn, ref_program, tile_config  # noqa: E402
from tritile.codegen.gluon import compile_kernel  # noqa: E402
from tritile.lowering import run_passes  # noqa: E402
from tritile.lowering.persistent_tiles import num_sms, persist  # noqa: E402
from tritile.runtime.target import Target  # noqa: E402

H100 = Target("cuda", 90)
CASES = [(4, 32, 4096, 128, False), (4, 32, 4096, 128, True), (16, 16, 2048, 128, True), (1, 32, 8192, 128, True)]


def main():
    sms = num_sms(H100)
    results = {}
    for B, H, S, D, causal in CASES:
        lowered = run_passes(flashattn(B, H, S, S, D, causal, **tile_config("cuda", D)).stages[0][1], H100)[-1][1]
        variants = {"split": lambda: lowered, "snake": lambda: persist(lowered, sms, balance=False),
                    "table": lambda: persist(lowered, sms)}
        chosen = os.environ.get("VARIANTS", ",".join(variants)).split(",")
        kernels = {name: compile_kernel(variants[name](), H100) for name in chosen}
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
        ref = ref_program(q, k, v, causal).float()
        out = torch.empty_like(q)
        for name, kern in kernels.items():
            out.fill_(float("nan"))
            kern.launch([q, k, v, out], {})
            torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())
        flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
        case = f"attn {B}x{H}x{S}x{D}{' causal' if causal else ''}"
        samples = {name: [] for name in kernels}
        for _ in range(int(os.environ.get("ROUNDS", "3"))):
            for name, kern in kernels.items():
                ms = do_bench(lambda: kern.launch([q, k, v, out], {}), warmup=25, rep=200, return_mode="median")
                samples[name].append(flops / ms / 1e9)
        results[case] = samples
        print(case, {n: [round(x, 1) for x in xs] for n, xs in samples.items()}, flush=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=__import__("triton").__version__)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "persistent_ab.json"), "w") as f:
            json.dump(dict(meta, tflops=results), f, indent=1)


if __name__ == "__main__":
    main()
