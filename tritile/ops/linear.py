"""`act(x @ W^T + bias) + residual` as one T-language GEMM with a fused epilogue, and the torch
operator `torch.ops.tritile.linear`.

Contract:
* `matmul_epilogue` is tritile/ops/matmul.py's GEMM (its `accumulate_tiles` K loop) with an
  epilogue of `T.Parallel` loops over the float32 accumulator: `+ bias[j]`, the activation
  (ACTIVATIONS: "none", "relu", "silu", "gelu" (exact, erf by Abramowitz-Stegun 7.1.26,
  |error| < 1.5e-7), "gelu_tanh"), `+ residual[i, j]`, before the tile is stored once in the
  inputs' dtype.  With `keep_pre` it also stores the pre-activation tile (`x @ W^T + bias`),
  which the backward of the activation needs.  W is nn.Linear's (N, K) weight, read in place.
* `linear(x, weight, bias, residual, activation, keep_preactivation)` (registered as
  `torch.ops.tritile.linear`) takes x of shape [..., K], weight (N, K), bias (N,) or None,
  residual [..., N] or None; it returns (out, pre): `pre` is the pre-activation when
  `keep_preactivation`, else an empty tensor.  Its autograd formula is torch ops (the
  activation's derivative, `torch.mm` for dX and dW, a sum for dbias), so a compiled backward
  is inductor's, whose matmuls the tritile backend hands to tritile.mm like any other; a
  backward through an activation needs `keep_preactivation=True` (RuntimeError otherwise).
  Arguments are checked (TypeError / ValueError naming the argument) before anything runs; it
  has a fake implementation for tracing.
"""
from __future__ import annotations

from typing import Optional

import torch

import tritile
import tritile.language as T
from tritile.ops.matmul import SUPPORTED_DTYPES, accumulate_tiles, tile_config

ACTIVATIONS = ("none", "relu", "silu", "gelu", "gelu_tanh")
SQRT_2_OVER_PI, SQRT_HALF = 0.7978845608028654, 0.7071067811865476
# erf(z) ~= 1 - t * (a1 + t * (a2 + ...)) * exp(-z^2), t = 1 / (1 + p z), for z >= 0 (A&S 7.1.26)
ERF_P, ERF_A = 0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


@tritile.jit
def matmul_epilogue(A, B, Bias, Residual, Pre, block_M: int = 64, block_N: int = 64, block_K: int = 32,
                    num_stages: int = 2, threads: int = 128, dtype=T.float16, accum_dtype=T.float32,
                    panel_size: int = 10, has_bias: bool = False, activation: str = "none",
                    has_residual: bool = False, keep_pre: bool = False):
    """C = act(A @ B^T + Bias) + Residual (B: (N, K)); Pre = A @ B^T + Bias when `keep_pre`.
    An absent Bias / Residual / Pre is a placeholder of one element, never read."""
    M, N, K = T.const("M, N, K")
    A: T.Tensor((M, K), dtype)
    B: T.Tensor((N, K), dtype)
    Bias: T.Tensor((N,) if has_bias else (1,), dtype)
    Residual: T.Tensor((M, N) if has_residual else (1, 1), dtype)
    Pre: T.Tensor((M, N) if keep_pre else (1, 1), dtype)
    C = T.empty((M, N), dtype)

    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
        A_shared = T.alloc_shared((block_M, block_K), dtype)
        B_shared = T.alloc_shared((block_N, block_K), dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)

        T.use_swizzle(panel_size=panel_size)
        accumulate_tiles(A, B, A_shared, B_shared, C_local, bx, by, K, block_M, block_N, block_K, num_stages,
                         False, True)
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
    return C


def activation_fn(activation: str):
    """The activation as torch computes it (eager semantics of the fused epilogue)."""
    F = torch.nn.functional
    return {"none": lambda h: h, "relu": torch.relu, "silu": F.silu, "gelu": F.gelu,
            "gelu_tanh": lambda h: F.gelu(h, approximate="tanh")}[activation]


