"""Call-time argument checks and output allocation, run before anything executes.

Contract: `ArgumentBinder(func, written, grid)(args)` takes what the user passed to a kernel (all
parameters, or only the inputs when the function has `out_idx`) and returns the full tensor list
in parameter order, the value of every `T.dynamic` Var and scalar parameter, whether the grid
(`grid`: the kernel's extents as the user wrote them) has any block and the divisibility key of
the call's runtime integers (`tritile.ir.divisibility.key` over its `specialized_vars`: the
`T.dynamic` values, then the integer scalar parameters; which variant of the program runs), or
raises:
* `TypeError`  - wrong number of arguments, a non-tensor, a wrong dtype, mixed device kinds, a
  device that runs no kernel (a `meta` tensor: only CUDA and CPU tensors run), a scalar
  parameter given something else than a Python number or a 0-d tensor of its kind (an int for
  an integer parameter, an int or float for a float one, a bool or int for a bool one);
* `ValueError` - wrong rank, a dimension that differs from a compile-time constant or from
  another binding of the same `T.dynamic` symbol, a `T.StridedTensor`'s tensor whose strides
  differ from the declared ones (along a dim of size over 1), a non-contiguous tensor the
  kernel writes through a `T.Tensor` parameter, a tensor whose elements span more than 2**31
  (the generated code computes element offsets in int32), a grid extent that the `T.dynamic`
  sizes make negative, an integer scalar outside its dtype's range.  A float scalar is
  rounded to its dtype, as the kernel receives it.
A grid extent of 0 (an empty batch) is no error: the call runs nothing, as Triton's launcher
does for an empty grid, and returns the outputs as allocated.
Messages name the parameter: "argument 'B' (param 1): expected dtype float16, got float32".
A `T.Tensor` parameter's non-contiguous tensor the kernel only reads is made contiguous (a copy);
a written one cannot be, because the caller would never see the results, so it is rejected.  A
`T.StridedTensor` parameter's tensor is passed as it is (its strides checked), never copied.
Outputs named by `out_idx` are allocated on the inputs' device (the GPU when there is one, for a
kernel without inputs), a `T.StridedTensor` output with its declared strides.
"""
from __future__ import annotations

import math
import numbers

import torch

from tritile.interpreter.expressions import Evaluator
from tritile.interpreter import values as V
from tritile.interpreter.values import round_scalar
from tritile.ir import divisibility
from tritile.ir.affine import solve_dim
from tritile.ir import nodes as ir
from tritile.ir.dtypes import from_torch
from tritile.ir.printer import expr_str
from tritile.ir.transform import walk, written_buffer


def written_params(func: ir.PrimFunc) -> set:
    """Indices of the parameters the kernels write (through a view too)."""
    written = [written_buffer(node) for kernel in func.kernels for node in walk(kernel.body)]
    ids = {id(b.view_of or b) for b in written if b is not None}
    return {i for i, p in enumerate(func.params) if id(p) in ids}


_RUNNABLE_DEVICES = ("cuda", "cpu")  # the Gluon kernel, the interpreter
_MAX_ELEMENTS = 2 ** 31  # the largest offset, elements - 1, must fit the kernel's int32 arithmetic


def _label(func, index) -> str:
    """The message prefix of tensor parameter `index`, counted as the call counts it (scalars included)."""
    position = index
    for scalar_position, _ in sorted(func.scalar_params, key=lambda entry: entry[0]):
        if scalar_position <= position:
            position += 1
    return f"argument '{func.params[index].name}' (param {position})"


def scalar_value(var: ir.Var, value, position: int):
    """The value scalar parameter `var` receives from the call's argument `value` (a Python
    number or a 0-d tensor), as the kernel sees it; TypeError / ValueError naming it."""
    dtype, label = var.dtype, f"argument '{var.name}' (param {position})"
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise TypeError(f"{label}: the scalar parameter {var.name}: {dtype} takes a Python number or a 0-d "
                            f"tensor, got a tensor of shape {list(value.shape)}")
        value = value.item()
    if dtype.kind == "bool":
        accepted = isinstance(value, numbers.Integral)
    elif dtype.is_int:
        accepted = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    else:
        accepted = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not accepted:
        raise TypeError(f"{label}: the scalar parameter {var.name}: {dtype} takes "
                        f"{'a bool' if dtype.kind == 'bool' else 'an int' if dtype.is_int else 'a float or int'}, "
                        f"got {type(value).__name__} {value!r}")
    if dtype.is_int:
        info = torch.iinfo(dtype.torch)
        if not info.min <= int(value) <= info.max:
            raise ValueError(f"{label}: {value} is outside the range of {dtype} ({info.min} to {info.max})")
        return int(value)
    return round_scalar(bool(value) if dtype.kind == "bool" else float(value), dtype)


