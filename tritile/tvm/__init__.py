"""The few names of TVM that TileLang's programs import (`from tilelang import tvm as tvm`, then
`from tvm import DataType` / `from tvm import tirx`; TileLang ships TVM and puts it on the path).

tritile has no TVM.  This module gives those programs what they use of it, on tritile's own
types: `DataType(dtype)` (a dtype with `.bits` / `.lanes`), and `tirx` (tirx.py) - typed
constants, `reinterpret`, `Select`, `Cast`, `Min`, `PrimExpr` - for the bit-twiddling helpers of
TileLang's examples/dequantize_gemm.  Where no real TVM is installed, `import tvm` loads this
module (tritile/tvm_import.py, installed by `import tritile`), as TileLang's import of its
bundled TVM does; an installed TVM is left alone.  Any other TVM name is an AttributeError naming what tritile lacks.
"""
from __future__ import annotations

from tritile.ir.dtypes import DType, as_dtype
from tritile.tvm import tirx


def DataType(dtype) -> DType:  # noqa: N802 - TVM's spelling
    """TVM's `DataType(dtype)`: tritile's dtype of that name (`.bits`, `.lanes`, `str()`)."""
    return as_dtype(dtype)


def __getattr__(name):
    raise AttributeError(f"tritile.tvm (TileLang's `tvm`) has no {name!r}: tritile has no TVM; of it, only "
                         f"DataType and tirx ({', '.join(tirx.__all__)}) are provided")