def check_linear_arguments(x, weight, bias, residual, activation) -> None:
    """Raise TypeError / ValueError naming the argument unless the fused kernel takes these."""
    tensors = (("x", x), ("weight", weight), ("bias", bias), ("residual", residual))
    for name, t in tensors:
        if t is None and name in ("bias", "residual"):
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tritile.linear: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in SUPPORTED_DTYPES or t.dtype != x.dtype:
            raise TypeError(f"tritile.linear: argument '{name}' has dtype {t.dtype}; all must be one of "
                            f"{', '.join(map(str, SUPPORTED_DTYPES))}")
        if t.device != x.device:
            raise TypeError(f"tritile.linear: argument '{name}' is on {t.device}, but 'x' is on {x.device}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"tritile.linear: argument 'activation' must be one of {ACTIVATIONS}, got {activation!r}")
    if x.dim() < 2 or weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"tritile.linear: argument 'weight' has shape {list(weight.shape)}, which does not take "
                         f"'x' of shape {list(x.shape)} (x [..., K], weight (N, K))")
    out_shape = (*x.shape[:-1], weight.shape[0])
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"tritile.linear: argument 'bias' has shape {list(bias.shape)}, not [{weight.shape[0]}]")
    if residual is not None and tuple(residual.shape) != out_shape:
        raise ValueError(f"tritile.linear: argument 'residual' has shape {list(residual.shape)}, not the "
                         f"output's {list(out_shape)}")


@torch.library.custom_op("tritile::linear", mutates_args=())
def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], residual: Optional[torch.Tensor],
           activation: str, keep_preactivation: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(act(x @ weight^T + bias) + residual, the pre-activation or an empty tensor) by one
    tritile GEMM with that epilogue."""
    check_linear_arguments(x, weight, bias, residual, activation)
    K, N = x.shape[-1], weight.shape[0]
    out_shape = (*x.shape[:-1], N)
    a = x.reshape(-1, K).contiguous()
    M = a.shape[0]
    if M == 0 or N == 0 or K == 0:  # no tiles: the epilogue of an empty sum, by torch
        pre = torch.zeros(out_shape, dtype=x.dtype, device=x.device) + (0 if bias is None else bias)
        out = activation_fn(activation)(pre) + (0 if residual is None else residual)
        return out, pre if keep_preactivation else x.new_empty(0)
    placeholder = x.new_empty((1, 1))
    pre = x.new_empty((M, N)) if keep_preactivation else placeholder
    out = matmul_epilogue(
        a, weight.contiguous(), x.new_empty(1) if bias is None else bias.contiguous(),
        placeholder if residual is None else residual.reshape(M, N).contiguous(), pre,
        dtype=SUPPORTED_DTYPES[x.dtype], has_bias=bias is not None, activation=activation,
        has_residual=residual is not None, keep_pre=keep_preactivation, **tile_config(x.device.type, M, N, K, x.dtype))
    return out.view(out_shape), pre.view(out_shape) if keep_preactivation else x.new_empty(0)


@linear.register_fake
def _linear_fake(x, weight, bias, residual, activation, keep_preactivation):
    check_linear_arguments(x, weight, bias, residual, activation)
    out_shape = (*x.shape[:-1], weight.shape[0])
    return x.new_empty(out_shape), x.new_empty(out_shape if keep_preactivation else (0,))


def _linear_setup_context(ctx, inputs, output) -> None:
    x, weight, bias, residual, activation, keep_preactivation = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.activation, ctx.kept = activation, keep_preactivation
    ctx.has_bias, ctx.has_residual = bias is not None, residual is not None


def _activation_backward(grad: torch.Tensor, pre: torch.Tensor, activation: str) -> torch.Tensor:
    aten = torch.ops.aten
    if activation == "relu":
        return grad * (pre > 0).to(grad.dtype)
    if activation == "silu":
        return aten.silu_backward(grad, pre)
    if activation in ("gelu", "gelu_tanh"):
        return aten.gelu_backward(grad, pre, approximate="tanh" if activation == "gelu_tanh" else "none")
    return grad


def _linear_backward(ctx, grad_out, grad_pre):
    x, weight, pre = ctx.saved_tensors
    if ctx.activation != "none" and not ctx.kept:
        raise RuntimeError("tritile.linear: a backward through the activation needs keep_preactivation=True")
    grad = _activation_backward(grad_out, pre, ctx.activation).reshape(-1, weight.shape[0])
    grad_x = torch.mm(grad, weight).view(x.shape) if ctx.needs_input_grad[0] else None
    grad_w = torch.mm(grad.t(), x.reshape(-1, x.shape[-1])) if ctx.needs_input_grad[1] else None
    grad_b = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
    grad_res = grad_out if ctx.has_residual and ctx.needs_input_grad[3] else None
    return grad_x, grad_w, grad_b, grad_res, None, None


linear.register_autograd(_linear_backward, setup_context=_linear_setup_context)
