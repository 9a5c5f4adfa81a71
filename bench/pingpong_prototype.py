"""Prototype, measured before building it into the compiler: FA3's warp-scheduler barriers
between the two consumer warpgroups of the split attention, made by editing the generated
Gluon source.  Consumer `part` waits on named barrier 14 + part before issuing its QK^T wgmma
and, once it has issued its wgmmas of the step, lets the other consumer go (bar.arrive on the
other's barrier); consumer 1 lets consumer 0 go first.  This forces the two warpgroups to take
turns on the tensor cores, so that one's softmax runs under the other's wgmmas.

Variants (each in its own process, fresh caches): base (the compiler's code), pingpong.  For
causal attention (no deferred PV) the arrive follows the QK^T issue, otherwise the PV issue.
Run from the repo root: PYTHONPATH=$PWD python bench/pingpong_prototype.py
"""
from __future__ import annotations

import json
import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from child_runs import attention_inputs, attn_flops, run_in_child, serve_child  # noqa: E402

CASES = [(4, 32, 4096, 128, False), (4, 32, 4096, 128, True)]

SYNC = ('gl.inline_asm_elementwise("bar.sync $1, 256;\\n mov.u32 $0, 0;", "=r,r", [gl.to_tensor(14 + part)], '
        'dtype=gl.int32, is_pure=False, pack=1)')
ARRIVE = ('gl.inline_asm_elementwise("bar.arrive $1, 256;\\n mov.u32 $0, 0;", "=r,r", [gl.to_tensor(15 - part)], '
          'dtype=gl.int32, is_pure=False, pack=1)')
FIRST = ('gl.inline_asm_elementwise("{ .reg .pred p; setp.eq.s32 p, $1, 1; @p bar.arrive 14, 256; }\\n mov.u32 $0, 0;", '
         '"=r,r", [gl.to_tensor(part)], dtype=gl.int32, is_pure=False, pack=1)')


def pingpong(source: str, causal: bool) -> str:
    lines = source.splitlines()
    out, in_consumer, in_loop = [], False, False
    for line in lines:
        if line.startswith("def "):
            in_consumer = line.startswith("def main_consumer(")
        stripped = line.strip()
        indent = line[:len(line) - len(line.lstrip())]
        if in_consumer and stripped.startswith("for tile_iter in range("):
            out.append(indent + "_turn = " + FIRST)
        if in_consumer and stripped.startswith("for k_t in range("):
            in_loop, loop_indent = True, len(indent)
        elif in_loop and stripped and len(indent) <= loop_indent:
            in_loop = False
        is_qk = in_loop and "= warpgroup_mma(Q_shared" in stripped
        is_pv = in_loop and "= warpgroup_mma(acc_s_cast" in stripped
        if is_qk:
            out.append(indent + "_turn = " + SYNC)
        out.append(line)
        if (is_qk and causal) or (is_pv and not causal):
            out.append(indent + "_turn = " + ARRIVE)
    return "\n".join(out) + "\n"


def run_variant(variant: str) -> dict:
    import tritile.codegen.gluon.kernel_module as kernel_module
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from examples.flash_attention import tritile_attention

    causal_now = {}
    if variant == "pingpong":
        emit = kernel_module.emit_module

        def patched(func, target):
            gen = emit(func, target)
            gen.source = pingpong(gen.source, causal_now["causal"])
            return gen
        kernel_module.emit_module = patched
    out = {}
    torch.manual_seed(0)
    for (B, H, S, D, causal) in CASES:
        causal_now["causal"] = causal
        q, k, v = attention_inputs(B, H, S, D)
        ref = sdpa(q, k, v, is_causal=causal).float()
        got = tritile_attention(q, k, v, causal).float()
        err = float((got - ref).norm() / ref.norm())
        ms = do_bench(lambda: tritile_attention(q, k, v, causal), warmup=25, rep=200, return_mode="median")
        out[f"{B}x{H}x{S}x{D}{' causal' if causal else ''}"] = (round(attn_flops(B, H, S, D, causal) / ms / 1e9, 1), err)
    return out


def main():
    if serve_child("--variant", run_variant):
        return
    results = {}
    for round_ in range(int(os.environ.get("ROUNDS", "2"))):
        for variant in ("base", "pingpong"):
            result = run_in_child(__file__, "--variant", variant, timeout=240)
            if result is not None:
                results.setdefault(variant, []).append(result)
                print(f"round {round_} {variant}: {json.dumps(result)}", flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "pingpong_prototype.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
