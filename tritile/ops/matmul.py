"""`C = A @ B` for 2-D fp16 / bf16 / fp32 matrices (and batches of them), as T-language kernels
and torch operators.

Contract:
* `matmul` is an eager `@tritile.jit` GEMM (fp32 accumulation, result in the inputs' dtype);
  ragged shapes are fine (tile copies clip at the matrix edges).
* `tile_config(device_type, M, N, K, dtype)` (tritile/ops/gemm_loop.py) picks its tile sizes:
  small tiles on the CPU (the reference interpreter), shape-dependent ones on CUDA.
* `mm` is the operator `torch.ops.tritile.mm(a, b)` (its `.default` overload; defined through
  tritile/ops/registration.py): it checks its arguments (TypeError for type / dtype / device,
  ValueError for rank / shape, before anything runs), runs the kernel and returns a new
  contiguous (M, N) tensor.  An operand that is the transpose of a contiguous matrix (`w.t()`,
  as every backward has) is read in place through the kernel's `trans_A` / `trans_B` flags;
  other layouts are copied contiguous first.  It has a fake implementation (for Dynamo /
  AOTAutograd tracing) and a backward made of `tritile.mm` calls.  A repeated call of a
  signature (tritile/ops/signatures.py: the operands' types, dtypes, shapes, strides, devices)
  runs the kernel chosen the first time.  Where tritile/ops/split_k.py's plan splits K (few
  output tiles, a long K), the call runs its split-K kernel instead.
* `batched_matmul` is the same GEMM over a batch ([batch, M, K] @ [batch, K, N], the batch on
  the grid's third axis); `bmm` (`torch.ops.tritile.bmm(a, b)`) is its operator, with the same
  checks, in-place transposed operands (`x.transpose(1, 2)` of a contiguous batch), fake
  implementation and a backward of `tritile.bmm` calls.
"""
from __future__ import annotations

import torch

import tritile
import tritile.language as T
from tritile.ops import registration
from tritile.ops.gemm_loop import accumulate_tiles, tile_config
from tritile.ops.split_k import SplitKGemm, sm_count, split_k_config
from tritile.ops.signatures import MISSES, Remembered, signature

SUPPORTED_DTYPES = {torch.float16: T.float16, torch.bfloat16: T.bfloat16, torch.float32: T.float32}


@tritile.jit
def matmul(A, B, block_M: int = 64, block_N: int = 64, block_K: int = 32, num_stages: int = 2,
           threads: int = 128, dtype=T.float16, accum_dtype=T.float32, panel_size: int = 10,
           trans_A: bool = False, trans_B: bool = False, swap_ab: bool = False):
    M, N, K = T.const("M, N, K")
    A: T.Tensor((K, M) if trans_A else (M, K), dtype)  # trans_A: A holds the (K, M) matrix A^T
    B: T.Tensor((N, K) if trans_B else (K, N), dtype)
    C = T.empty((M, N), dtype)

    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
        A_shared = T.alloc_shared((block_K, block_M) if trans_A else (block_M, block_K), dtype)
        B_shared = T.alloc_shared((block_N, block_K) if trans_B else (block_K, block_N), dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)

        T.use_swizzle(panel_size=panel_size)  # launch order in panels, for L2 reuse of A and B tiles
        accumulate_tiles(A, B, A_shared, B_shared, C_local, bx, by, K, block_M, block_N, block_K, num_stages,
                         trans_A, trans_B, swap_ab=swap_ab)
        T.copy(C_local, C[by * block_M, bx * block_N])
    return C


@tritile.jit
def batched_matmul(A, B, block_M: int = 64, block_N: int = 64, block_K: int = 32, num_stages: int = 2,
                   threads: int = 128, dtype=T.float16, accum_dtype=T.float32, trans_A: bool = False,
                   trans_B: bool = False, swap_ab: bool = False):
    """C[b] = A[b] @ B[b]: `matmul` with the batch as the grid's third axis."""
    BATCH, M, N, K = T.const("BATCH, M, N, K")
    A: T.Tensor((BATCH, K, M) if trans_A else (BATCH, M, K), dtype)  # trans_A: A[b] holds A[b]^T
    B: T.Tensor((BATCH, N, K) if trans_B else (BATCH, K, N), dtype)
    C = T.empty((BATCH, M, N), dtype)

    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), BATCH, threads=threads) as (bx, by, bz):
        A_shared = T.alloc_shared((block_K, block_M) if trans_A else (block_M, block_K), dtype)
        B_shared = T.alloc_shared((block_N, block_K) if trans_B else (block_K, block_N), dtype)
        C_local = T.alloc_fragment((block_M, block_N), accum_dtype)

        accumulate_tiles(A, B, A_shared, B_shared, C_local, bx, by, K, block_M, block_N, block_K, num_stages,
                         trans_A, trans_B, True, bz, swap_ab=swap_ab)
        T.copy(C_local, C[bz, by * block_M, bx * block_N])
    return C


