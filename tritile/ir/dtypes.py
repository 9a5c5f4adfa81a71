"""Scalar element types of the tile IR.

One `DType` object per type.  As in TileLang (whose dtypes are TVM `DataType`s that behave as
strings), a `DType` *is* a `str`: its string value is TileLang's spelling of the type, so
`str(T.float16) == "float16"`, `getattr(torch, T.float8_e4m3fn)` is `torch.float8_e4m3fn`, and a
dtype compares equal to, hashes like, and can stand in a dict for its string.  `name` is the
IR's own name of the type (what the code generators key their tables by); it equals the string
value except where TileLang's spelling differs (`float8_e4m3` is the string "float8_e4m3fn").
`T.float16`, the string "float16" and `torch.float16` all normalise to the same object via
`as_dtype`.  `dtype.max` / `dtype.min` are the largest / lowest finite values as typed
constants (TVM's `max_value` / `min_value`, which TileLang kernels use as `T.max_value(dtype)`).
"""
from __future__ import annotations

import torch


class DType(str):
    """An element type: `bits` per lane, `kind` ("float" | "int" | "uint" | "bool"), `lanes`
    (1 for a scalar; TileLang's vector types such as `float32x2` have more)."""

    def __new__(cls, name: str, bits: int, kind: str, spelling: str | None = None, lanes: int = 1):
        self = super().__new__(cls, spelling or name)
        self.name, self.bits, self.kind, self.lanes = name, bits, kind, lanes
        return self

    def __setattr__(self, key, value):
        if key in self.__dict__:
            raise AttributeError(f"DType is immutable ({key!r})")
        super().__setattr__(key, value)

    def __reduce__(self):  # copies and pickles are the one object of that name
        return as_dtype, (str(self),)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    @property
    def bytes(self) -> int:
        """TVM's spelling of `itemsize` (bytes of one element, all lanes)."""
        return max(1, self.bits * self.lanes // 8)

    @property
    def torch(self) -> torch.dtype:
        try:
            return _TO_TORCH[self.name]
        except KeyError:
            raise TypeError(f"dtype {self} has no torch equivalent") from None

    def as_torch(self) -> torch.dtype:
        """TileLang's spelling of `torch`: the torch dtype of this type."""
        return self.torch

    def __repr__(self) -> str:
        return self.name

    @property
    def max(self):
        """The largest finite value of the type, as a typed `Const` (`T.float16.max` = 65504)."""
        return self(_extremes(self)[1])

    @property
    def min(self):
        """The lowest finite value of the type, as a typed `Const` (`T.float16.min` = -65504)."""
        return self(_extremes(self)[0])

    def __call__(self, value):
        """`T.float32(0)` builds a typed constant (TileLang spelling)."""
        from tritile.ir.nodes import Const, Cast, Expr

        if isinstance(value, Expr):
            return Cast(value, self)
        return Const(value, self)


float16 = DType("float16", 16, "float")
bfloat16 = DType("bfloat16", 16, "float")
float32 = DType("float32", 32, "float")
float64 = DType("float64", 64, "float")
float8_e4m3 = DType("float8_e4m3", 8, "float", spelling="float8_e4m3fn")
float8_e5m2 = DType("float8_e5m2", 8, "float")
int8 = DType("int8", 8, "int")
int16 = DType("int16", 16, "int")
int32 = DType("int32", 32, "int")
int64 = DType("int64", 64, "int")
uint8 = DType("uint8", 8, "uint")
uint16 = DType("uint16", 16, "uint")
uint32 = DType("uint32", 32, "uint")
uint64 = DType("uint64", 64, "uint")
bool_ = DType("bool", 8, "bool")
float8_e8m0fnu = DType("float8_e8m0fnu", 8, "float")  # exponent-only scale type (MX formats)
tfloat32 = DType("tfloat32", 32, "float")  # float32 storage, TF32 tensor-core inputs

ALL = [float16, bfloat16, float32, float64, float8_e4m3, float8_e5m2, int8, int16, int32, int64,
       uint8, uint16, uint32, uint64, bool_, float8_e8m0fnu, tfloat32]

# TileLang's vector types (`T.float32x2`, ...): known by name; no tile operation takes them yet.
VECTORS = [DType(f"{d.name}x{n}", d.bits, d.kind, lanes=n)
           for d in (float16, bfloat16, float32, float64, int8, int16, int32, int64, uint8, uint16, uint32,
                     uint64, float8_e4m3, float8_e5m2)
           for n in (2, 4, 8, 16, 32, 64)]

# TileLang's sub-byte types (two values a byte): known by name (TileLang's programs name them in
# annotations and dtype tables); no buffer stores them yet
float4_e2m1fn = DType("float4_e2m1fn", 4, "float")
int4 = DType("int4", 4, "int")
uint4 = DType("uint4", 4, "uint")
SUB_BYTE = (float4_e2m1fn, int4, uint4)

_BY_NAME = {d.name: d for d in ALL + VECTORS + list(SUB_BYTE)}
_BY_NAME.update({str(d): d for d in ALL})
# TileLang / TVM spellings
_BY_NAME.update({
    "float": float32, "half": float16, "double": float64, "fp16": float16, "bf16": bfloat16,
    "fp32": float32, "fp64": float64, "int": int32, "uint": uint32, "short": int16, "long": int64,
    "ulong": uint64, "float8_e4m3fn": float8_e4m3,
    "float8_e5m2fn": float8_e5m2, "e4m3_float8": float8_e4m3, "e5m2_float8": float8_e5m2,
})

_TO_TORCH = {
    "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
    "float64": torch.float64, "float8_e4m3": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
    "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64,
    "uint8": torch.uint8, "uint16": torch.uint16, "uint32": torch.uint32, "uint64": torch.uint64,
    "bool": torch.bool, "float8_e8m0fnu": torch.float8_e8m0fnu, "tfloat32": torch.float32,
}
_FROM_TORCH = {v: _BY_NAME[k] for k, v in _TO_TORCH.items() if k != "tfloat32"}


_FROM_PYTHON = {float: float32, int: int32, bool: bool_}  # TileLang accepts Python types


def _extremes(dtype: DType) -> tuple:
    """(lowest, largest) finite values of `dtype`, from torch's finfo / iinfo."""
    if dtype.kind == "bool":
        return False, True
    info = torch.finfo(dtype.torch) if dtype.is_float else torch.iinfo(dtype.torch)
    return info.min, info.max


def as_dtype(value) -> DType:
    """Normalise a DType, a dtype name or a torch.dtype; raise TypeError otherwise."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str) and value in _BY_NAME:
        return _BY_NAME[value]
    if isinstance(value, type) and value in _FROM_PYTHON:
        return _FROM_PYTHON[value]
    if isinstance(value, torch.dtype) and value in _FROM_TORCH:
        return _FROM_TORCH[value]
    raise TypeError(f"unknown dtype {value!r}")


def element_dtype(value) -> DType:
    """The dtype a buffer of `value` elements stores: `as_dtype(value)`, with `tfloat32` stored
    as `float32` (TF32 is an MMA input precision, not a storage type: the frontend marks a gemm
    over tfloat32 operands `Gemm(tf32=True)`).  TypeError for a vector dtype (`float32x2`): no tile operation takes
    one yet."""
    dtype = as_dtype(value)
    if dtype.lanes != 1:
        raise TypeError(f"vector dtype {dtype} is not supported as a buffer element type yet")
    if dtype in SUB_BYTE:
        raise TypeError(f"{dtype} (two values a byte) is not supported as a buffer element type yet")
    return float32 if dtype is tfloat32 else dtype


def is_tfloat32(value) -> bool:
    """Whether `value` names TileLang's `tfloat32` (which `element_dtype` stores as float32)."""
    try:
        return as_dtype(value) is tfloat32
    except TypeError:
        return False


def truncate_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 `x` with the 13 low mantissa bits cleared: the value a TF32 tensor core reads."""
    return (x.view(torch.int32) & -(1 << 13)).view(torch.float32)


def from_torch(dtype: torch.dtype) -> DType:
    return as_dtype(dtype)
