"""`tilelang.tools`: `Analyzer` (a static FLOP / global-byte count and roofline time of a tile
program).  TileLang's `plot_layout`, `lower_trace`, pass timing / visualizer and CUDA tools are not
provided."""
from tritile.tools.analyzer import AnalysisResult, Analyzer  # noqa: F401