def is_transposed_contiguous(t: torch.Tensor) -> bool:
    """Is the matrix `t` (or each matrix of the batch `t`, [batch, rows, cols]) the transpose of
    a contiguous one (the backward's `w.t()`, `x.transpose(1, 2)`)?"""
    *batch, rows, cols = t.shape
    strides = (rows * cols, 1, rows) if batch else (1, rows)
    return not t.is_contiguous() and tuple(t.stride()) == strides and cols > 1


def _as_operand(t: torch.Tensor) -> tuple:
    """(tensor to pass, transposed): a transposed view of a contiguous matrix is passed as that
    contiguous matrix with the kernel's transpose flag, never copied; any other layout is made
    contiguous."""
    if is_transposed_contiguous(t):
        return t.transpose(-1, -2), True
    return t.contiguous(), False


def check_mm_arguments(a, b, rank: int = 2) -> None:
    """Raise TypeError / ValueError naming the argument unless `a @ b` is a supported GEMM
    (`rank` 2: tritile.mm; 3: tritile.bmm, a batch of GEMMs)."""
    op = "tritile.mm" if rank == 2 else "tritile.bmm"
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{op}: argument '{name}' has dtype {t.dtype}; supported: "
                            f"{', '.join(map(str, SUPPORTED_DTYPES))}")
        if t.dim() != rank:
            raise ValueError(f"{op}: argument '{name}' must be {rank}-D, got shape {list(t.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: argument 'b' has dtype {b.dtype}, but 'a' has {a.dtype}")
    if a.device != b.device:
        raise TypeError(f"{op}: argument 'b' is on {b.device}, but 'a' is on {a.device}")
    if a.shape[-1] != b.shape[-2] or a.shape[:-2] != b.shape[:-2]:
        raise ValueError(f"{op}: argument 'b' has shape {list(b.shape)}, which cannot multiply "
                         f"'a' of shape {list(a.shape)}")


# (kernel function, signature(a, b)) -> (the kernel prepared for the signature's operands, or None:
# no tiles; trans_a, trans_b)
_gemms = Remembered()


def _gemm(kernel_fn, a, b) -> torch.Tensor:
    """`kernel_fn` (`matmul` / `batched_matmul`) on `a` and `b`, transposed views read in place.
    What the first call of each signature works out (the checks, the layouts, the tile choice,
    the eager JIT's specialisation and the kernel's own argument checks, which cost more host time
    than a small GEMM's launch) is remembered: a repeated call (every step of a model) only
    allocates the output and runs the kernel."""
    try:
        kernel, trans_a, trans_b = _gemms[kernel_fn, signature(a, b)]
    except MISSES:
        kernel, trans_a, trans_b = _first_gemm(kernel_fn, a, b)
    if kernel is None:  # no tiles to launch; an empty sum is zero
        return a.new_zeros((*a.shape[:-1], b.shape[-1]))
    return kernel(a.mT if trans_a else a.contiguous(), b.mT if trans_b else b.contiguous())


def _first_gemm(kernel_fn, a, b) -> tuple:
    """The checks (TypeError / ValueError naming the argument) and the kernel of a call `_gemm`
    has not seen, remembered."""
    check_mm_arguments(a, b, rank=2 if kernel_fn is matmul else 3)
    kernel = trans_a = trans_b = None
    if a.numel() and b.numel():
        (a_operand, trans_a), (b_operand, trans_b) = _as_operand(a), _as_operand(b)
        M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
        dtype = SUPPORTED_DTYPES[a.dtype]
        split = split_k_config(a.device.type, M, N, K, a.dtype, sm_count(a.device)) if kernel_fn is matmul else None
        if split is not None:
            kernel = SplitKGemm.build(a_operand, b_operand, split, dtype, trans_A=trans_a, trans_B=trans_b)
        else:
            kernel = kernel_fn.kernel_for(a_operand, b_operand, dtype=dtype, trans_A=trans_a, trans_B=trans_b,
                                          **tile_config(a.device.type, M, N, K, a.dtype))
        kernel = kernel.prepare(a_operand, b_operand)  # the kernel's own checks, once per signature
    return _gemms.remember((kernel_fn, signature(a, b)), (kernel, trans_a, trans_b))


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a @ b` by the tritile GEMM kernel."""
    return _gemm(matmul, a, b)


def _mm_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    check_mm_arguments(a, b)
    return a.new_empty((a.shape[0], b.shape[1]))


def _mm_setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _mm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    grad_a = mm(grad, b.t()) if ctx.needs_input_grad[0] else None
    grad_b = mm(a.t(), grad) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b


mm = registration.define("mm(Tensor a, Tensor b) -> Tensor", _mm, _mm_fake, _mm_backward, _mm_setup_context)


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`torch.bmm(a, b)` by the tritile batched GEMM kernel (one grid axis over the batch)."""
    return _gemm(batched_matmul, a, b)


def _bmm_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    check_mm_arguments(a, b, rank=3)
    return a.new_empty((a.shape[0], a.shape[1], b.shape[2]))


def _bmm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    grad_a = bmm(grad, b.transpose(1, 2)) if ctx.needs_input_grad[0] else None
    grad_b = bmm(a.transpose(1, 2), grad) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b


bmm = registration.define("bmm(Tensor a, Tensor b) -> Tensor", _bmm, _bmm_fake, _bmm_backward, _mm_setup_context)
