"""Thread-block rasterisation: which tile each program computes.

Input: the kernel's grid and block vars and its `T.use_swizzle(panel_size, order)` hint.
Output: lines binding every block var, in the emitter's language `em.lang` (``gl`` for Gluon,
``tl`` for triton.language).  Without a hint (or with a 1-D grid) block var ``d`` is
``program_id(d)``.  With a hint, the first two grid dimensions are re-ordered in
panels like TileLang's ``rasterization2DRow`` / ``rasterization2DColumn``: consecutive
programs walk down a panel of `panel_size` rows (columns) before moving to the next column
(row), serpentine from panel to panel, so the tiles in flight at one time share their A
row-panels and B column-panels in L2.  The mapping is a bijection of the launched grid for
any grid size (the last panel is narrower), so it only changes launch order, never values.
"""
from __future__ import annotations


def emit_block_ids(em, kernel):
    lang = em.lang
    names = [em.define(v) for v in kernel.block_vars]
    swizzle = kernel.swizzle
    if swizzle is None or len(names) < 2 or swizzle[1] not in ("row", "column"):
        for axis, name in enumerate(names):
            em.emit(f"{name} = {lang}.program_id({axis})")
        return
    panel, order = swizzle
    # "row": panels of `panel` rows (grid dim 1) walked column by column; "column": transposed
    major, minor = (0, 1) if order == "row" else (1, 0)
    em.emit(f"# T.use_swizzle({panel}, {order!r}): programs walk panels of {panel} {order}s")
    size_major, size_minor = em.tmp("grid"), em.tmp("grid")
    em.emit(f"{size_major} = {lang}.num_programs({major})")
    em.emit(f"{size_minor} = {lang}.num_programs({minor})")
    linear, offset, index, width, along = (em.tmp(h) for h in ("pid", "in_panel", "panel", "width", "along"))
    em.emit(f"{linear} = {lang}.program_id({major}) + {lang}.program_id({minor}) * {size_major}")
    em.emit(f"{offset} = {linear} % ({panel} * {size_major})")
    em.emit(f"{index} = {linear} // ({panel} * {size_major})")
    em.emit(f"{width} = {lang}.minimum({size_minor} - {index} * {panel}, {panel})")
    em.emit(f"{along} = {offset} // {width}")
    # serpentine: odd panels walk back, so the panel boundary tiles stay L2-hot
    em.emit(f"{names[major]} = {along} + ({index} % 2) * ({size_major} - 1 - 2 * {along})")
    em.emit(f"{names[minor]} = {offset} % {width} + {index} * {panel}")
    for axis, name in enumerate(names[2:], start=2):
        em.emit(f"{name} = {lang}.program_id({axis})")