def check_tensors(func: ir.PrimFunc, indices, tensors, written: set, dim_values: dict) -> list:
    """Check `tensors` against the params at `indices`; fills `dim_values`; returns the
    tensors (read-only non-contiguous ones of `T.Tensor` params replaced by contiguous copies)."""
    out = []
    device_kind = None
    for index, tensor in zip(indices, tensors):
        param, label = func.params[index], _label(func, index)
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{label}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type not in _RUNNABLE_DEVICES:
            raise TypeError(f"{label}: a tensor on device '{tensor.device}'; tritile runs kernels on CUDA tensors "
                            f"(the Gluon kernel) or CPU tensors (the interpreter)")
        try:
            got = from_torch(tensor.dtype)
        except TypeError:
            got = tensor.dtype
        if got != param.dtype:
            raise TypeError(f"{label}: expected dtype {param.dtype}, got {got}")
        if tensor.dim() != param.ndim:
            raise ValueError(f"{label}: expected a {param.ndim}-D tensor of shape {_shape(param)}, got "
                             f"{tensor.dim()}-D shape {list(tensor.shape)}")
        for dim, (want, have) in enumerate(zip(param.shape, tensor.shape)):
            if isinstance(want, int):
                if want != have:
                    raise ValueError(f"{label}: dimension {dim} must be {want} (shape {_shape(param)}), got "
                                     f"{have} (shape {list(tensor.shape)})")
            elif isinstance(want, ir.Var):
                bound = dim_values.setdefault(want, have)
                if bound != have:
                    raise ValueError(f"{label}: dimension {dim} is the dynamic size '{want.name}' = {bound} "
                                     f"from another argument, got {have}")
            else:  # an affine size, `n * 4`, binding the symbol it was chosen to bind
                for var, where in func.dim_bindings.items():
                    if where == (index, dim) and var not in dim_values:
                        dim_values[var] = solve_dim(want, var, have, f"{label}, dimension {dim}")
        if param.strides is not None:
            for dim, declared in enumerate(param.strides):
                for var, where in func.stride_bindings.items():
                    if where == (index, dim) and var not in dim_values:
                        dim_values[var] = solve_dim(declared, var, tensor.stride(dim), f"{label}, stride {dim}")
        if param.strides is None and tensor.numel() > _MAX_ELEMENTS:  # contiguous (or made so)
            raise ValueError(f"{label}: {tensor.numel()} elements (shape {list(tensor.shape)}) is more than the "
                             f"2**31 the kernel can address: it computes element offsets in int32")
        if param.strides is not None and tensor.numel() and \
                sum((n - 1) * st for n, st in zip(tensor.shape, tensor.stride())) >= _MAX_ELEMENTS:
            raise ValueError(f"{label}: its elements (shape {list(tensor.shape)}, strides {list(tensor.stride())}) "
                             f"span more than the 2**31 the kernel can address: it computes element offsets in int32")
        if device_kind is None:
            device_kind = tensor.device.type
        elif tensor.device.type != device_kind:
            raise TypeError(f"{label}: on a {tensor.device.type} device, but earlier arguments are on "
                            f"{device_kind}; all tensors must be on one device kind")
        if param.strides is None and not tensor.is_contiguous():
            if index in written:
                raise ValueError(f"{label}: the kernel writes this tensor, so it must be contiguous; pass "
                                 f"tensor.contiguous() and read the results from that (or declare it a "
                                 f"T.StridedTensor)")
            tensor = tensor.contiguous()
        out.append(tensor)
    for index, tensor in zip(indices, out):  # every dim is bound now: strides may name another tensor's
        _check_strides(func, index, tensor, dim_values)
    return out


