"""`act(x @ W^T + bias) + residual` as one T-language GEMM with a fused epilogue, and the torch
operator `torch.ops.tritile.linear`.

Contract:
* `matmul_epilogue` is tritile/ops/matmul.py's GEMM (its `accumulate_tiles` K loop) followed by
  tritile/ops/epilogues.py's `apply_epilogue` on the float32 accumulator: `+ bias[j]`, the
  activation (`ACTIVATIONS`), `+ residual[i, j]`, before the tile is stored once in the inputs'
  dtype.  With `keep_pre` it also stores the pre-activation tile (`x @ W^T + bias`), which the
  backward of the activation needs.  W is nn.Linear's (N, K) weight, read in place.  Where
  tritile/ops/split_k.py plans a split of K (few output tiles, a long K: decoding's linears),
  the call runs its split-K kernel with the same epilogue instead.
* `linear` is the operator `torch.ops.tritile.linear(x, weight, bias, residual, activation,
  keep_preactivation)` (its `.default` overload; tritile/ops/registration.py); it takes x of shape
  [..., K], weight (N, K), bias (N,) or None, residual [..., N] or None; it returns (out, pre):
  `pre` is the pre-activation when `keep_preactivation`, else an empty tensor. Its autograd
  formula is torch ops (the activation's derivative, `torch.mm` for dX and dW, a sum for dbias),
  so a compiled backward is inductor's, whose matmuls the tritile backend hands to tritile.mm like
  any other; a backward through an activation needs `keep_preactivation=True` (RuntimeError
  otherwise). Arguments are checked (TypeError / ValueError naming the argument) before anything
  runs; it has a fake implementation for tracing. A repeated call of a signature (the tensors'
  types, dtypes, shapes, strides, devices, with `activation` and `keep_preactivation`:
  tritile/ops/signatures.py) runs the kernel chosen the first time.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional, Union

import torch

import tritile
import tritile.language as T
from tritile.ops import registration
from tritile.ops.epilogues import ACTIVATIONS, activation_fn, apply_epilogue
from tritile.ops.gemm_loop import accumulate_tiles, tile_config
from tritile.ops.matmul import SUPPORTED_DTYPES
from tritile.ops.signatures import MISSES, Remembered, signature
from tritile.ops.split_k import SplitKGemm, sm_count, split_k_config
from tritile.runtime.kernel import PreparedCall


@tritile.jit
def matmul_epilogue(A, B, Bias, Residual, Pre, block_M: int = 64, block_N: int = 64, block_K: int = 32,
                    num_stages: int = 2, threads: int = 128, dtype=T.float16, accum_dtype=T.float32,
                    panel_size: int = 10, has_bias: bool = False, activation: str = "none",
                    has_residual: bool = False, keep_pre: bool = False, swap_ab: bool = False):
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
                         False, True, swap_ab=swap_ab)
        apply_epilogue(C_local, C, Bias, Residual, Pre, bx, by, block_M, block_N, dtype, has_bias, activation,
                       has_residual, keep_pre)
    return C


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


@dataclass(frozen=True)
class _LinearCall:
    """What the first call of a signature worked out: the fused kernel (None: no tiles), the
    GEMM's rows, the output's shape, the unused operands' placeholders (one element on the
    call's device, never read or written: the kernel takes a tensor for every parameter)."""

    kernel: Optional[Union[PreparedCall, SplitKGemm]]  # prepared for the signature's operands
    rows: int
    out_shape: tuple
    keep_pre: bool
    bias_placeholder: torch.Tensor
    matrix_placeholder: torch.Tensor

    def operands(self, x, weight, bias, residual) -> list:
        """The kernel's (A, B, Bias, Residual, Pre) for a call: (M, K) / (M, N) matrices (views of
        contiguous tensors), Pre new when kept, placeholders for what is absent."""
        M, N = self.rows, self.out_shape[-1]
        flat = len(self.out_shape) == 2  # x is (M, K) already: no reshaping views
        return [x.contiguous() if flat else x.reshape(M, -1).contiguous(), weight.contiguous(),
                self.bias_placeholder if bias is None else bias.contiguous(),
                self.matrix_placeholder if residual is None else
                (residual.contiguous() if flat else residual.reshape(M, N).contiguous()),
                x.new_empty((M, N)) if self.keep_pre else self.matrix_placeholder]

    def run(self, x, weight, bias, residual, activation) -> tuple:
        if self.kernel is None:  # no tiles: the epilogue of an empty sum, by torch
            pre = torch.zeros(self.out_shape, dtype=x.dtype, device=x.device) + (0 if bias is None else bias)
            out = activation_fn(activation)(pre) + (0 if residual is None else residual)
            return out, pre if self.keep_pre else x.new_empty(0)
        operands = self.operands(x, weight, bias, residual)
        out, pre = self.kernel(*operands), operands[4]
        if len(self.out_shape) == 2:
            return out, pre if self.keep_pre else x.new_empty(0)
        return out.view(self.out_shape), pre.view(self.out_shape) if self.keep_pre else x.new_empty(0)


_linears = Remembered()  # (signature(x, weight, bias, residual), activation, keep_preactivation) -> _LinearCall


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], residual: Optional[torch.Tensor],
            activation: str, keep_preactivation: bool) -> tuple:
    """(act(x @ weight^T + bias) + residual, the pre-activation or an empty tensor) by one
    tritile GEMM with that epilogue; a repeated signature runs the kernel its first call chose."""
    try:
        call = _linears[signature(x, weight, bias, residual), activation, keep_preactivation]
    except MISSES:
        call = _first_linear(x, weight, bias, residual, activation, keep_preactivation)
    return call.run(x, weight, bias, residual, activation)


def _first_linear(x, weight, bias, residual, activation, keep_preactivation) -> _LinearCall:
    """The checks (TypeError / ValueError naming the argument) and the kernel of a call
    `_linear` has not seen, remembered."""
    check_linear_arguments(x, weight, bias, residual, activation)
    K, N = x.shape[-1], weight.shape[0]
    M = math.prod(x.shape[:-1])
    call = _LinearCall(None, M, (*x.shape[:-1], N), keep_preactivation, x.new_empty(1), x.new_empty((1, 1)))
    if M and N and K:
        operands = call.operands(x, weight, bias, residual)
        epilogue = dict(has_bias=bias is not None, activation=activation, has_residual=residual is not None,
                        keep_pre=keep_preactivation)
        dtype = SUPPORTED_DTYPES[x.dtype]
        split = split_k_config(x.device.type, M, N, K, x.dtype, sm_count(x.device))
        if split is not None:
            kernel = SplitKGemm.build(*operands[:2], split, dtype, trans_B=True, epilogue_operands=operands[2:],
                                      **epilogue)
        else:
            kernel = matmul_epilogue.kernel_for(*operands, dtype=dtype, **epilogue,
                                                **tile_config(x.device.type, M, N, K, x.dtype))
        # the kernel's own checks, once per signature
        call = dataclasses.replace(call, kernel=kernel.prepare(*operands))
    return _linears.remember((signature(x, weight, bias, residual), activation, keep_preactivation), call)


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


linear = registration.define(
    "linear(Tensor x, Tensor weight, Tensor? bias, Tensor? residual, str activation, bool keep_preactivation) "
    "-> (Tensor, Tensor)", _linear, _linear_fake, _linear_backward, _linear_setup_context)
