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
  padded to powers of two as codegen allocates them, `ir/padding.py`).
* ``func.attrs["shared_bytes"]`` = the most bytes of those buffers live at once under
  `ir/shared_lifetimes.py`'s allocation plan (the one the Gluon backend follows: buffers
  allocated at their first use, gemm operands all on top; with warp specialization every
  buffer on top) + 8 bytes per mbarrier (one per slot of each software-pipelined loop; two
  with warp specialization: a "full" and an "empty" one).
* Above ``target.shared_memory_limit`` -> `CompileError` naming the buffers live at that point
  and their sizes.

It is an estimate, made before code generation: Triton's allocator may leave gaps between
buffers, and the generated code adds scratch and staging tiles of its own.  The backends check
the compiled kernel's exact allocation against the limit (`codegen/*/compiler.py`).  A kernel
that `persistent_tiles` later makes persistent keeps every buffer allocated at once; that pass
checks that their sum fits (`fits_allocated_at_once`).
"""
from __future__ import annotations

import dataclasses

from tritile.errors import CompileError
from tritile.ir import nodes as ir
from tritile.ir.padding import padded_buffer_shape
from tritile.ir.shared_lifetimes import lifetimes, peak
from tritile.ir.transform import walk

MBARRIER_BYTES = 8


def buffer_bytes(buf: ir.Buffer) -> int:
    size = buf.dtype.itemsize
    for dim in buf.shape:
        if not isinstance(dim, int):
            raise CompileError(f"shared buffer {buf.name} has a non-static shape {list(buf.shape)}", buf.loc)
    for dim in padded_buffer_shape(buf):
        size *= dim
    return size


def barrier_count(func: ir.PrimFunc, warp_specialized: bool = None) -> int:
    """The kernel's mbarriers: one per slot of each software-pipelined loop, two (a "full" and an
    "empty" one) when warp-specialized (by default: when `func.attrs` says so)."""
    barriers = sum(n.pipelined_from for n in walk(func.kernel.body) if isinstance(n, ir.For))
    if warp_specialized is None:
        warp_specialized = "warp_specialization" in func.attrs
    return 2 * barriers if warp_specialized else barriers


def allocated_at_once_bytes(func: ir.PrimFunc, warp_specialized: bool = None) -> int:
    """The bytes of all the kernel's shared buffers and mbarriers when none shares bytes (a
    persistent or warp-specialized kernel's allocation)."""
    spans = lifetimes(func.kernel.body, keep_on_top=True)
    return sum(buffer_bytes(s.buffer) for s in spans) + MBARRIER_BYTES * barrier_count(func, warp_specialized)


def fits_allocated_at_once(func: ir.PrimFunc, target) -> bool:
    """Do all the kernel's shared buffers and mbarriers fit the target when none shares bytes?"""
    return allocated_at_once_bytes(func) <= target.shared_memory_limit


def run(func: ir.PrimFunc, target) -> ir.PrimFunc:
    spans = lifetimes(func.kernel.body, keep_on_top="warp_specialization" in func.attrs)
    per_buffer = {}
    names = {}
    for span in spans:
        name = span.buffer.name
        while name in per_buffer:  # distinct buffers may share a name
            name += "'"
        per_buffer[name] = buffer_bytes(span.buffer)
        names[id(span.buffer)] = name
    barriers = barrier_count(func)
    live_bytes, live = peak(spans, buffer_bytes)
    total = live_bytes + MBARRIER_BYTES * barriers
    limit = target.shared_memory_limit
    if total > limit:
        sizes = sorted(((names[id(s.buffer)], per_buffer[names[id(s.buffer)]]) for s in live), key=lambda kv: -kv[1])
        listing = ", ".join(f"{name} {size} B" for name, size in sizes)
        if barriers:
            listing += f", {barriers} mbarriers {MBARRIER_BYTES * barriers} B"
        raise CompileError(f"kernel {func.name} needs {total} bytes of shared memory ({listing}, live at once), "
                           f"more than the {limit} bytes available on {target}; use smaller tiles or fewer "
                           f"num_stages", func.kernel.loc or func.loc)
    return dataclasses.replace(func, attrs={**func.attrs, "shared_bytes": total, "shared_buffers": per_buffer})
