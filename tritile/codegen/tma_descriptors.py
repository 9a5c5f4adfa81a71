"""The TMA descriptor arguments of a generated kernel and its host launcher, alike in both backends.

A kernel that moves global tiles through TMA takes one descriptor argument per (global tensor,
block shape, and for Gluon shared layout) after its pointers (and constant tables), before its
runtime scalars.  The backend records each as a `DescriptorArg`; the generated module declares
them as ``TMA_DESCRIPTORS = ((block shape, shared layout), ...)`` (`descriptor_table_text`;
the layout is None in a triton.language module, whose descriptors take the layout Triton
chooses) and its host function ``tritile_launch(launch, <tensors...>, <dims...>)``
(`launcher_text`) calls ``launch(grid, tensors, tma_operands, dims)`` with one ``(tensor, shape,
strides)`` per descriptor: `tritile.runtime.launcher` builds the host descriptors from those,
encoding each once per address and geometry.

The strides passed are what the kernel assumes of a global tensor: the row-major strides of
its shape (a `T.Tensor`: contiguous, checked at launch), or a `T.StridedTensor`'s declared
ones (`DescriptorArg.strides`, host expressions of the runtime dims; the tensor's, checked at
launch) - not the tensor's own `stride()`, which may hold any value along a dim of size 1,
where a descriptor would reject it as unaligned.  A parameter whose shape is all constants
(the argument checks hold the tensor to it) has its shape and row-major strides written as
literals, so a launch reads nothing of the tensor but its address.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class DescriptorArg:
    """A TMA descriptor kernel argument: global param `param_index`, one block shape."""

    name: str
    param_index: int
    block_shape: tuple
    dtype: object  # the tensor's IR dtype
    layout: object = None  # Gluon: its NVMMASharedLayout; triton.language: None (Triton chooses)
    rows_view: bool = False  # over the tensor's [prod(shape[:-1]), shape[-1]] view (Gluon)
    strides: tuple = None  # a T.StridedTensor's declared strides as host expressions; None: row-major


def _row_major_strides(tensor: str, rank: int) -> str:
    strides = [" * ".join(f"{tensor}.shape[{j}]" for j in range(d + 1, rank)) or "1" for d in range(rank)]
    return f"({', '.join(strides)}{',' if rank == 1 else ''})"


def _static_row_major_strides(shape: list) -> list:
    return [math.prod(shape[d + 1:]) for d in range(len(shape))]


def host_operand_text(d: DescriptorArg, tensor: str, shape: list) -> str:
    """The host ``(tensor, shape, strides)`` of descriptor `d` over `tensor`, of the parameter's
    `shape` (ints, or IR sizes known at run time).  A shape of ints is written as literals: the
    call's checks fixed the tensor's to it, and a warm launch then reads no `tensor.shape`."""
    rank = len(shape)
    if all(isinstance(size, int) for size in shape):
        if d.rows_view:
            rows = (math.prod(shape[:-1]), shape[-1])
            pitch = str(shape[-1]) if d.strides is None or rank == 1 else d.strides[-2]
            return f"({tensor}, {rows}, ({pitch}, 1))"
        strides = (str(tuple(_static_row_major_strides(shape))) if d.strides is None
                   else f"({''.join(s + ', ' for s in d.strides)})")
        return f"({tensor}, {tuple(shape)}, {strides})"
    if d.rows_view:  # the [prod(shape[:-1]), shape[-1]] view; a strided one's row pitch is its second-last stride
        pitch = f"{tensor}.shape[-1]" if d.strides is None or rank == 1 else d.strides[-2]
        return f"({tensor}, ({tensor}.numel() // {tensor}.shape[-1], {tensor}.shape[-1]), ({pitch}, 1))"
    strides = _row_major_strides(tensor, rank) if d.strides is None else f"({''.join(s + ', ' for s in d.strides)})"
    return f"({tensor}, {tensor}.shape, {strides})"


def descriptor_table_text(descs: list, layout_names: list = None) -> str:
    """``TMA_DESCRIPTORS = (...)``: (block shape, shared layout) per descriptor argument, the
    layouts as `layout_names` (module-level names) or None."""
    layouts = layout_names or ["None"] * len(descs)
    blocks = "".join(f"({tuple(d.block_shape)}, {layout}), " for d, layout in zip(descs, layouts))
    return f"TMA_DESCRIPTORS = ({blocks})  # (block shape, shared layout) per descriptor argument\n"


def launcher_text(grid: list, params: list, shapes: list, descs: list, dims: list) -> str:
    """``tritile_launch(launch, <params>, <dims>)``: `grid` (host expression texts), the tensors
    `params` (of `shapes`: the global tensors', then any constant tables') and the TMA operands
    of `descs` handed to `launch(grid, tensors, tma_operands, dims)`."""
    grid = list(grid) + ["1"] * (3 - len(grid))
    operands = [host_operand_text(d, params[d.param_index], shapes[d.param_index]) for d in descs]
    return (f"def tritile_launch(launch, {', '.join(params + dims)}):\n"
            f"    launch(({', '.join(grid)}), ({''.join(p + ', ' for p in params)}), "
            f"({''.join(o + ', ' for o in operands)}), ({''.join(d + ', ' for d in dims)}))\n")
