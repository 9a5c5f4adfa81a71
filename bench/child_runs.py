"""Running one benchmark setting per child process, so that nothing one setting compiled (tritile's
or Triton's on-disk caches, environment switches read at compile time) serves another.

A script's parent calls `run_in_child(__file__, flag, name)`; its `main` starts with
`if serve_child(flag, measure): return`, which in the child (`python script flag name`) hands
`measure(name)`'s dict back to the parent.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

_TAG = "RESULT "


def run_in_child(script: str, flag: str, name: str, timeout: float = None):
    """The dict the child `python script flag name` reported, run with fresh tritile and Triton
    cache dirs; None (and the child's output tail printed) when it reported nothing."""
    env = dict(os.environ, TRITILE_CACHE_DIR=tempfile.mkdtemp(), TRITON_CACHE_DIR=tempfile.mkdtemp())
    proc = subprocess.run([sys.executable, script, flag, name], env=env, capture_output=True, text=True,
                          timeout=timeout)
    line = next((line for line in proc.stdout.splitlines() if line.startswith(_TAG)), None)
    if line is None:
        print(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}", flush=True)
        return None
    return json.loads(line[len(_TAG):])


def serve_child(flag: str, measure) -> bool:
    """True in a child started by `run_in_child(script, flag, name)`, after reporting
    `measure(name)` to the parent; False in the parent."""
    if len(sys.argv) != 3 or sys.argv[1] != flag:
        return False
    print(_TAG + json.dumps(measure(sys.argv[2])), flush=True)
    return True


def attention_inputs(B, H, S, D):
    """Fresh random fp16 q, k, v of shape [B, H, S, D] on the GPU."""
    import torch

    return tuple(torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))


def attn_flops(B, H, S, D, causal) -> float:
    """FLOPs of attention forward (two gemms; causal does half)."""
    return 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
