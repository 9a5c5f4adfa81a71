"""Value representation of the reference interpreter.

Contract
--------
* A value is either a Python scalar (`int`, `float`, `bool`) — scalar code outside
  `T.Parallel` — or a torch tensor holding one value per parallel lane.
* Arithmetic happens in a *compute dtype*: float32 for every float type narrower than 64
  bits, float64 for float64, int64 for every integer type, bool for bool.  Values are
  rounded to a buffer's element type only when stored (or by an explicit `Cast`).
* Buffers are stored in their own torch dtype, except that unsigned types wider than 8 bits
  (which torch cannot index-assign) are stored as a signed view of the same bits;
  `from_storage` undoes that on the way out.
"""
from __future__ import annotations

import math
import struct

import torch

from tritile.ir.dtypes import DType

_FLOAT32 = struct.Struct("f")

_SIGNED_VIEW = {16: torch.int16, 32: torch.int32, 64: torch.int64}


def compute_dtype(dtype: DType) -> torch.dtype:
    if dtype.is_float:
        return torch.float64 if dtype.bits == 64 else torch.float32
    if dtype.kind == "bool":
        return torch.bool
    return torch.int64


def storage_view(tensor: torch.Tensor, dtype: DType) -> torch.Tensor:
    """The tensor the interpreter indexes for a buffer of `dtype` (shares memory)."""
    if dtype.kind == "uint" and dtype.bits > 8:
        return tensor.view(_SIGNED_VIEW[dtype.bits])
    return tensor


def reinterpret(tensor: torch.Tensor, dtype: DType, shape) -> torch.Tensor:
    """The bytes of contiguous `tensor` as a tensor of `dtype` (its torch dtype) and `shape`,
    sharing its storage (a view: `T.reshape` / `T.view`)."""
    flat = tensor.reshape(-1)
    if flat.dtype != dtype.torch:
        flat = flat.view(dtype.torch)
    return flat.view(tuple(shape))


def from_storage(values: torch.Tensor, dtype: DType) -> torch.Tensor:
    """Elements read from a storage view, in the compute dtype of `dtype`."""
    out = values.to(compute_dtype(dtype))
    if dtype.kind == "uint" and 8 < dtype.bits < 64:
        out = out & ((1 << dtype.bits) - 1)
    return out


def allocate(shape: tuple, dtype: DType) -> torch.Tensor:
    """A fresh on-chip buffer full of garbage-like values (NaN for floats), so that a read
    of an element nobody wrote shows up in the result instead of passing silently."""
    torch_dtype = dtype.torch
    if dtype.is_float:
        return torch.full(shape, float("nan"), dtype=torch_dtype)
    if dtype.kind == "bool":
        return torch.ones(shape, dtype=torch.bool)
    return storage_view(torch.full(shape, torch.iinfo(torch_dtype).max, dtype=torch_dtype), dtype)


def wrap_int(value: int, bits: int, signed: bool) -> int:
    """Two's-complement wrap-around of a Python int into a `bits`-wide integer's range."""
    modulus = 1 << bits
    value %= modulus
    if signed and value >= modulus >> 1:
        value -= modulus
    return value


def fp8_max(dtype: DType) -> float:
    """The largest finite value of float8 `dtype` (448 for e4m3, 57344 for e5m2)."""
    return torch.finfo(dtype.torch).max


def saturate_fp8(value: torch.Tensor, dtype: DType) -> torch.Tensor:
    """Float lanes about to be converted to float8 `dtype`, clamped to its finite range:
    conversions to fp8 saturate (docs/semantics.md; the GPU's cvt.rn.satfinite, cutlass's
    float_e4m3_t) where torch gives NaN (e4m3) or inf (e5m2).  Clamping before the round to
    nearest even gives the same result as rounding then saturating; NaN stays NaN.  Integer
    lanes go through float32 first, as the GPU converts them."""
    if not value.is_floating_point():
        value = value.to(torch.float32)
    top = fp8_max(dtype)
    return value.clamp(-top, top)


