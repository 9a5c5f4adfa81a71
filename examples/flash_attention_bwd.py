"""FlashAttention backward (layout [batch, heads, seq, dim]) in TileLang's lazy style.

The kernels live in the library module tritile/ops/attention.py (FlashAttention-2):
* `flashattn_fwd` - the forward of examples/flash_attention.py (the shared `attention_rows`
  loop) that also writes the log-sum-exp of each query row, `LSE = max * scale + log2(sum)` in
  base 2 (scores scaled by 1/sqrt(dim) * log2(e)), which is all the backward needs to rebuild P;
* `flashattn_bwd_preprocess` - `Delta[i] = sum_d O[i, d] * dO[i, d]`;
* `flashattn_bwd` - one program per block of `block_M` keys: K and V stay in shared memory, the
  loop walks the query blocks (from the diagonal when causal), rebuilds P^T = exp2(K Q^T * scale
  - LSE), and accumulates dV += P^T dO, dK += dS^T Q in registers; dQ += dS K is added to a
  float32 dQ with tile atomics.

`attention(q, k, v, is_causal)` is `torch.ops.tritile.attention` (the library's operator, whose
autograd formula runs these kernels): its forward saves (q, k, v, o, lse), its backward returns
dq, dk, dv.  Runs on CUDA when available, else on the CPU reference interpreter with small
sizes.  Run: ``python examples/flash_attention_bwd.py``.
"""
import torch

from tritile.ops.attention import (attention, flashattn_bwd, flashattn_bwd_preprocess,  # noqa: F401
                                   flashattn_fwd, tile_config)


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch, heads, seq, dim = (2, 4, 1024, 64) if device == "cuda" else (1, 2, 96, 32)
    for is_causal in (False, True):
        q, k, v = (torch.randn(batch, heads, seq, dim, dtype=torch.float16, device=device, requires_grad=True)
                   for _ in range(3))
        do = torch.randn(batch, heads, seq, dim, dtype=torch.float16, device=device)
        out = attention(q, k, v, is_causal)
        out.backward(do)
        ours = [out, q.grad, k.grad, v.grad]
        q2, k2, v2 = (t.detach().float().requires_grad_() for t in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(q2, k2, v2, is_causal=is_causal)
        ref.backward(do.float())
        for name, got, want in zip(("out", "dq", "dk", "dv"), ours, [ref, q2.grad, k2.grad, v2.grad]):
            error = (got.float() - want).abs().max().item()
            print(f"flash attention bwd b={batch} h={heads} s={seq} d={dim} causal={is_causal} on {device}: "
                  f"{name} max |tritile - torch| = {error:.3e}")
            torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
    print("All checks passed.")


if __name__ == "__main__":
    main()
