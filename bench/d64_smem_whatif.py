"""Would reusing shared memory across disjoint lifetimes lift head-dim-64 attention?  An upper
bound before building a shared-memory reuse pass.

examples/flash_attention.py's `O_shared` is live only in the epilogue, `Q_shared` only before
it, yet each gets its own shared memory.  For 64x128 tiles (block_N = 128 halves the per-key
softmax bookkeeping of 64x64 tiles) that is 82 KB a CTA, two CTAs an SM; with the epilogue
staged through `Q_shared` instead it is 74 KB, three.  The what-if program is the example with
exactly that edit made to its source text (what a reuse pass would produce), so its results
stay exact and are checked.  Timed against the example's 64x64 config and cuDNN, three rounds
in rotating order, `do_bench(warmup=50, rep=300, median)`, B=16 H=16 S=1024 D=64, non-causal
and causal.
Since `codegen/gluon/shared_lifetimes.py` the example itself reuses Q's bytes, so both programs
now compile alike; the script stays as the record of the measurement that led to it.
Run: PYTHONPATH=$PWD python bench/d64_smem_whatif.py
"""
from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import tempfile

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import examples.flash_attention as example  # noqa: E402

EDITS = [("T.copy(acc_o, O_shared)\n            T.copy(O_shared, Output[", "T.copy(acc_o, Q_shared)\n            T.copy(Q_shared, Output["),
         ("            O_shared = T.alloc_shared([block_M, dim], dtype)\n", "")]


def epilogue_through_q_shared():
    """examples/flash_attention.py with its epilogue staged through Q_shared (written to a file
    of its own: the frontend reads a kernel's source from its file)."""
    source = open(example.__file__).read()
    for old, new in EDITS:
        assert old in source, "the example changed: update EDITS"
        source = source.replace(old, new)
    path = os.path.join(tempfile.mkdtemp(), "flash_attention_q_epilogue.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("flash_attention_q_epilogue", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.flashattn


def main():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    reuse = epilogue_through_q_shared()
    B, H, S, D = 16, 16, 1024, 64
    configs = {"64x64 s2": dict(block_M=64, block_N=64, num_stages=2, threads=128),
               "64x128 s2": dict(block_M=64, block_N=128, num_stages=2, threads=128)}
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for causal in (False, True):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ref = sdpa(q, k, v, is_causal=causal)
        candidates = {"cudnn": lambda: sdpa(q, k, v, is_causal=causal)}
        for name, cfg in configs.items():
            for label, program in ((name, example.flashattn), (f"{name} O via Q_shared", reuse)):
                kernel = program(B, H, S, S, D, causal, **cfg)
                out = kernel(q, k, v)
                err = float((out.double() - ref.double()).norm() / ref.double().norm())
                shared = kernel._device_kernel.metadata.shared
                if err > 1e-2:
                    print(f"  {label}: WRONG, rel err {err:.3g}")
                    continue
                candidates[f"{label} ({shared // 1024} KB)"] = lambda kernel=kernel: kernel(q, k, v)
        flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
        results = {name: [] for name in candidates}
        names = list(candidates)
        for round_index in range(3):
            for name in names[round_index:] + names[:round_index]:
                if name == "cudnn":
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        ms = do_bench(candidates[name], warmup=50, rep=300, return_mode="median")
                else:
                    ms = do_bench(candidates[name], warmup=50, rep=300, return_mode="median")
                results[name].append(flops / (ms * 1e-3) / 1e12)
        print(f"\n16x16x1024x64{' causal' if causal else ''}: TFLOP/s per round, median")
        for name, values in results.items():
            print(f"  {name:34s} {' / '.join(f'{x:6.1f}' for x in values)}   {statistics.median(values):6.1f}")


if __name__ == "__main__":
    main()
