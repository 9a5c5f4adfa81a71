"""`tilelang.layout` under its TileLang name.

`Layout` and `Fragment` are `T.Layout` / `T.Fragment` (tritile/language/layout.py).  The
swizzle constructors (`make_swizzled_layout` and the full / half / quarter bank ones) ask for a
bank-conflict-free shared-memory layout: tritile's layout inference gives every shared buffer
one already (the swizzle its instructions - TMA, wgmma, ldmatrix - need), so they return
`SwizzledLayout`, which `T.annotate_layout` accepts and leaves to that choice.  The bank ones
called with integers, ``(rows, cols, element_size)`` (examples/plot_layout/layout_swizzle.py),
give TileLang's index map as a `T.Layout` (to plot, or to annotate a shared buffer of that shape
with: a placement hint, as every `T.Layout` there).  TileLang's
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


def _xor(a, b, n: int):
    """TileLang's xor2x2 / xor4x4 / xor8x8 (src/layout/gemm_layouts.cc): the xor of `a` and `b` in
    [0, n), in floor division, modulo and sums, so that it applies to ints, torch integer tensors
    and IR expressions alike."""
    if n == 2:
        return (a + b) % 2
    return 2 * _xor(a // 2, b // 2, n // 2) + _xor(a % 2, b % 2, 2)


def bank_swizzled_layout(stride: int, continuous: int, element_size: int, swizzle_bytes: int) -> Layout:
    """TileLang's MakeFull/Half/QuarterBankSwizzleLayout2D (src/layout/gemm_layouts.cc): the [stride,
    continuous] layout of `element_size`-bit elements whose 16-byte vectors of a row are permuted
    by an xor with the row (3, 2 or 1 bits for 128, 64 or 32 swizzle bytes); element (i, j) goes to
    ``(tc, ts, index)`` - tile of vector groups, 8-row tile, offset in that 8-row tile."""
    groups = swizzle_bytes // 16  # vectors of 16 bytes xor-permuted in a row: 8, 4 or 2
    vector_size = 128 // element_size
    if not (stride == 4 or stride % 8 == 0):
        raise ValueError(f"a bank-swizzled layout needs rows (stride) 4 or a multiple of 8, got {stride}")
    if continuous % (vector_size * groups):
        raise ValueError(f"a {swizzle_bytes}-byte bank-swizzled layout of {element_size}-bit elements needs columns "
                         f"(continuous) a multiple of {vector_size * groups}, got {continuous}")

    def forward(i, j):
        ts, s = i // 8, i % 8
        tc, c = (j // vector_size) // groups, (j // vector_size) % groups
        vec = j % vector_size
        c_swizzle = _xor(c, s // (8 // groups), groups)
        return [tc, ts, vec + (c_swizzle + s * groups) * vector_size]

    forward.__name__ = {128: "full_bank_swizzle", 64: "half_bank_swizzle", 32: "quarter_bank_swizzle"}[swizzle_bytes]
    return Layout((stride, continuous), forward)


def _bank_swizzled(swizzle_bytes: int, buffer, continuous, element_size):
    if continuous is None and element_size is None:
        return SwizzledLayout(buffer, swizzle_bytes)
    if continuous is None or element_size is None:
        raise TypeError("a bank-swizzled layout takes a buffer, or (rows, cols, element_size) integers")
    return bank_swizzled_layout(int(buffer), int(continuous), int(element_size), swizzle_bytes)


def make_full_bank_swizzled_layout(buffer, continuous=None, element_size=None):
    """128-byte swizzle: of a shared buffer a `SwizzledLayout` request; of integers (rows, cols,
    element_size in bits; examples/plot_layout/layout_swizzle.py) TileLang's index map, a `T.Layout`."""
    return _bank_swizzled(128, buffer, continuous, element_size)


def make_half_bank_swizzled_layout(buffer, continuous=None, element_size=None):
    """64-byte swizzle (see make_full_bank_swizzled_layout)."""
    return _bank_swizzled(64, buffer, continuous, element_size)


def make_quarter_bank_swizzled_layout(buffer, continuous=None, element_size=None):
    """32-byte swizzle (see make_full_bank_swizzled_layout)."""
    return _bank_swizzled(32, buffer, continuous, element_size)


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