def round_scalar(value, dtype: DType):
    """`value` converted to `dtype` and back to a Python scalar (C conversion rules:
    float -> int truncates toward zero; -> fp8 saturates)."""
    if dtype.kind == "bool":
        return bool(value)
    if dtype.is_int:
        if isinstance(value, float):  # saturating, NaN -> 0, as the GPU's cvt.rzi
            if value != value:
                return 0
            info = torch.iinfo(dtype.torch)
            value = min(max(value, info.min), info.max)
        return wrap_int(int(value), dtype.bits, dtype.kind == "int")
    if dtype.bits == 64:
        return float(value)
    if dtype.bits == 8:
        top = fp8_max(dtype)
        value = min(max(float(value), -top), top) if value == value else value
    return torch.tensor(float(value), dtype=dtype.torch).item()


def storage_scalar(value, dtype: DType):
    """A Python scalar ready to be assigned into a storage view of `dtype`."""
    if dtype.kind == "uint" and dtype.bits > 8:  # stored as the signed type of the same width
        return wrap_int(int(value), dtype.bits, signed=True)
    return value if dtype.is_float else round_scalar(value, dtype)


def to_float32(value: float) -> float:
    """A Python float rounded to float32.  Rounding each +,-,*,/ of float32 operands computed
    in double gives exactly the float32 result, so scalar code matches tensor code."""
    try:
        return _FLOAT32.unpack(_FLOAT32.pack(value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def _float_to_int(value: torch.Tensor, dtype: DType) -> torch.Tensor:
    """Float lanes converted to integer `dtype` toward zero, saturating, NaN -> 0, as int64
    (uint64 saturates at the int64 range, its storage)."""
    info = torch.iinfo(dtype.torch if dtype.bits < 64 else torch.int64)
    lo, hi = float(info.min), float(info.max)  # hi rounds up to 2**63 for 64-bit types
    value = torch.nan_to_num(value.double(), nan=0.0)
    out = value.clamp(lo, min(hi, 2.0 ** 63 - 1024)).trunc().to(torch.int64)
    return torch.where(value >= hi, torch.tensor(info.max), out)


def round_tensor(value: torch.Tensor, dtype: DType) -> torch.Tensor:
    """`value` rounded to `dtype`, returned in `dtype`'s compute dtype (float -> int: toward
    zero, saturating, NaN -> 0, as the GPU's cvt.rzi and `round_scalar`; torch differs).
    fp8 values are not saturated here: a stored or copied e5m2 inf stays inf; `convert_tensor`
    is the conversion."""
    if dtype.is_int and value.is_floating_point():
        value = _float_to_int(value, dtype)
    if dtype.kind == "uint" and dtype.bits > 8:
        as_int = value.to(torch.int64)
        return as_int & ((1 << dtype.bits) - 1) if dtype.bits < 64 else as_int
    return value.to(dtype.torch).to(compute_dtype(dtype))


def convert_tensor(value: torch.Tensor, dtype: DType) -> torch.Tensor:
    """`value` converted to `dtype` from another type (a `Cast`, a T.copy between types): as
    `round_tensor`, and saturating when `dtype` is fp8."""
    if dtype.is_float and dtype.bits == 8:
        value = saturate_fp8(value, dtype)
    return round_tensor(value, dtype)


def reinterpret_bits(value, src: DType, dst: DType):
    """`value` of `src` (in its compute dtype; a tensor or a Python scalar) with its bits read as
    `dst`, a type of the same width (`T.reinterpret`)."""
    tensor = as_tensor(value).to(compute_dtype(src))
    if src.kind == "uint" and 8 < src.bits < 64:  # kept as int64 in [0, 2**bits): stored signed
        tensor = torch.where(tensor >= 1 << (src.bits - 1), tensor - (1 << src.bits), tensor)
    stored = tensor.to(_SIGNED_VIEW[src.bits] if src.kind == "uint" and src.bits > 8 else src.torch)
    out = from_storage(stored.view(_SIGNED_VIEW[dst.bits] if dst.kind == "uint" and dst.bits > 8 else dst.torch), dst)
    return out if is_tensor(value) else out.item()


def as_tensor(value, dtype: torch.dtype = None) -> torch.Tensor:
    """A tensor for a value that may be a Python scalar (0-d tensor then)."""
    if isinstance(value, torch.Tensor):
        return value if dtype is None else value.to(dtype)
    return torch.tensor(value, dtype=dtype)


def is_tensor(value) -> bool:
    return isinstance(value, torch.Tensor)