def _check_strides(func: ir.PrimFunc, index: int, tensor: torch.Tensor, dim_values: dict):
    """A `T.StridedTensor` parameter's tensor has its declared strides (a dim of size 1 or 0 may have
    any stride: it addresses nothing but index 0); ValueError naming the argument otherwise."""
    param = func.params[index]
    if param.strides is None:
        return
    declared = _concrete(param.strides, dim_values)
    if any(n > 1 and want != have for n, want, have in zip(tensor.shape, declared, tensor.stride())):
        raise ValueError(f"{_label(func, index)}: a T.StridedTensor of strides {_shape(param, param.strides)} = "
                         f"{declared} (shape {list(tensor.shape)}), got a tensor of strides {list(tensor.stride())}")


def laid_out(param: ir.Buffer, tensor: torch.Tensor, what: str) -> torch.Tensor:
    """`tensor`'s values with `param`'s declared strides (a `T.StridedTensor` of static strides; `tensor`
    itself for a `T.Tensor`): the inputs a profiler or tuner makes; ValueError for runtime strides."""
    if param.strides is None:
        return tensor
    if not all(isinstance(s, int) for s in param.strides):
        raise ValueError(f"{what}: parameter '{param.name}' has runtime strides {_shape(param, param.strides)}; "
                         f"pass the input tensors")
    out = torch.empty_strided(tuple(tensor.shape), param.strides, dtype=tensor.dtype, device=tensor.device)
    return out.copy_(tensor)


def _shape(param: ir.Buffer, sizes=None) -> list:
    return [s if isinstance(s, int) else expr_str(s) for s in (param.shape if sizes is None else sizes)]


def _concrete(sizes, dim_values: dict) -> list:
    evaluator = Evaluator(dim_values, None)
    return [s if isinstance(s, int) else int(evaluator.scalar(s)) for s in sizes]


