"""`tilelang.tools`: `Analyzer` (a static FLOP / global-byte count and roofline time of a tile
program) and `plot_layout` (a layout drawn through matplotlib, tools/plot_layout.py).  TileLang's
`lower_trace`, pass timing / visualizer and CUDA tools are not provided."""
from tritile.tools.analyzer import AnalysisResult, Analyzer  # noqa: F401
from tritile.tools.plot_layout import plot_layout  # noqa: F401,E402
