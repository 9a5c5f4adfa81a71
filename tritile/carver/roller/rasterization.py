"""Rasterization plans for L2 locality (TileLang's `tilelang/carver/roller/rasterization.py`).

Mirrored: `Rasterization`, `NoRasterization`, `Rasterization2DRow(panel_width)`,
`Rasterization2DColumn(panel_width)` with `panel_width` and their reprs.  Simplified: no
`get_code()` CUDA snippets - a tritile program asks for rasterization with
`T.use_swizzle(panel_size=plan.panel_width, order=plan.order, enable=plan.enabled)`."""
from __future__ import annotations


class Rasterization:
    panel_width_ = None
    order = None  # T.use_swizzle's order ("row" / "column")

    @property
    def panel_width(self):
        assert self.panel_width_ is not None
        return self.panel_width_

    @property
    def enabled(self) -> bool:
        return self.panel_width_ is not None

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.panel_width_ == other.panel_width_

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.panel_width_))


class NoRasterization(Rasterization):
    """Blocks in launch order."""

    def __repr__(self) -> str:
        return "<NoRasterization>"


class Rasterization2DRow(Rasterization):
    """Blocks walk panels of `panel_width` rows."""

    order = "row"

    def __init__(self, panel_width=4) -> None:
        self.panel_width_ = panel_width

    def __repr__(self) -> str:
        return f"<Rasterization2DRow({self.panel_width_})>"


class Rasterization2DColumn(Rasterization):
    """Blocks walk panels of `panel_width` columns."""

    order = "column"

    def __init__(self, panel_width=4) -> None:
        self.panel_width_ = panel_width

    def __repr__(self) -> str:
        return f"<Rasterization2DColumn({self.panel_width_})>"


__all__ = ["Rasterization", "NoRasterization", "Rasterization2DRow", "Rasterization2DColumn"]
