"""`tilelang.layout` under its TileLang name.

`Layout` and `Fragment` are `T.Layout` / `T.Fragment` (tritile/language/layout.py).  The
swizzle constructors (`make_swizzled_layout` and the full / half / quarter bank ones) ask for a
bank-conflict-free shared-memory layout: tritile's layout inference gives every shared buffer
one already (the swizzle its instructions - TMA, wgmma, ldmatrix - need), so they return
`SwizzledLayout`, which `T.annotate_layout` accepts and leaves to that choice.  TileLang's
other constructors (fragment layouts of its MMA lowering, CuTe) are not provided.
"""
from dataclasses import dataclass

from tritile.language.layout import Fragment, Layout  # noqa: F401


@dataclass(frozen=True)
class SwizzledLayout:
    """A request for a swizzled shared layout of `buffer`; tritile picks the swizzle."""

    buffer: object
    swizzle_bytes: int = 0  # 0: the widest that fits; else TileLang's full / half / quarter bank


def make_swizzled_layout(buffer, k_major: bool = True, allow_pad: bool = True) -> SwizzledLayout:
    return SwizzledLayout(buffer)


def make_full_bank_swizzled_layout(buffer) -> SwizzledLayout:
    return SwizzledLayout(buffer, 128)


def make_half_bank_swizzled_layout(buffer) -> SwizzledLayout:
    return SwizzledLayout(buffer, 64)


def make_quarter_bank_swizzled_layout(buffer) -> SwizzledLayout:
    return SwizzledLayout(buffer, 32)


def _not_provided(name: str):
    """A constructor of TileLang's MMA fragment layouts: importable (TileLang's test files import
    them at the top), NotImplementedError when called."""

    def constructor(*args, **kwargs):
        raise NotImplementedError(f"tilelang.layout.{name} (a fragment layout of TileLang's MMA lowering) is not "
                                  f"provided by tritile: its layout inference places fragments itself")

    constructor.__name__ = name
    return constructor


make_gemm_fragment_8x8 = _not_provided("make_gemm_fragment_8x8")
make_gemm_fragment_8x8_transposed = _not_provided("make_gemm_fragment_8x8_transposed")
