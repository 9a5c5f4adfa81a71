"""shared_memory_budget: account for the shared memory a kernel needs and reject kernels that
do not fit the target.

Assumes
-------
`pipeline_injection` ran: shared buffers have their final (versioned) shapes, all static, and
each software-pipelined loop is a serial loop with ``pipelined_from = S``.

Guarantees
----------
* ``func.attrs["shared_buffers"] = {name: bytes}`` for every allocated shared buffer
  (allocation shape x itemsize, so a versioned buffer counts all its versions; tile dims
  padded to powers of two as codegen allocates them, `ir/padding.py`), and
  ``func.attrs["shared_bytes"]`` = their sum + 8 bytes per mbarrier (one per slot of each
  software-pipelined loop; two with warp specialization: a "full" and an "empty" one).
* Above ``target.shared_memory_limit`` -> `CompileError` naming the buffers and their sizes.
  Buffers are not aliased: the count is an upper bound of what codegen allocates.
"""
from __future__ import annotations

import dataclasses

from tritile.errors import CompileError
from tritile.ir import nodes as ir
from tritile.ir.padding import padded_buffer_shape
from tritile.ir.transform import walk

MBARRIER_BYTES = 8


def _buffer_bytes(buf: ir.Buffer) -> int:
    size = buf.dtype.itemsize
    for dim in buf.shape:
        if not isinstance(dim, int):
            raise CompileError(f"shared buffer {buf.name} has a non-static shape {list(buf.shape)}", buf.loc)
    for dim in padded_buffer_shape(buf):
        size *= dim
    return size


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    per_buffer = {}
    for node in walk(func.kernel.body):
        if isinstance(node, ir.Alloc) and node.buffer.scope == "shared":
            name = node.buffer.name
            while name in per_buffer:  # distinct buffers may share a name
                name += "'"
            per_buffer[name] = _buffer_bytes(node.buffer)
    barriers = sum(n.pipelined_from for n in walk(func.kernel.body) if isinstance(n, ir.For))
    if "warp_specialization" in func.attrs:
        barriers *= 2
    total = sum(per_buffer.values()) + MBARRIER_BYTES * barriers
    limit = target.shared_memory_limit
    if total > limit:
        listing = ", ".join(f"{name} {size} B" for name, size in sorted(per_buffer.items(), key=lambda kv: -kv[1]))
        if barriers:
            listing += f", {barriers} mbarriers {MBARRIER_BYTES * barriers} B"
        raise CompileError(f"kernel {func.name} needs {total} bytes of shared memory ({listing}), more than "
                           f"the {limit} bytes available on {target}; use smaller tiles or fewer "
                           f"num_stages", func.kernel.loc or func.loc)
    return dataclasses.replace(func, attrs={**func.attrs, "shared_bytes": total, "shared_buffers": per_buffer})
