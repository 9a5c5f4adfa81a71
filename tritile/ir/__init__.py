"""Tile IR: typed dataclasses (`nodes`), dtypes, printer, traversal and verifier."""
from tritile.ir import dtypes, nodes  # noqa: F401
from tritile.ir.printer import format_func, format_node  # noqa: F401