class ArgumentBinder:
    """`binder(args)` -> (full tensor list in param order, {Var: value}, grid has blocks,
    divisibility key) for a call with `args`.  Scalar parameters' arguments are taken out of
    `args` first (by their positions in the call) and converted (`scalar_value`); the rest is
    the tensors.

    The checks of `check_tensors` run in full the first time a combination of tensor types,
    dtypes, shapes and devices is seen; the outcome (runtime dims, output shapes, the dims'
    divisibility key) is remembered under that combination, so a later call with contiguous
    tensors of the same kind only rebuilds the key, checks contiguity and allocates the
    outputs (the scalars, which change from call to call, are converted and their part of the
    divisibility key computed every call); a non-contiguous tensor's key holds its strides, and a
    call that copied one is not remembered.  Anything else (a non-tensor, a copied tensor, a
    new shape or strides) takes the full path and its messages."""

    _MEMO_LIMIT = 64  # distinct argument kinds remembered; past it the memo starts over

    def __init__(self, func: ir.PrimFunc, written: set, grid: tuple):
        self.func = func
        # the extents only known at call time, checked on the full path (their values are a
        # function of the shapes, which the memo's key holds)
        self.dynamic_grid = [(axis, g) for axis, g in enumerate(grid) if isinstance(g, ir.Expr)
                             and not isinstance(g, ir.Const)]
        self.written = written
        self.n_params = len(func.params)
        self.inputs = [i for i in range(self.n_params) if i not in func.out_idx]
        self.allocates = bool(func.out_idx)
        self.outputs = [(i, func.params[i].dtype.torch) for i in func.out_idx]
        self._memo = {}  # tensor kinds -> (dim_values, [output (shape, strides) per out_idx entry], runs, dims' key)
        # the call's parameters: which positions are scalars, and which of them a call leaving
        # out the outputs passes
        call_params = func.call_params()
        outputs = {id(func.params[i]) for i in func.out_idx}
        self.scalar_positions = {position: var for position, var in func.scalar_params}
        self.int_scalars = divisibility.specialized_vars(func)[len(func.dynamic_vars):]
        self.call_inputs = [position for position, p in enumerate(call_params) if id(p) not in outputs]
        self.call_names = [p.name for p in call_params]

    def __call__(self, args):
        scalars = {}
        if self.scalar_positions:
            args, scalars = self._split_scalars(args)
        try:  # a non-contiguous tensor's key holds its strides (remembered only where it was not copied)
            key = tuple([(type(t), t.dtype, t.shape, t.device, t.is_contiguous() or t.stride()) for t in args])
        except AttributeError:  # a non-tensor: the full path names it
            key = None
        known = self._memo.get(key)
        if known is not None:
            dim_values, out_layouts, runs, divisible = known
            if scalars:
                dim_values = {**dim_values, **scalars}
                runs = self.grid_has_blocks(dim_values)
                divisible += divisibility.key(self.int_scalars, scalars)
            return (self.with_outputs(list(args), out_layouts), dict(dim_values) if dim_values else {}, runs,
                    divisible)
        tensors, dim_values, out_layouts, copied = self._bind_checked(args)
        divisible = divisibility.key(self.func.dynamic_vars, dim_values)
        dims = dict(dim_values)
        dim_values.update(scalars)
        runs = self.grid_has_blocks(dim_values)
        if key is not None and not copied:  # checked without copies: the outcome holds for every call of this kind
            if len(self._memo) >= self._MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = (dims, out_layouts, runs, divisible)
        return tensors, dim_values, runs, divisible + divisibility.key(self.int_scalars, scalars)

    def outcome_of_kind(self, args):
        """(dim_values, the outputs' (shape, strides: None for contiguous) when the call allocates
        them, grid has blocks, divisibility key): what every call with tensors of `args`' kind
        (types, dtypes, shapes, strides, devices) binds, after the full checks and their
        TypeError / ValueError; None where calls of that kind do not all bind alike: a kernel
        with scalar parameters (their values vary from call to call, checked per call) or a
        call whose tensors the checks copy."""
        if self.scalar_positions:
            self(args)  # the call's checks, scalars included
            return None
        _, dim_values, out_layouts, copied = self._bind_checked(args)
        if copied:
            return None
        return (dim_values, out_layouts, self.grid_has_blocks(dim_values),
                divisibility.key(self.func.dynamic_vars, dim_values))

    def _split_scalars(self, args):
        """(the tensor arguments, {scalar Var: value}) of a call passing every parameter, or
        every input when the kernel allocates its outputs."""
        if self.allocates and len(args) == len(self.call_inputs):
            positions = self.call_inputs
        elif len(args) == len(self.call_names):
            positions = range(len(self.call_names))
        else:
            expected = self.call_inputs if self.allocates else range(len(self.call_names))
            names = ", ".join(self.call_names[i] for i in expected)
            raise TypeError(f"{self.func.name}() expected {len(expected)} arguments ({names}), got {len(args)}")
        tensors, scalars = [], {}
        for position, value in zip(positions, args):
            var = self.scalar_positions.get(position)
            if var is None:
                tensors.append(value)
            else:
                scalars[var] = scalar_value(var, value, position)
        return tensors, scalars

    def grid_has_blocks(self, dim_values: dict) -> bool:
        """False for an empty grid; a negative extent raises ValueError naming its sizes."""
        runs = True
        for axis, extent in self.dynamic_grid:
            value = int(Evaluator(dim_values, None).scalar(extent))
            if value < 0:
                sizes = ", ".join(f"{var.name} = {dim_values[var]} ({_label(self.func, index)}, dim {dim})"
                                  for var, (index, dim) in self.func.dim_bindings.items() if var in dim_values)
                raise ValueError(f"{self.func.name}(): grid extent {axis} of T.Kernel, {expr_str(extent)}, is "
                                 f"{value} with {sizes}; it must not be negative")
            runs = runs and value > 0
        return runs

    def with_outputs(self, args: list, out_layouts: list) -> list:
        """`args` (the inputs, or every tensor) with the outputs allocated on their device, each
        of its (shape, strides: None for contiguous)."""
        if not (self.allocates and len(args) == len(self.inputs)):
            return args
        device = call_device(args)
        full = [None] * self.n_params
        for i, t in zip(self.inputs, args):
            full[i] = t
        for (i, dtype), (shape, strides) in zip(self.outputs, out_layouts):
            full[i] = (empty_output(shape, dtype, device) if strides is None
                       else torch.empty_strided(shape, strides, dtype=dtype, device=device))
        return full

    def _bind_checked(self, args):
        """(the call's tensors, {Var: value}, the outputs' (shape, strides) when allocated, whether a
        tensor was copied)."""
        func, dim_values = self.func, {}
        if self.allocates and len(args) == len(self.inputs):
            tensors = check_tensors(func, self.inputs, args, self.written, dim_values)
            out_layouts = [_output_layout(func, i, dim_values) for i, _ in self.outputs]
            copied = any(t is not a for t, a in zip(tensors, args))
            return self.with_outputs(tensors, out_layouts), dim_values, out_layouts, copied
        if len(args) != self.n_params:
            names = ", ".join(func.params[i].name for i in (self.inputs if self.allocates else range(self.n_params)))
            expected = f"{len(self.inputs)} ({names})" if self.allocates else f"{self.n_params} ({names})"
            raise TypeError(f"{func.name}() expected {expected} tensors, got {len(args)}")
        tensors = check_tensors(func, range(self.n_params), args, self.written, dim_values)
        return tensors, dim_values, [], any(t is not a for t, a in zip(tensors, args))


