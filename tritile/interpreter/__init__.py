"""The CPU reference interpreter of the tile IR: the semantic oracle every stage and every
backend is compared against.

`execute(func, args, dim_values)` runs any stage of the IR (frontend output or the output
of any lowering pass) on torch tensors and mutates the outputs in place; it raises
`tritile.HazardError` when an async schedule would race (see `hazards`).
"""
from tritile.interpreter.executor import execute  # noqa: F401
