"""Would a third K/V stage lift head-dim-128 attention?  cuDNN's kernel at 4x32x4096x128 uses
232 KB of shared memory (`ncu_attention_cudnn_session14.txt`); ours uses 197 KB: Q (32 KB), two
K/V stages (128 KB) and the epilogue tile O (32 KB).  With the epilogue staged through Q's tile
instead (the edit of `d64_smem_whatif.epilogue_through_q_shared`, which a user can write in the
T program), a third stage fits: 230 KB.  Q's tile is then also written by the consumers, so the
producer no longer loads it (the consumers do, at the tile's start).

Times, three rounds in rotating order, `do_bench(warmup=50, rep=300, median)`, each result
checked against torch first: the example as it is, O through Q with 2 stages, O through Q with
3 stages, and cuDNN; B=4 H=32 S=4096 D=128, non-causal and causal.
Run: PYTHONPATH=$PWD python bench/attention_stages_whatif.py
"""
from __future__ import annotations

import os
import statistics
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import examples.flash_attention as example  # noqa: E402
from d64_smem_whatif import epilogue_through_q_shared  # noqa: E402


def main():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    through_q = epilogue_through_q_shared()
    B, H, S, D = 4, 32, 4096, 128
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
    tile = dict(block_M=128, block_N=128, threads=256)
    for causal in (False, True):
        kernels = {"example": example.flashattn(B, H, S, S, D, causal, **example.tile_config("cuda", D, causal)),
                   "O via Q, 2 stages": through_q(B, H, S, S, D, causal, num_stages=2, **tile),
                   "O via Q, 3 stages": through_q(B, H, S, S, D, causal, num_stages=3, **tile)}
        ref = example.ref_program(q, k, v, causal).float()
        timers = {}
        for name, kernel in kernels.items():
            out = kernel(q, k, v).float()
            err = float((out - ref).norm() / ref.norm())
            assert err < 1e-2, f"{name}: relative error {err}"
            timers[name] = lambda kernel=kernel: do_bench(lambda: kernel(q, k, v), warmup=50, rep=300,
                                                          return_mode="median")

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return do_bench(lambda: sdpa(q, k, v, is_causal=causal), warmup=50, rep=300, return_mode="median")
        timers["cuDNN"] = cudnn
        names = list(timers)
        samples = {name: [] for name in names}
        for r in range(3):
            for name in names[r:] + names[:r]:
                samples[name].append(4.0 * B * H * S * S * D * (0.5 if causal else 1.0) / timers[name]() / 1e9)
        for name in names:
            print(f"{'causal' if causal else 'non-causal':10s} {name:18s} median {statistics.median(samples[name]):6.1f} "
                  f"TFLOP/s  samples {[round(x, 1) for x in samples[name]]}", flush=True)
    print(torch.cuda.get_device_name(), "torch", torch.__version__)


if __name__ == "__main__":
    main()