def empty_output(shape, dtype, device) -> torch.Tensor:
    """A new contiguous tensor of `shape`, uninitialised: `torch.empty` with the sizes as arguments,
    which it parses ~0.6 us faster than a shape sequence (a warm call's output)."""
    return torch.empty(*shape, dtype=dtype, device=device) if shape else torch.empty((), dtype=dtype, device=device)


def call_device(tensors) -> torch.device:
    """Where a call's new tensors (outputs, workspaces) go: its tensors' device; without input
    tensors (a kernel that only writes its outputs) the GPU when there is one, as TileLang."""
    return tensors[0].device if tensors else torch.device("cuda" if torch.cuda.is_available() else "cpu")


def allocate_workspaces(func: ir.PrimFunc, dim_values: dict, device) -> list:
    """The call's `T.alloc_global` tensors on `device`, uninitialised (as TileLang's); their
    shapes are ints or expressions of the call's runtime scalars."""
    evaluator = Evaluator(dim_values, None)
    return [torch.empty([int(evaluator.scalar(s)) if isinstance(s, ir.Expr) else s for s in b.shape],
                        dtype=b.dtype.torch, device=device) for b in func.workspaces]


def derive_views(func: ir.PrimFunc, tensors: list, dim_values: dict) -> list:
    """The call's tensors of `func.views` (global `T.reshape` / `T.view`s), each the same
    storage as its parameter's or workspace's tensor in `tensors` (params then workspaces,
    contiguous): `tensor.view(dtype).view(shape)`.  A view whose bytes differ from its
    storage's at this call's sizes is a ValueError naming it."""
    owners = {id(b): t for b, t in zip(func.params + func.workspaces, tensors)}
    evaluator = Evaluator(dim_values, None)
    out = []
    for view in func.views:
        storage = owners[id(view.view_of)]
        shape = [int(evaluator.scalar(s)) if isinstance(s, ir.Expr) else s for s in view.shape]
        bytes_, have = math.prod(shape) * view.dtype.bits, storage.numel() * storage.element_size() * 8
        if bytes_ != have:
            raise ValueError(f"view '{view.name}' of '{view.view_of.name}': shape {shape} of {view.dtype} is "
                             f"{bytes_} bits, but '{view.view_of.name}' {list(storage.shape)} holds {have}")
        out.append(V.reinterpret(storage, view.dtype, shape))
    return out


def _output_layout(func: ir.PrimFunc, index: int, dim_values: dict) -> tuple:
    """(shape, strides) of output `index` allocated by the runtime: its declared strides (a
    `T.StridedTensor`), or None (contiguous)."""
    param = func.params[index]
    sizes = []
    for size in (*param.shape, *(param.strides or ())):
        if isinstance(size, int):
            sizes.append(size)
        elif isinstance(size, ir.Expr) and all(v in dim_values for v in walk(size) if isinstance(v, ir.Var)):
            sizes.append(int(Evaluator(dim_values, None).scalar(size)))
        else:
            what = "dimension" if len(sizes) < param.ndim else "stride"
            raise ValueError(f"cannot allocate output '{param.name}': its {what} {expr_str(size)} is not known "
                             f"from the inputs")
    return sizes[:param.ndim], (tuple(sizes[param.ndim:]) if param.strides is not None else None)
