"""Triton's interpreter as tritile's second oracle: a generated ``@triton.jit`` kernel run on CPU
tensors, enabled per call, with the interpreter brought to the meaning of the compiled code.

`interpreting(module)` is the context a launch of `module`'s kernel runs in (see
`compiler.TritonKernel.interpret`).  Triton switches its interpreter on at import time
(`TRITON_INTERPRET=1` makes every ``@triton.jit`` an `InterpretedFunction`); tritile chooses it
per call: the kernel runs as an `InterpretedFunction`, and the JIT functions it calls (the
generated helpers, triton.language's own `tl.sum`, `tl.zeros`, ...) are rewritten the same way
while the context is held.  The interpreter patches triton.language while a kernel runs
(`_patch_lang`), so one kernel is interpreted at a time, process-wide; a module imported
for the first time in that window could keep the patched builtins (Gluon's language wraps them
at import), so `interpreting` imports Gluon first.

Where Triton 3.6's interpreter departs from what the compiled kernel computes
(docs/semantics.md), `_repairs` replace its pieces for the duration:
* `tl.maximum` / `tl.minimum` (maxnumf / minnumf, NaN-ignoring) are numpy's NaN-propagating
  maximum / minimum there: np.fmax / np.fmin;
* float -> int conversions are numpy's `astype` (NaN and out-of-range values undefined): here
  they saturate and take NaN to 0, as `cvt.rzi` / `v_cvt_*` do for the 32- and 64-bit targets
  the generated code leaves to the hardware;
* conversions to or from fp8 are a bit-level approximation (no saturation, ties not to even):
  here torch's round-to-nearest-even, saturating at the finite range (`cvt.rn.satfinite`), NaN
  kept;
* bfloat16 values are kept as their uint16 bits, and numpy computes on the bits (`tl.dot`
  included), converts them to other types as integers and has no bfloat16 constants: here
  arithmetic, math functions and `tl.dot` widen them to float32 (exact) and round results back
  to nearest even, conversions go through their values;
* a scalar's `__index__` (a loop bound: `range(n)` of a runtime dim) is `int()` of a 1-element
  array, an error under numpy >= 2.4: `.item()`;
* `tl.device_print` prints numpy arrays: here one line per element as the GPU does,
  ``pid (x, y, z) idx (i, j) msg: value`` (floats as %f; a one-element value is taken for a
  scalar, ``idx ()``: the builder sees no shape beyond the data's);
* an atomic exchange (`tl.atomic_xchg`, `T.atomic_store`) of floats is refused ("Unsupported
  data type"): here it exchanges the bits as the integer of the same width, as the GPU's
  `atom.exch.b32` / `.b64` does;
* extern library calls do not run: the generated module's `libdevice` is swapped for
  `_INTERPRETED_LIBDEVICE` (mul_rn, the floor-modulo helper's unfused product, is numpy's
  product, never fused either).
numpy's warnings about IEEE results (x / 0, inf - inf, an all-NaN max) are silenced: the GPU gives
none.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import types
import warnings

_lock = threading.Lock()
_rewritten = {}  # a @triton.jit function's Python function -> its interpreter rewrite
_ABSENT = object()  # an attribute a patch adds, deleted again afterwards

_INTERPRETED_LIBDEVICE = types.SimpleNamespace(mul_rn=lambda a, b: a * b)


@contextlib.contextmanager
def interpreting(module):
    """Hold Triton's interpreter, repaired, for a launch of generated `module`'s kernel."""
    import numpy as np
    # Imported before anything is patched: Triton imports Gluon on its first argument
    # specialization (`jit.mangle_type`, inside the interpreter's patched window), and Gluon's
    # language wraps triton.language's builtins at import (`program_id = builtin(tl_core.program_id)`),
    # so a first import there would keep the interpreter's patched builtins for the whole process
    # and every later Gluon compile would fail ("Did you forget to add @triton.gluon.jit ?")
    import triton.experimental.gluon.language  # noqa: F401
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    def call_interpreted(self, *args, **kwargs):
        fn = _rewritten.get(self.fn)
        if fn is None:
            fn = _rewritten[self.fn] = InterpretedFunction(self.fn).rewrite()
        return fn(*args, **kwargs)

    with _lock:
        patches = [(JITFunction, "__call__", call_interpreted), (module, "libdevice", _INTERPRETED_LIBDEVICE),
                   *_repairs()]
        saved = [(owner, name, owner.__dict__.get(name, _ABSENT)) for owner, name, _ in patches]
        for owner, name, value in patches:
            setattr(owner, name, value)
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # numpy's all-NaN reductions too
                yield
        finally:
            for owner, name, value in saved:
                if value is _ABSENT:
                    delattr(owner, name)
                else:
                    setattr(owner, name, value)


def _repairs() -> list:
    """(owner, attribute, replacement) for each repair of the module docstring."""
    import numpy as np
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.runtime import interpreter
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    create_dot, patch_tensor = InterpreterBuilder.create_dot, interpreter._patch_lang_tensor
    fp_to_fp, cast_impl = InterpreterBuilder.create_fp_to_fp, InterpreterBuilder.cast_impl
    binary, unary = InterpreterBuilder.binary_op, InterpreterBuilder.unary_op
    atomic_rmw = InterpreterBuilder.create_atomic_rmw

    def create_dot_bf16(builder, a, b, d, *precision):
        return create_dot(builder, _widened(a), _widened(b), d, *precision)

    def patch_tensor_index(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    def get_bf16(builder, value):
        return TensorHandle(_bf16_bits(np.array([value], dtype=np.float64)), tl.bfloat16)

    def float_to_int(builder, src, dst_type):
        return TensorHandle(_saturated_int(_as_float64(src), _np_dtype(dst_type)), dst_type.scalar)

    def create_fp_to_fp(builder, src, dst_type, rounding_mode):
        if not (_kept_as_bits(src.dtype.scalar) or _kept_as_bits(dst_type.scalar)):
            return fp_to_fp(builder, src, dst_type, rounding_mode)
        return TensorHandle(_to_float(_as_float64(src), dst_type), dst_type.scalar)

    def cast(builder, src, dst_type):  # fp_ext / fp_trunc / int <-> float casts all come here
        if dst_type.scalar.is_floating() and (_kept_as_bits(src.dtype.scalar) or _kept_as_bits(dst_type.scalar)):
            return create_fp_to_fp(builder, src, dst_type, None)
        return cast_impl(builder, src, dst_type)

    def binary_op(builder, lhs, rhs, op):  # bfloat16 arithmetic: in float32, rounded back
        if tl.bfloat16 not in (lhs.dtype.scalar, rhs.dtype.scalar):
            return binary(builder, lhs, rhs, op)
        output = op(_widened(lhs).data, _widened(rhs).data)
        if output.dtype.kind == "f":
            return TensorHandle(_bf16_bits(output), tl.bfloat16)
        return TensorHandle(output, lhs.dtype.scalar)

    def unary_op(builder, arg, op):
        if arg.dtype.scalar != tl.bfloat16:
            return unary(builder, arg, op)
        return TensorHandle(_bf16_bits(op(_widened(arg).data)), tl.bfloat16)

    def create_atomic_rmw(builder, op, ptr, val, mask, sem, scope):
        if op != ir.ATOMIC_OP.XCHG or val.data.dtype.kind != "f":
            return atomic_rmw(builder, op, ptr, val, mask, sem, scope)
        bits = tl.core.get_int_dtype(val.data.dtype.itemsize * 8, True)
        old = atomic_rmw(builder, op, ptr, TensorHandle(val.data.view(_np_dtype(bits)), bits), mask, sem, scope)
        return TensorHandle(old.data.view(val.data.dtype), val.dtype.scalar)

    return [(InterpreterBuilder, "get_bf16", get_bf16),
            (InterpreterBuilder, "create_atomic_rmw", create_atomic_rmw),
            (InterpreterBuilder, "binary_op", binary_op),
            (InterpreterBuilder, "unary_op", unary_op),
            (InterpreterBuilder, "create_maxnumf", lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmax)),
            (InterpreterBuilder, "create_minnumf", lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmin)),
            (InterpreterBuilder, "create_fp_to_si", float_to_int),
            (InterpreterBuilder, "create_fp_to_ui", float_to_int),
            (InterpreterBuilder, "create_fp_to_fp", create_fp_to_fp),
            (InterpreterBuilder, "cast_impl", cast),
            (InterpreterBuilder, "create_dot", create_dot_bf16),
            (interpreter, "_patch_lang_tensor", patch_tensor_index),
            (InterpreterBuilder, "create_print", _print_as_the_gpu_does)]


def typed_scalar(value, signature_type: str):
    """A scalar kernel argument as the compiled kernel receives it, for the interpreter: a value
    of its signature type ("i32", "fp32", "i1", ...).  Triton's interpreter would type a Python
    int by its value (int32, or int64 past int32) and keep a float a Python float."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    ty = tl.str_to_ty(signature_type, None)
    if ty == tl.bfloat16:
        data = _bf16_bits(np.array([value], dtype=np.float64))
    else:
        data = np.array([value], dtype=_np_dtype(ty))
    return tl.tensor(TensorHandle(data, ty), ty)


