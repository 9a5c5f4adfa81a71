"""Assemble the generated Python module: the ``@gluon.jit`` kernel and its host launcher.

`emit_module(func, target)` runs the rules over the kernel body and returns a
`GeneratedKernel` (see `emitter.py` for the argument conventions).  Pure text generation:
nothing is imported from Triton here, so it also runs where Triton is absent.
"""
from __future__ import annotations

import dataclasses

from tritile.codegen import block_order
from tritile.codegen.gluon import early_loads, rings, shared_lifetimes, tma_reduce, warp_specialize
from tritile.codegen.gluon.emitter import HEADER, Emitter, GeneratedKernel
from tritile.codegen.semantics import POINTER_TYPES, helpers_text
from tritile.codegen.tma_descriptors import descriptor_table_text, launcher_text
from tritile.codegen.source_writer import host_expr, runtime_arg_types
from tritile.errors import CompileError
from tritile.ir import nodes as ir


def emit_module(func: ir.PrimFunc, target) -> GeneratedKernel:
    em = Emitter(func, target)
    params = [em.name(p) for p in func.params]
    for p in func.params:
        if p.scope != "global":
            raise CompileError(f"kernel parameter {p.name} must be a global tensor", func.loc)
    dims = [em.define(v) for v in func.runtime_vars]
    kernel_name = em.fresh(func.name)
    k = func.kernel
    if len(k.grid) > 3:
        raise CompileError("T.Kernel takes at most 3 grid dimensions", k.loc)
    rings.plan(em, k.body)
    parts = em.partitions = warp_specialize.plan(em, func)
    if parts is None and "warp_specialization" in func.attrs:
        # planned for a producer warp that this kernel's rings cannot serve (a copy TMA cannot
        # take here): its own warps issue the copies, so its rings must count arrivals as the
        # kernel's own copies signal them, not as a producer partition would
        attrs = {name: value for name, value in func.attrs.items() if name != "warp_specialization"}
        return emit_module(dataclasses.replace(func, attrs=attrs), target)
    early_loads.plan(em, func)
    shared_lifetimes.plan(em, func)
    block_order.emit_block_ids(em, k)
    if parts is None:
        em.kernel_body(k.body)
    else:  # the kernel forks; its body becomes the consumer partition
        kernel_lines, em.lines = em.lines, []
        em.kernel_body(k.body)
        consumer_lines = em.lines
        producer_lines = warp_specialize.emit_producer(em, func, parts)
        em.lines = kernel_lines

    descs = list(em.descriptors.values())
    tables = [name for name, _ in em.tables.values()]
    arg_names = params + tables + [d.name for d in descs] + dims
    partitions = []
    if parts is not None:
        consumer, producer = em.fresh(f"{kernel_name}_consumer"), em.fresh(f"{kernel_name}_producer")
        args = warp_specialize.partition_args(em, func, parts, arg_names)
        warp_specialize.emit_fork(em, parts, consumer, producer, args)
        partitions = [(consumer, warp_specialize.consumer_args(em, parts, args), consumer_lines),
                      (producer, args, producer_lines)]
    signature = {n: POINTER_TYPES[p.dtype.name] for n, p in zip(params, func.params)}
    signature.update({n: "*i32" for n in tables})
    signature.update({d.name: None for d in descs})  # mangled by the runtime from a host descriptor
    signature.update(zip(dims, runtime_arg_types(func)))

    kernel_lines = [line for _, _, lines in partitions for line in lines] + em.lines
    reduces = any("async_reduce_add(" in line for line in kernel_lines)
    out = [HEADER.format(name=func.name, target=target), tma_reduce.IMPORT if reduces else "",
           helpers_text("gluon.jit", "gl", "\n".join(kernel_lines)), "\n"]
    for d in descs:
        out.append(f"{_host_layout(d)} = {d.layout}\n")
    out.append(descriptor_table_text(descs, [_host_layout(d) for d in descs]))
    values = "".join(f"({name!r}, {table.values!r}), " for name, table in em.tables.values())
    out.append(f"CONSTANT_TABLES = ({values})  # (name, int32 values) per table argument\n")
    for name, args, lines in partitions:
        out.append("\n@gluon.jit\n")
        out.append(f"def {name}({', '.join(args)}):\n")
        out.extend(line + "\n" for line in em.layout_lines)
        out.extend(line + "\n" for line in lines)
        out.append("\n")
    out.append("\n@gluon.jit\n")
    out.append(f"def {kernel_name}({', '.join(arg_names)}):\n")
    out.extend(line + "\n" for line in em.layout_lines)
    out.extend(line + "\n" for line in em.lines)
    out.append("\n\n")
    grid = [host_expr(g, em) for g in k.grid]
    shapes = [p.shape for p in func.params] + [(len(table.values),) for _, table in em.tables.values()]
    out.append(launcher_text(grid, params + tables, shapes, descs, dims))
    return GeneratedKernel("".join(out), kernel_name, arg_names, signature, descs, em.num_warps)


def _host_layout(d) -> str:
    return f"HOST_{d.name}_layout"

