"""`tritile.language.fp8`: TileLang's choice of FP8 dtype for the platform.

Contract: `determine_fp8_type("e4m3" | "e5m2")` returns the `T` dtype of that FP8 format
(`T.float8_e4m3fn` / `T.float8_e5m2`: the OCP formats NVIDIA GPUs and tritile's code generators
use; TileLang picks the FNUZ variants only on AMD GPUs before gfx950, which tritile's dtypes do
not model), and `determine_torch_fp8_type` its torch dtype.  Any other format is a ValueError.
"""
from __future__ import annotations

from typing import Literal

import torch

from tritile.ir.dtypes import DType, float8_e4m3, float8_e5m2

_FORMATS = {"e4m3": float8_e4m3, "e5m2": float8_e5m2}


def determine_fp8_type(fp8_format: Literal["e4m3", "e5m2"] = "e4m3") -> DType:
    if fp8_format not in _FORMATS:
        raise ValueError(f"Unsupported FP8 format: {fp8_format}")
    return _FORMATS[fp8_format]


def determine_torch_fp8_type(fp8_format: Literal["e4m3", "e5m2"] = "e4m3") -> torch.dtype:
    return determine_fp8_type(fp8_format).as_torch()
