"""The epilogue of tritile's GEMM operators: what happens to a float32 output tile between the
K loop and the store.

Contract: `apply_epilogue` (a `T.macro`) takes the (block_M, block_N) float32 fragment of output
tile (by, bx) and, each step only when its flag asks for it: adds `Bias[j]`; stores the tile to
`Pre` (the pre-activation, which an activation's backward needs); applies the activation
(ACTIVATIONS: "none", "relu", "silu", "gelu" (exact, erf by Abramowitz-Stegun 7.1.26,
|error| < 1.5e-7), "gelu_tanh"); adds `Residual[i, j]`; then stores the tile to `C` in `dtype`.
Used by tritile/ops/linear.py's fused GEMM (after its K loop) and tritile/ops/split_k.py's
split GEMM (after a tile's last program sums the partial products): a split GEMM keeps the
same epilogue.
`activation_fn` is the same activation as torch computes it (the eager reference).
"""
from __future__ import annotations

import torch

import tritile.language as T

ACTIVATIONS = ("none", "relu", "silu", "gelu", "gelu_tanh")
SQRT_2_OVER_PI, SQRT_HALF = 0.7978845608028654, 0.7071067811865476
# erf(z) ~= 1 - t * (a1 + t * (a2 + ...)) * exp(-z^2), t = 1 / (1 + p z), for z >= 0 (A&S 7.1.26)
ERF_P, ERF_A = 0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


@T.macro
def apply_epilogue(C_local, C, Bias, Residual, Pre, bx, by, block_M, block_N, dtype, has_bias, activation,
                   has_residual, keep_pre):
    """C[tile] = act(C_local + Bias) + Residual (Pre[tile] = C_local + Bias when `keep_pre`)."""
    if has_bias:
        bias = T.alloc_fragment((block_N,), dtype)
        T.copy(Bias[bx * block_N:(bx + 1) * block_N], bias)
        for i, j in T.Parallel(block_M, block_N):
            C_local[i, j] += bias[j]
    if keep_pre:
        T.copy(C_local, Pre[by * block_M, bx * block_N])
    if activation == "relu":
        for i, j in T.Parallel(block_M, block_N):
            C_local[i, j] = T.max(C_local[i, j], 0)
    elif activation == "silu":
        for i, j in T.Parallel(block_M, block_N):
            C_local[i, j] = C_local[i, j] * T.sigmoid(C_local[i, j])
    elif activation == "gelu_tanh":
        for i, j in T.Parallel(block_M, block_N):
            x = C_local[i, j]
            C_local[i, j] = 0.5 * x * (1 + T.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    elif activation == "gelu":  # 0.5 x (1 + erf(x / sqrt 2)) = 0.5 (x + |x| erf(|x| / sqrt 2))
        for i, j in T.Parallel(block_M, block_N):
            x = C_local[i, j]
            t = 1.0 / (1.0 + ERF_P * SQRT_HALF * T.abs(x))
            poly = t * (ERF_A[0] + t * (ERF_A[1] + t * (ERF_A[2] + t * (ERF_A[3] + t * ERF_A[4]))))
            C_local[i, j] = 0.5 * (x + T.abs(x) * (1.0 - poly * T.exp(-0.5 * x * x)))
    if has_residual:
        residual = T.alloc_fragment((block_M, block_N), dtype)
        T.copy(Residual[by * block_M, bx * block_N], residual)
        for i, j in T.Parallel(block_M, block_N):
            C_local[i, j] += residual[i, j]
    T.copy(C_local, C[by * block_M, bx * block_N])


def activation_fn(activation: str):
    """The activation as torch computes it (eager semantics of the fused epilogue)."""
    F = torch.nn.functional
    return {"none": lambda h: h, "relu": torch.relu, "silu": F.silu, "gelu": F.gelu,
            "gelu_tanh": lambda h: F.gelu(h, approximate="tanh")}[activation]