def _np_dtype(triton_type):
    from triton.runtime.interpreter import _get_np_dtype

    return _get_np_dtype(triton_type)


def _torch_fp8(triton_dtype):
    import torch

    return {"fp8e4nv": torch.float8_e4m3fn, "fp8e5": torch.float8_e5m2}[triton_dtype.name]


def _kept_as_bits(scalar) -> bool:
    """The interpreter keeps fp8 and bfloat16 values as their integer bits."""
    return scalar.is_fp8() or scalar.is_bf16()


def _bf16_bits(values):
    """Float `values` rounded to bfloat16 (through float32, to nearest even), as uint16 bits."""
    import numpy as np

    single = np.asarray(values, dtype=np.float32)
    bits = single.view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(single), np.uint16(0x7FC0), rounded)


def _widened(handle):
    """A bfloat16 handle (uint16 bits) as float32 (exact); others unchanged."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    if handle.dtype.scalar != tl.bfloat16:
        return handle
    return TensorHandle((handle.data.astype(np.uint32) << 16).view(np.float32), tl.float32)


def _as_float64(handle):
    """The values of a float handle (fp8 / bfloat16 kept as their bits) as a float64 array."""
    import numpy as np
    import torch

    scalar = handle.dtype.scalar
    if scalar.is_fp8():
        bits = torch.from_numpy(np.ascontiguousarray(handle.data).view(np.uint8))
        return bits.view(_torch_fp8(scalar)).double().numpy()
    if scalar.is_bf16():
        return _widened(handle).data.astype(np.float64)
    return handle.data.astype(np.float64)


def _saturated_int(values, np_dtype):
    """Float64 `values` truncated to the integer type, saturated at its range, NaN -> 0."""
    import numpy as np

    info = np.iinfo(np_dtype)
    truncated = np.trunc(np.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0))
    high, low = values >= float(info.max), values <= float(info.min)
    out = np.where(high | low, 0, truncated).astype(np_dtype)
    out[high] = info.max
    out[low] = info.min
    return out


def _to_float(values, dst_type):
    """Float64 `values` rounded to float `dst_type`: fp8 to nearest even, saturating at its finite
    range (NaN kept), bfloat16 to nearest even, both returned as their bits; other floats by
    numpy."""
    import numpy as np
    import torch

    scalar = dst_type.scalar
    if scalar.is_bf16():
        return _bf16_bits(values)
    if not scalar.is_fp8():
        return values.astype(_np_dtype(dst_type))
    fp8 = _torch_fp8(scalar)
    top = torch.finfo(fp8).max
    # float32 first, as the GPU converts (cvt.rn.satfinite from f32); float32 holds every value
    # the generated code converts to fp8 (it computes fp8 operations in float32)
    x = torch.from_numpy(np.ascontiguousarray(values)).float()
    x = torch.where(torch.isnan(x), x, x.clamp(-top, top))
    return x.to(fp8).view(torch.uint8).numpy()


def _print_as_the_gpu_does(builder, prefix, hex, values, is_signed):
    pid = "pid ({}, {}, {})".format(*builder.grid_idx)
    if not values:
        print(pid + prefix)
    for value in values:
        data = value.data
        if data.size == 1 and data.ndim <= 1:
            data = data.reshape(())
        for index in itertools.product(*(range(n) for n in data.shape)):
            element = data[index].item()
            text = f"{element:f}" if isinstance(element, float) else str(int(element))
            print(f"{pid} idx ({', '.join(map(str, index))}){prefix}{text}")
