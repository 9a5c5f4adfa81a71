"""Where a persistent warp-specialized attention goes wrong: run the split kernel made
persistent on P programs for several shapes and print, per case, the max error and the
(batch, head, row block) tiles whose rows differ from torch.
Run: PYTHONPATH=$PWD python bench/persistent_check.py"""
import os
import sys

import torch

sys.path[:0] = [os.path.join(os.path.dirname(__file__), ".."), os.path.join(os.path.dirname(__file__), "..", "tests")]
os.environ["TRITILE_PERSISTENT"] = "0"

from examples.flash_attention import flashattn, ref_program, tile_config  # noqa: E402
from tritile.codegen.gluon import compile_kernel  # noqa: E402
from tritile.lowering import run_passes  # noqa: E402
from tritile.lowering.persistent_tiles import persist  # noqa: E402
from tritile.runtime.target import Target  # noqa: E402

H100 = Target("cuda", 90)
CASES = [(1, 2, 4096, True, 5), (1, 2, 4096, True, 132), (2, 8, 4096, True, 132), (4, 32, 4096, True, 132),
         (4, 32, 4096, False, 132), (4, 32, 1024, True, 132), (1, 32, 2048, True, 33)]
for B, H, S, causal, P in CASES:
    func = flashattn(B, H, S, S, 128, causal, **tile_config("cuda")).stages[0][1]
    kernel = compile_kernel(persist(run_passes(func, H100)[-1][1], P), H100)
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    kernel.launch([q, k, v, out], {})
    ref = ref_program(q, k, v, causal).float()
    err = (out.float() - ref).abs().nan_to_num(1e9).reshape(B, H, S // 128, 128 * 128).amax(-1)
    bad = (err > 0.05).nonzero().tolist()
    print(f"B={B} H={H} S={S} causal={causal} P={P}: max err {err.max().item():.3g}, bad tiles {len(bad)}/{err.numel()}"
          f" e.g. {bad[:8]}", flush=True)
