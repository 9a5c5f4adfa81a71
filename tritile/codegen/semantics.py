"""docs/semantics.md as generated source: the scalar meaning every backend emits.

Both backends generate Python for Triton's front end - Gluon (``gl``) and triton.language
(``tl``) share their scalar operations, dtypes and helper functions under two module
names - so the text of a constant, an operator, a math call or a cast is the same but for
that name.  This module owns that text, once:

* `dtype_text`, `cast_text`: dtypes and conversions (saturating float -> int, fp8 through
  float32);
* `helpers_text`: the ``@jit`` helper functions a generated module defines (floor `//` / `%`
  for ints and floats, NaN-propagating max / min, the scan's add);
* `sliced_dims`, `selected_text`, `written_text`: part of a register tile (an element, a
  fragment's row) read or written at runtime indices, through a lane mask; `static_ranges`,
  `range_selected_text`, `range_spread_text`: a static partial range of one (`acc_o[:4, :]`); `picked_element_text`
  / `written_element_text` their case of one element of a 1-D tensor (`T.alloc_local` arrays);
* `EXPR_RULES` / `lower_scalar_expr`: the rules of the expression nodes whose meaning does
  not depend on where data lives (Const, BinOp, UnaryOp, Call, Cast), and the folding of
  constant-only expressions with the interpreter's meaning.

Contract with the emitter `em` a rule gets: ``em.lang`` ("gl" or "tl"), ``em.backend`` (its
name in error messages), ``em.func`` (the PrimFunc, for `signs`), ``em.expr(e) -> Val``.
A rule returns a `Val`: the text and the `T.Parallel` dims it varies along.
"""
from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass

import torch

from tritile.codegen import signs
from tritile.errors import CompileError
from tritile.interpreter.expressions import Evaluator
from tritile.interpreter.values import round_scalar
from tritile.ir import dtypes as dt
from tritile.ir import nodes as ir
from tritile.ir.affine import affine
from tritile.ir.padding import padded
from tritile.ir.transform import walk

# IR dtype name -> the dtype's name in triton.language (and Gluon's `gl`)
TRITON_DTYPES = {
    "float16": "float16", "bfloat16": "bfloat16", "float32": "float32", "float64": "float64",
    "float8_e4m3": "float8e4nv", "float8_e5m2": "float8e5", "int8": "int8", "int16": "int16",
    "int32": "int32", "int64": "int64", "uint8": "uint8", "uint16": "uint16",
    "uint32": "uint32", "uint64": "uint64", "bool": "int1",
}
# IR dtype name -> Triton's pointer type string of a kernel signature
POINTER_TYPES = {
    "float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32", "float64": "*fp64",
    "float8_e4m3": "*fp8e4nv", "float8_e5m2": "*fp8e5", "int8": "*i8", "int16": "*i16", "int32": "*i32",
    "int64": "*i64", "uint8": "*u8", "uint16": "*u16", "uint32": "*u32", "uint64": "*u64", "bool": "*i1",
}
# IR dtype name -> Triton's type string of a scalar kernel argument
SCALAR_TYPES = {name: pointer[1:] for name, pointer in POINTER_TYPES.items()}
# names the helpers and module imports take in a generated module
HELPER_NAMES = ("_add_combine", "_and_combine", "_or_combine", "_xor_combine", "_floordiv", "_floormod",
                "_floordiv_float", "_floormod_float", "_any_lane", "_atomic_update_16bit", "_max_propagate_nan",
                "_min_propagate_nan", "_to_float8e4nv", "_to_float8e5", "_philox_word",
                "libdevice")


def dtype_text(dtype, lang: str) -> str:
    return f"{lang}.{TRITON_DTYPES[dtype.name]}"


_HELPERS = '''\
@{jit}
def _add_combine(a, b):
    return a + b


@{jit}
def _and_combine(a, b):
    return a & b


@{jit}
def _or_combine(a, b):
    return a | b


@{jit}
def _xor_combine(a, b):
    return a ^ b


# tritile's // and % are floor division / modulo (docs/semantics.md), Triton's truncate
@{jit}
def _floordiv(a, b):
    r = a % b
    return a // b - ((r != 0) & ((r < 0) != (b < 0))).to((a // b).dtype)


@{jit}
def _floormod(a, b):
    r = a % b
    return {lang}.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@{jit}
def _floordiv_float(a, b, F64: {lang}.constexpr):
    # a, b: fp32 (fp64 with F64) tensors. Triton's fp32 `/` is div.full (2 ulp): divide as IEEE does
    if F64:
        q = {lang}.floor(a / b)
    else:
        q = {lang}.floor({lang}.div_rn(a, b))
    return q


@{jit}
def _floormod_float(a, b, F64: {lang}.constexpr):
    # a - floor(a / b) * b with the product rounded: mul_rn is never contracted into an fma
    return a - libdevice.mul_rn(_floordiv_float(a, b, F64), b)


@{jit}
def _any_lane(x, RANK: {lang}.constexpr):
    # whether any lane of bool tensor `x` (of RANK dims; 0: a scalar) is set
    n = x.to({lang}.int32)
    for _ in {lang}.static_range(RANK):
        n = {lang}.max(n, 0)
    return n > 0


@{jit}
def _atomic_update_16bit(ptr, base, val, mask, KIND: {lang}.constexpr, SEM: {lang}.constexpr, RANK: {lang}.constexpr):
    # Triton's atomics take only add of 16-bit floats: max / min / exchange are a compare-and-swap loop on the
    # element's bits, each lane retrying until its own swap lands; a lane done, or masked off (pointed at `base`,
    # element 0), swaps an element's bits for themselves. Returns each lane's previous value.
    bits = {lang}.where(mask, ptr, base).to({lang}.pointer_type({lang}.int16), bitcast=True)
    old = {lang}.load(bits)
    pending = mask
    while _any_lane(pending, RANK):
        if KIND == "max":
            new = {lang}.maximum(old.to(val.dtype, bitcast=True), val)
        elif KIND == "min":
            new = {lang}.minimum(old.to(val.dtype, bitcast=True), val)
        else:
            new = val
        new = new.to(val.dtype).to({lang}.int16, bitcast=True)  # bfloat16's maximum is a float32
        seen = {lang}.atomic_cas(bits, old, {lang}.where(pending, new, old), sem=SEM)
        pending = pending & (seen != old)
        old = {lang}.where(pending, seen, old)
    return old.to(val.dtype, bitcast=True)


@{jit}
def _max_propagate_nan(a, b):
    return {lang}.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@{jit}
def _min_propagate_nan(a, b):
    return {lang}.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@{jit}
def _philox_word(seed, subsequence, position):
    # IR Call "philox" (int64 operands): draw `position` of cuRAND's Philox4_32_10 stream curand_init(seed,
    # subsequence, 0) - word position % 4 of Philox4x32-10 (Triton's philox_impl) of counter (position // 4,
    # subsequence) under the seed's two words (tritile/frontend/random.py, tritile/interpreter/philox.py)
    k0 = (seed & 0xFFFFFFFF).to({lang}.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to({lang}.uint32)
    block = position >> 2
    c0 = (block & 0xFFFFFFFF).to({lang}.uint32)
    c1 = ((block >> 32) & 0xFFFFFFFF).to({lang}.uint32)
    c2 = (subsequence & 0xFFFFFFFF).to({lang}.uint32)
    c3 = ((subsequence >> 32) & 0xFFFFFFFF).to({lang}.uint32)
    for _ in {lang}.static_range(10):
        _c0, _c2 = c0, c2
        c0 = {lang}.umulhi(_c2, 0xCD9E8D57) ^ c1 ^ k0
        c2 = {lang}.umulhi(_c0, 0xD2511F53) ^ c3 ^ k1
        c1 = _c2 * 0xCD9E8D57
        c3 = _c0 * 0xD2511F53
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    word = position & 3
    return {lang}.where(word == 0, c0, {lang}.where(word == 1, c1, {lang}.where(word == 2, c2, c3)))
'''


def _fp8_conversion_helper(jit: str, lang: str, dtype: str, ptx_type: str) -> str:
    """`_to_<dtype>(x)`: float32 -> fp8 four lanes at a time, packed by prmt.  Triton converts in
    pairs and packs a word with mov.b32 {lo, hi}; where LLVM finds the value constant both halves
    are one register, and ptxas then merged the word's upper half from a stray register
    (F2FP.PACK_AB_MERGE_C ..., R1): lanes 2-3 of every 4 stored garbage on the H100
    (docs/semantics.md, fp8 constants).
    A tensor of fewer than four elements (a one-row fragment's (1,) reduction) keeps Triton's
    own conversion: the packed asm needs a multiple of four elements (Triton refused the kernel,
    "number of input elements 1 must be a multiple of the op's packed_element attribute"), and
    one or two lanes have no upper half to lose."""
    cvt = f"cvt.rn.satfinite.{ptx_type}x2.f32"
    asm = (f"{{ .reg .b16 lo, hi; .reg .b32 lo32, hi32; {cvt} lo, $2, $1; {cvt} hi, $4, $3; "
           "cvt.u32.u16 lo32, lo; cvt.u32.u16 hi32, hi; prmt.b32 $0, lo32, hi32, 0x5410; }")
    return (f"@{jit}\ndef _to_{dtype}(x):\n"
            f"    if x.numel % 4 != 0:\n"
            f"        y = x.to({lang}.{dtype})\n"
            f"    else:\n"
            f"        y = {lang}.inline_asm_elementwise(\"{asm}\", \"=r,r,r,r,r\", [x], dtype={lang}.int8,\n"
            f"                                      is_pure=True, pack=4).to({lang}.{dtype}, bitcast=True)\n"
            f"    return y")


def helpers_text(jit: str, lang: str, code: str) -> str:
    """The helper functions the generated `code` calls (and the helpers those call), decorated
    with `jit` ("gluon.jit" or "triton.jit"), in language `lang`; the module imports `tl`
    (triton.language) and `libdevice` itself."""
    texts = [*_HELPERS.format(jit=jit, lang=lang).split("\n\n\n"),
             *(_fp8_conversion_helper(jit, lang, dtype, ptx) for dtype, ptx in (("float8e4nv", "e4m3"),
                                                                                ("float8e5", "e5m2")))]
    chunks = {re.search(r"def (\w+)\(", chunk).group(1): chunk for chunk in texts}
    used, text = [], code
    while True:
        more = [name for name in chunks if name not in used and re.search(rf"\b{name}\b", text)]
        if not more:
            break
        used += more
        text = "\n".join(chunks[name] for name in more)
    return "\n\n\n".join(chunks[name] for name in chunks if name in used) + ("\n" if used else "")


def cast_text(text: str, src, dst, lang: str) -> str:
    """Text converting `text` (of IR dtype `src`) to `dst` with docs/semantics.md's meaning.

    float -> int: LLVM's fptosi / fptoui give poison for NaN and out-of-range values, so the
    hardware's saturation is not guaranteed (ptxas widens an i8 / i16 conversion to cvt.rzi.u16 /
    .s16 and keeps the wrapped bits; cvt.rzi.s32 turns NaN into INT_MIN), and LLVM may fold later
    arithmetic by the range it then assumes (`min(x + 7, x)` became x for an int64 x converted
    from a float16 inf, which cvt.rzi had saturated to INT64_MAX).  So no out-of-range value
    reaches the conversion: NaN selects 0, values clamp in float to the type's lower bound (exact
    in float32) and an 8- / 16-bit type's upper one; a 32- / 64-bit type's upper bound rounds up
    in float (2^31 - 1 -> 2^31), so values past it (at or above bound + 1) select it as a constant.
    fp8: through float32 (as torch; exact from fp8) where Triton's cvt.rn.satfinite saturates."""
    if src == dst:
        return text
    want = dtype_text(dst, lang)
    if src.is_float and dst.is_int:
        x = text if src.bits >= 32 else f"{text}.to({lang}.float32)"
        low = -(1 << dst.bits - 1) if dst.kind == "int" else 0
        high = (1 << dst.bits - (dst.kind == "int")) - 1
        clamped = f"{lang}.maximum({x}, {float(low)})"
        if dst.bits < 32:
            return f"{lang}.where({x} != {x}, 0.0, {lang}.minimum({clamped}, {float(high)})).to({want})"
        converted = f"{lang}.where({x} != {x}, 0.0, {clamped}).to({want})"
        return f"{lang}.where({x} >= {float(high + 1)}, {lang}.full([], {high}, {want}), {converted})"
    if dst.is_float and dst.bits == 8:
        as_float32 = text if src.name == "float32" else f"{text}.to({lang}.float32)"
        if lang == "gl":  # the Gluon backend, CUDA only: `_fp8_conversion_helper` says why
            return f"_to_{TRITON_DTYPES[dst.name]}({as_float32})"
        return f"{as_float32}.to({want})"
    if src.is_float and src.bits == 8 and dst.name != "float32":
        return f"{text}.to({lang}.float32).to({want})"
    return f"{text}.to({want})"


# T.reduce_* kind -> (reduction of a tile along `axis`, combination with the old destination);
# max / maximum are maxnumf: NaN-ignoring (docs/semantics.md)
_REDUCTIONS = {"max": ("{lang}.max({src}, axis={axis})", "{lang}.maximum({old}, {new})"),
               "min": ("{lang}.min({src}, axis={axis})", "{lang}.minimum({old}, {new})"),
               "sum": ("{lang}.sum({src}, axis={axis})", "{old} + {new}"),
               "abssum": ("{lang}.sum({src}, axis={axis})", "{old} + {new}"),
               "absmax": ("{lang}.max({src}, axis={axis})", "{lang}.maximum({old}, {new})"),
               "bitand": ("{lang}.reduce({src}, {axis}, _and_combine)", "{old} & {new}"),
               "bitor": ("{lang}.reduce({src}, {axis}, _or_combine)", "{old} | {new}"),
               "bitxor": ("{lang}.reduce({src}, {axis}, _xor_combine)", "{old} ^ {new}")}
# with nan_propagate: maximumf / minimumf, a NaN wins
_REDUCTIONS_PROPAGATING_NAN = {
    "max": ("{lang}.reduce({src}, {axis}, _max_propagate_nan)", "_max_propagate_nan({old}, {new})"),
    "min": ("{lang}.reduce({src}, {axis}, _min_propagate_nan)", "_min_propagate_nan({old}, {new})"),
    "absmax": ("{lang}.reduce({src}, {axis}, _max_propagate_nan)", "_max_propagate_nan({old}, {new})")}


def reduction_dtype(src):
    """The dtype a `T.reduce_*` of `src` elements combines in - so the dtype of its result in
    the generated code: float32 for narrower floats (docs/semantics.md: float sums are computed
    in float32; Triton's max / min widen them anyway and its NaN-propagating combine wants
    float32), int32 / uint32 for narrower integers and bool (Triton's max / min / sum widen
    them), else `src` itself.  Every reduction widens explicitly, so the result's dtype never
    depends on which of Triton's reductions widens what - a value of the wrong dtype assigned to
    a fragment changes a loop-carried variable's type, which Triton rejects."""
    if src.bits >= 32 and src.kind != "bool":
        return src
    if src.is_float:
        return dt.float32
    return dt.uint32 if src.kind == "uint" else dt.int32


def _propagates_nan(kind: str, src_dtype, nan_propagate: bool) -> bool:
    return nan_propagate and src_dtype.is_float and kind in _REDUCTIONS_PROPAGATING_NAN


def reduction_text(kind: str, src: str, src_dtype, axis, nan_propagate: bool, lang: str) -> tuple:
    """(text reducing register tile `src` (IR dtype `src_dtype`) along `axis`, the
    result's IR dtype: `reduction_dtype`).  The abs of abssum / absmax is taken in the source's
    type (integer abs wraps, as in the interpreter) before the reduction widens."""
    reduction = (_REDUCTIONS_PROPAGATING_NAN if _propagates_nan(kind, src_dtype, nan_propagate)
                 else _REDUCTIONS)[kind][0]
    if kind in ("abssum", "absmax"):
        src = f"{lang}.abs({src})"
    computed = reduction_dtype(src_dtype)
    src = cast_text(src, src_dtype, computed, lang)
    return reduction.format(lang=lang, src=src, axis=axis), computed


def reduction_combine_text(kind: str, old: str, old_dtype, new: str, new_dtype, src_dtype, nan_propagate: bool,
                           lang: str) -> tuple:
    """(text combining a `T.reduce_*(clear=False)`'s old destination value `old` with the new
    reduction result `new`, its IR dtype): in the reduction's dtype `new_dtype`, or in the
    destination's where that is wider or of another kind (a float64 or float destination of an
    integer reduction), so the old value is never narrowed; rounded once when written.  A float
    side wins over an integer one and any side over a bool destination, as torch promotes in the
    interpreter: a float sum added to a bool or int destination is added in float (an int1 `+`
    is an exclusive or, and truncating the sum first loses a negative fraction)."""
    combine = (_REDUCTIONS_PROPAGATING_NAN if _propagates_nan(kind, src_dtype, nan_propagate)
               else _REDUCTIONS)[kind][1]
    if old_dtype.is_float != new_dtype.is_float or old_dtype.kind == "bool":
        wider = new_dtype if new_dtype.is_float or old_dtype.kind == "bool" else old_dtype
    else:
        wider = old_dtype if old_dtype.kind != new_dtype.kind or old_dtype.bits > new_dtype.bits else new_dtype
    text = combine.format(lang=lang, old=cast_text(old, old_dtype, wider, lang), new=cast_text(new, new_dtype, wider, lang))
    return text, wider


def unsupported(em, what: str, loc=None) -> CompileError:
    return CompileError(f"{what} is not supported by the {em.backend} backend yet", loc)


def lane_loop_bounds(em, s: ir.For) -> tuple:
    """The (start, stop, step) texts of a serial loop inside T.Parallel (`for k in T.serial(n)` in
    each element's body).  Both backends run it once around the lanes' statements, each iteration
    on the whole lane tile: the lanes are independent, so each element's iterations keep their
    order.  That needs the same bounds in every lane; bounds that vary across lanes, and
    T.Pipelined there, are CompileErrors."""
    bounds = [em.expr(e) for e in (s.start, s.stop, s.step)]
    if any(b.dims for b in bounds):
        raise unsupported(em, "a loop inside T.Parallel whose bounds depend on the parallel indices", s.loc)
    if s.kind == "pipelined":
        raise unsupported(em, "T.Pipelined inside T.Parallel", s.loc)
    return tuple(b.text for b in bounds)


@dataclass
class Val:
    """An emitted expression: its text and which Parallel dims it varies along."""

    text: str
    dims: frozenset = frozenset()


# ======================================================================================
# expression rules
# ======================================================================================


def fp8_literal(value: float, dtype, lang: str) -> Val:
    """Triton has no fp8 literals: the value's byte, bitcast."""
    byte = torch.tensor(value, dtype=dtype.torch).view(torch.int8).item()
    return Val(f"{lang}.full([], {byte}, {lang}.int8).to({dtype_text(dtype, lang)}, bitcast=True)")


def lower_const(em, e: ir.Const) -> Val:
    v, lang = e.value, em.lang
    if isinstance(v, bool):
        return Val(str(v))
    if e.dtype.is_float and e.dtype.bits == 8 and v in (math.inf, -math.inf):
        return fp8_literal(v, e.dtype, lang)  # a folded `T.infinity`: e5m2's own (a cast would saturate)
    v = round_scalar(v, e.dtype)  # a folded cast may have left it outside its dtype
    if e.dtype.is_float and e.dtype.bits == 8:
        return fp8_literal(float(v), e.dtype, lang)
    if e.dtype.is_float or isinstance(v, float):
        v = float(v)
        if v != v:
            return Val('float("nan")')
        if v in (float("inf"), float("-inf")):
            return Val('float("inf")' if v > 0 else '-float("inf")')
        if e.dtype.bits == 64 and not _exact_in_float32(v):
            # a bare literal in float32's range is Triton's float32 where it meets a tensor in a
            # library call (`maximum`, `where`, `gl.to_tensor`): -2147483647.0 became -2147483648.0
            return Val(f"{lang}.full([], {v!r}, {dtype_text(e.dtype, lang)})")
        return Val(repr(v))
    if e.dtype.kind == "uint" or e.dtype.is_int and e.dtype.bits != 32:
        # a bare literal is Triton's int32 wherever it meets a tensor in a library call
        # (`maximum`, `where`): int8 arithmetic would then not wrap, uint8 // int32 is a
        # TypeError (different signedness), and an int64 select of two literals was int32
        return Val(f"{lang}.full([], {int(v)}, {dtype_text(e.dtype, lang)})")
    return Val(repr(int(v)))


def _exact_in_float32(v: float) -> bool:
    return abs(v) <= 3.4028234663852886e38 and struct.unpack("f", struct.pack("f", v))[0] == v


_PY_OPS = {"+": "+", "-": "-", "*": "*", "//": "//", "%": "%", "<": "<", "<=": "<=", ">": ">",
           ">=": ">=", "==": "==", "!=": "!=", "&": "&", "|": "|", "^": "^", "<<": "<<", ">>": ">>",
           "and": "&", "or": "|"}


def lower_binop(em, e: ir.BinOp) -> Val:
    a, b = em.expr(e.lhs), em.expr(e.rhs)
    dims = a.dims | b.dims
    operand = e.lhs.dtype
    if operand.is_float and (operand.bits == 8 or e.op in ("//", "%", "/") and operand.bits < 32):
        # Triton has no fp8 arithmetic and divides fp16/bf16 in fp32: compute in fp32 and round
        # the result to the operation's type, as the interpreter does after every operation
        a, b = (_as_type(em, x, v, dt.float32) for x, v in ((e.lhs, a), (e.rhs, b)))
        text = _binop_text(em, e.op, a, b, dt.float32, e)
        return Val(text if e.dtype.kind == "bool" else f"{text}.to({dtype_text(e.dtype, em.lang)})", dims)
    if operand.is_float and e.op in ("//", "%"):
        a, b = (_as_type(em, x, v, operand) for x, v in ((e.lhs, a), (e.rhs, b)))
    return Val(_binop_text(em, e.op, a, b, operand, e), dims)


def _binop_text(em, op: str, a: Val, b: Val, operand, e: ir.BinOp) -> str:
    """``a op b`` on operands of type `operand` (docs/semantics.md)."""
    lang = em.lang
    if op in ("max", "min"):  # maxnumf / minnumf: NaN-ignoring, as TileLang's fmaxf
        return _narrow_float_kept(f"{f'{lang}.maximum' if op == 'max' else f'{lang}.minimum'}({a.text}, {b.text})",
                                  operand, lang)
    if op in ("//", "%"):
        if operand.is_float:
            f64 = operand.bits == 64
            return f"{'_floordiv_float' if op == '//' else '_floormod_float'}({a.text}, {b.text}, {f64})"
        if not signs.of(em).proves(e.lhs) or not signs.of(em).proves(e.rhs):
            return f"{'_floordiv' if op == '//' else '_floormod'}({a.text}, {b.text})"
        return f"({a.text} {op} {b.text})"  # floor and truncation agree on non-negative operands
    if op == "/":
        return f"({a.text} {'//' if operand.is_int else '/'} {b.text})"  # C-style truncation on ints
    if op not in _PY_OPS:
        raise unsupported(em, f"the operator {op!r}")
    return f"({a.text} {_PY_OPS[op]} {b.text})"


def _narrow_float_kept(text: str, dtype, lang: str) -> str:
    """`text`, a `maximum` / `minimum` of operands of `dtype`, in `dtype`: Triton promotes
    bfloat16 operands of those to float32 and returns float32 (and float16 ones met by a literal,
    `T.max(x, 0)`: a float32 result stored into a float16 buffer is a Gluon error), so without
    the conversion (exact: the result is one of the operands) the next operation would compute
    in float32 and skip the rounding the IR has after it (`x + max(y, y)` rounded once, not
    twice)."""
    return f"{text}.to({dtype_text(dtype, lang)})" if dtype in (dt.bfloat16, dt.float16) else text


def _as_type(em, e, v: Val, dtype) -> Val:
    """Operand `e` (emitted as `v`) as a tensor of float `dtype`; a constant becomes a typed
    scalar (a bare literal would take the other operand's type, or fp32 in library calls)."""
    if isinstance(e, ir.Const) or is_python_number(v.text):  # a cast of a constant is emitted as one too
        return Val(f"{em.lang}.full([], {v.text}, {dtype_text(dtype, em.lang)})", v.dims)
    return v if e.dtype == dtype else Val(f"{v.text}.to({dtype_text(dtype, em.lang)})", v.dims)


_NUMBER = re.compile(r'^\(?-?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|float\("-?(?:inf|nan)"\))\)?$')


def is_python_number(text: str) -> bool:
    """Is generated text `text` a bare Python number (``7.0``, ``-3``, ``float("inf")``), which has
    no `.to` and takes its type from whatever meets it?"""
    return _NUMBER.match(text.strip()) is not None


def lower_unary(em, e: ir.UnaryOp) -> Val:
    a = em.expr(e.operand)
    if e.op == "not":
        return Val(f"({a.text} == 0)", a.dims)
    if e.op == "-" and e.dtype.is_float:
        # Triton's unary minus is 0 - x, which gives +0.0 for +0.0: a product by -1 flips the
        # sign of zeros too (exact); fp8 computes in float32 (no fp8 arithmetic in Triton)
        if e.dtype.bits == 8:
            return Val(f"({a.text}.to({em.lang}.float32) * -1.0).to({dtype_text(e.dtype, em.lang)})", a.dims)
        return Val(f"({a.text} * -1.0)", a.dims)
    if e.op == "-":
        return Val(f"(-{a.text})", a.dims)
    return Val(f"({e.op}{a.text})", a.dims)


# intrinsic -> function of the language module
_MATH = {"exp": "exp", "exp2": "exp2", "log": "log", "log2": "log2", "sqrt": "sqrt", "rsqrt": "rsqrt",
         "abs": "abs", "floor": "floor", "ceil": "ceil", "sin": "sin", "cos": "cos", "max": "maximum",
         "min": "minimum", "if_then_else": "where", "fma": "fma"}


# Triton's math functions that take only float32 / float64 operands
_FLOAT32_MATH = {"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "floor", "ceil", "sigmoid", "tanh"}


def lower_call(em, e: ir.Call) -> Val:
    if e.fn == "infinity":  # e4m3 has none: NaN, as torch converts it
        return fp8_literal(float("inf"), e.dtype, em.lang) if e.dtype.bits == 8 else Val('float("inf")')
    lang = em.lang
    args = [em.expr(a) for a in e.args]
    dims = frozenset().union(*[a.dims for a in args]) if args else frozenset()
    texts = [a.text for a in args]
    if e.fn == "philox":  # uint32 from int64 operands (frontend/random.py)
        return Val(f"_philox_word({', '.join(texts)})", dims)
    if e.fn == "reinterpret":
        return Val(f"{texts[0]}.to({dtype_text(e.dtype, lang)}, bitcast=True)", dims)
    if e.fn in ("isnan", "isinf", "isfinite"):  # bool results: nothing to convert back
        x = texts[0] if e.args[0].dtype.bits >= 32 else f"{texts[0]}.to({lang}.float32)"
        test = {"isnan": f"({x} != {x})", "isinf": f"({lang}.abs({x}) == float(\"inf\"))",
                "isfinite": f"({lang}.abs({x}) < float(\"inf\"))"}[e.fn]
        return Val(test, dims)
    # narrower floats compute in float32 and convert back (rounded once, as the interpreter):
    # Triton's exp / log / sqrt ... take no float16 / bfloat16, and every fp8 operation computes
    # so - Triton's fp8 abs masks the sign bits of packed fp8 pairs, and the H100 replay read
    # garbage in every odd lane
    narrow = e.dtype.is_float and e.dtype.bits < 32
    in_float32 = narrow and (e.fn in _FLOAT32_MATH or e.dtype.bits == 8 and e.fn in _MATH and e.fn != "if_then_else")
    if in_float32:
        texts = [f"{t}.to({lang}.float32)" for t in texts]
    if e.fn == "abs" and e.dtype.is_int:
        text = f"{lang}.abs({texts[0]})"
    elif e.fn in _MATH:
        text = f"{lang}.{_MATH[e.fn]}({', '.join(texts)})"
        if e.fn in ("max", "min") and not in_float32:
            text = _narrow_float_kept(text, e.dtype, lang)
    elif e.fn == "sigmoid":
        text = f"(1.0 / (1.0 + {lang}.exp(-{texts[0]})))"
    elif e.fn == "tanh":
        text = f"(2.0 / (1.0 + {lang}.exp(-2.0 * {texts[0]})) - 1.0)"
    else:
        raise unsupported(em, f"T.{e.fn}")
    return Val(f"{text}.to({dtype_text(e.dtype, lang)})" if in_float32 else text, dims)


def lower_cast(em, e: ir.Cast) -> Val:
    if isinstance(e.value, ir.Const):
        return lower_const(em, ir.Const(e.value.value if not e.dtype.is_int else int(e.value.value), e.dtype))
    v = em.expr(e.value)
    return Val(cast_text(v.text, e.value.dtype, e.dtype, em.lang), v.dims)


def atomic_text(em, s: ir.AtomicAdd, ptr: str, value: str, mask: str, rank: int) -> str:
    """The call of the element atomic `s` at pointer text `ptr` with converted `value` and lane
    `mask` (None: every lane; `rank` dims, 0 outside T.Parallel): `tl.atomic_*` / `gl.atomic_*`
    ("exchange": atomic_xchg), or for a 16-bit float's max / min / exchange, which Triton's atomics
    do not take, the `_atomic_update_16bit` compare-and-swap loop.  Integers narrower than 32
    bits: CompileError."""
    dtype = s.dst.buffer.dtype
    if dtype.is_float and dtype.bits == 16 and s.kind != "add":
        # `mask` None: outside T.Parallel (rank 0), one lane
        lanes = mask or ("gl.to_tensor(True)" if em.lang == "gl" else "tl.full([], True, tl.int1)")
        return (f"_atomic_update_16bit({ptr}, {em.name(s.dst.buffer)}, {value}, {lanes}, {s.kind!r}, {s.sem!r}, "
                f"{rank})")
    if dtype.bits < 32 and not dtype.is_float or dtype.bits < 16:
        name = "T.atomic_store" if s.kind == "exchange" else f"T.atomic_{s.kind}"
        raise CompileError(f"{name} of {dtype} is not supported by the {em.backend} backend (Triton's atomics take "
                           f"no integers narrower than 32 bits)", s.loc)
    function = f"{em.lang}.atomic_{'xchg' if s.kind == 'exchange' else s.kind}"
    return f"{function}({ptr}, {value}{'' if mask is None else f', mask={mask}'}, sem={s.sem!r})"


def lower_device_assert(em, s: ir.DeviceAssert):
    """`T.device_assert` -> Triton's device_assert (compiled only with TRITON_DEBUG=1); inside
    T.Parallel only the lanes that run the statement (`em.par.cond`) must satisfy it."""
    cond = em.expr(s.cond).text
    if em.par is not None and em.par.cond:
        cond = f"({cond} | ({em.par.cond} == 0))"
    em.emit(f"{em.lang}.device_assert({cond}, {s.msg!r})")


def lower_thread_barrier(em, s: ir.ThreadBarrier):
    """`T.sync_threads` -> `gl.thread_barrier()` / `tl.debug_barrier()` (both a CTA-wide
    `bar.sync` that also orders memory); inside T.Parallel lanes are threads: CompileError."""
    if em.par is not None:
        raise CompileError("T.sync_threads inside T.Parallel: every thread must reach the barrier", s.loc)
    em.emit("gl.thread_barrier()" if em.lang == "gl" else "tl.debug_barrier()")


def is_constant(e) -> bool:
    """An expression of constants only (no variable, load or table read)."""
    return not any(isinstance(n, (ir.Var, ir.Load, ir.TableRead)) for n in walk(e))



def zero_literal(dtype) -> str:
    """The `other` of a masked load (an out-of-bounds read gives 0, docs/semantics.md): a float
    literal for float buffers (Triton cannot convert an int constant to fp8)."""
    return "0.0" if dtype.is_float else "0"


def out_of_bounds_literal(buf) -> str:
    """The `other` of a masked load of global `buf`: its `T.annotate_safe_value` converted to
    its dtype (the interpreter's `memory.out_of_bounds_value`), else 0."""
    if buf.safe_value is None:
        return zero_literal(buf.dtype)
    value = round_scalar(buf.safe_value, buf.dtype)
    return repr(float(value)) if buf.dtype.is_float else repr(int(value))


def tile_load_text(lang: str, ptr: str, mask, buf) -> str:
    """A tile load of global `buf` at pointer text `ptr`: masked (`mask`, from a backend's
    `global_tile`; out-of-bounds lanes read `out_of_bounds_literal`) or, where `global_tile`
    proved every lane inside the tensor (mask None), a plain load."""
    if mask is None:
        return f"{lang}.load({ptr})"
    return f"{lang}.load({ptr}, mask={mask}, other={out_of_bounds_literal(buf)})"


def mask_argument(mask) -> str:
    """The `, mask=...` argument of a tile store / copy (none where `global_tile` proved every
    lane inside the tensor: mask None)."""
    return "" if mask is None else f", mask={mask}"


def reduction_identity(kind: str, dtype) -> str:
    """The value the pad lanes of a padded tile (ir/padding.py) take in a `T.reduce_<kind>`
    over `dtype` (for abssum / absmax: of the |x| tile), so that they change no result."""
    if kind in ("sum", "abssum", "absmax", "bitor", "bitxor"):
        return zero_literal(dtype)
    if kind == "bitand":  # every bit set
        return "-1" if dtype.kind == "int" else str((1 << dtype.bits) - 1)
    if dtype.is_float:
        return 'float("-inf")' if kind == "max" else 'float("inf")'
    if dtype.kind == "bool":  # max is any, min all
        return "0" if kind == "max" else "1"
    info = torch.iinfo(dtype.torch)
    return str(info.min if kind == "max" else info.max)


# ---- part of a register tile selected at lane-independent indices: one element of a
# `T.alloc_local` array (a 1-D tensor of its elements, padded to a power of two) on both
# backends, any element of an on-chip tile on triton.language, and a row / column / element of
# a fragment (`lse[k, :]`, `lse[k, j]` inside `T.Parallel(j)`) on both.  Registers have no
# indexing by a runtime value: the part is selected through a lane mask.


def local_array_lanes(buf: ir.Buffer) -> int:
    """The lanes of `T.alloc_local` array `buf`'s tensor: its elements, padded to a power of two."""
    n = 1
    for d in buf.shape:
        n *= d
    return padded(n)


def flat_index_text(shape, idx: list) -> str:
    """The row-major index in a tile of `shape` of the element at the emitted indices `idx`."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    strides.reverse()
    return " + ".join(i.text if s == 1 else f"{i.text} * {s}" for i, s in zip(idx, strides))


def sliced_dims(region: ir.Region):
    """The dims along which on-chip `region` takes one index of a longer buffer dim (`x[k, :]`:
    dim 0), every other dim being whole: [] for the whole buffer, None when some dim is a
    partial range (which a register tile cannot express)."""
    dims = []
    for d, (start, extent, size) in enumerate(zip(region.starts, region.extents, region.buffer.shape)):
        if extent == size and _static(start) == 0:
            continue
        if extent != 1:
            return None
        dims.append(d)
    return dims


def _static(e):
    return e.value if isinstance(e, ir.Const) else e if isinstance(e, int) else None


# the integer type of a float's bits (a selection sums bits, see `selected_text`)
_BITS = {8: dt.int8, 16: dt.int16, 32: dt.int32, 64: dt.int64}


def selected_text(lang: str, tile: str, masks: list, axes, dtype) -> str:
    """The values of register tile `tile` (IR dtype `dtype`) on the lanes where every one of
    `masks` holds - one lane along each of `axes`, all lanes along the others - as a tile without
    `axes`.  The other lanes are zeroed and `axes` summed away, floats as their bits: an integer
    sum with one nonzero term is exact for every value (-0.0, infinities and NaN in other lanes,
    fp8, which has no arithmetic, denormals where float adds flush them)."""
    bits = dtype_text(_BITS[dtype.bits], lang) if dtype.is_float else None
    text = f"{tile}.to({bits}, bitcast=True)" if bits else tile
    text = f"{lang}.where({' & '.join(masks)}, {text}, 0)"
    for axis in sorted(axes, reverse=True):
        text = f"{lang}.sum({text}, axis={axis})"
    if bits:  # a narrower integer sum widens to int32
        return f"{text}.to({bits}).to({dtype_text(dtype, lang)}, bitcast=True)"
    return f"{text}.to({dtype_text(dtype, lang)})"


def written_text(lang: str, tile: str, masks: list, value: str) -> str:
    """Register tile `tile` with its lanes where every one of `masks` holds replaced by `value`
    (a tile broadcasting to `tile`'s shape, of its dtype)."""
    return f"{lang}.where({' & '.join(masks)}, {value}, {tile})"


# ---- a static partial range of a register tile (`acc_o[:4, :]`, `x[8:16]`): registers have
# no sub-tile view, so the range is selected through a lane mask too.  Each range dim, of padded
# size P, is split into P / E groups of E lanes (E: the range's extent padded to a power of
# two), the lanes outside the range are zeroed and the groups summed away - exact as in
# `selected_text` - which needs the range to start at a multiple of E (it is then one group).


def offset_from(index, var):
    """k for an index ``var + k``, else None: a T.Parallel variable plus an offset (``x[i + 64, j]``
    over a loop of half x's rows) - a constant where the index is affine in `var` alone
    (`ir.affine`: ``i``, ``32 + i - 4``), else the other operand of ``var + k``."""
    form = affine(index)
    if form is not None and form[0] == {var: 1}:
        return ir.Const(form[1])
    if isinstance(index, ir.BinOp) and index.op == "+":
        if index.lhs is var:
            return index.rhs
        if index.rhs is var:
            return index.lhs
    return None


def static_ranges(region: ir.Region):
    """(dim, start, extent) of each dim along which on-chip `region` takes a static partial range
    of the buffer's dim, every other dim being whole: [] for the whole buffer, None when some dim
    has a runtime start (`sliced_dims`' case)."""
    ranges = []
    for d, (start, extent, size) in enumerate(zip(region.starts, region.extents, region.buffer.shape)):
        s = _static(start)
        if extent == size and s == 0:
            continue
        if s is None or not isinstance(extent, int):
            return None
        ranges.append((d, s, extent))
    return ranges


def misaligned_range(ranges: list):
    """The first (dim, start, extent) of `ranges` that does not start at a multiple of its
    extent padded to a power of two (which a lane-group selection cannot take), else None."""
    return next((r for r in ranges if r[1] % padded(r[2])), None)


def range_masks(lanes: list, ranges: list) -> list:
    """The lane tests of `ranges` given the lane indices `lanes` (a text per range, broadcastable
    to the tile)."""
    return [f"(({k} >= {s}) & ({k} < {s + e}))" for k, (_, s, e) in zip(lanes, ranges)]


def _grouped_shape(shape: list, ranges: list, whole_groups: bool) -> tuple:
    """(tile `shape` with each range dim split into (groups, padded extent) - or (1, padded
    extent) unless `whole_groups` -, the axes of the groups)."""
    split, axes = [], []
    for d, n in enumerate(shape):
        r = next((r for r in ranges if r[0] == d), None)
        if r is None:
            split.append(n)
            continue
        e = padded(r[2])
        axes.append(len(split))
        split += [n // e if whole_groups else 1, e]
    return split, axes


def range_selected_text(lang: str, tile: str, shape: list, masks: list, ranges: list, dtype) -> str:
    """The part of register tile `tile` (of padded `shape`, IR dtype `dtype`) in `ranges`
    (`static_ranges`, aligned: `misaligned_range` is None), selected by `masks`
    (`range_masks`): a tile of `shape` with each range dim's padded extent; its pad lanes are 0.
    Its layout is what the reshape gives (Gluon converts it)."""
    split, axes = _grouped_shape(shape, ranges, True)
    bits = dtype_text(_BITS[dtype.bits], lang) if dtype.is_float else None
    text = f"{tile}.to({bits}, bitcast=True)" if bits else tile
    text = f"{lang}.reshape({lang}.where({' & '.join(masks)}, {text}, 0), {split})"
    for axis in reversed(axes):
        text = f"{lang}.sum({text}, axis={axis})"
    if bits:
        return f"{text}.to({bits}).to({dtype_text(dtype, lang)}, bitcast=True)"
    return f"{text}.to({dtype_text(dtype, lang)})"


def range_spread_text(lang: str, value: str, shape: list, ranges: list) -> str:
    """Register tile `value` (of `shape` with each range dim's padded extent) repeated over every
    group of lanes of a tile of padded `shape`, so that `written_text` with `range_masks` puts it
    at `ranges`.  Its layout is what the reshape gives (Gluon converts it)."""
    ones, _ = _grouped_shape(shape, ranges, False)
    split, _ = _grouped_shape(shape, ranges, True)
    return f"{lang}.reshape({lang}.reshape({value}, {ones}).broadcast_to({split}), {list(shape)})"


def picked_element_text(lang: str, flat: str, lanes: str, index: str, dtype) -> str:
    """Element `index` of 1-D tensor `flat` (lane indices `lanes`)."""
    return selected_text(lang, flat, [f"({lanes} == {index})"], [0], dtype)


def written_element_text(lang: str, flat: str, lanes: str, index: str, value: str) -> str:
    """1-D tensor `flat` with element `index` replaced by `value`."""
    return written_text(lang, flat, [f"({lanes} == {index})"], value)


def bounds_mask(em, indices, emitted, buf) -> str:
    """Lanes whose element lies inside global `buf` (out-of-bounds reads give 0, writes are
    dropped); the lower bound is tested only where an index is not provably >= 0."""
    tests = []
    for index, text, size in zip(indices, emitted, buf.shape):
        if not signs.of(em).proves(index):
            tests.append(f"({text.text} >= 0)")
        tests.append(f"({text.text} < {em.shape_text(size)})")
    return " & ".join(tests)


def tile_starts_inside(em, start) -> bool:
    """Whether a global tile's `start` along a dim is >= 0 on every run (`signs`: block indices,
    loop variables, products and sums of them), so that the tile's test of the lower bound is
    dropped; a halo's ``bx * 32 - 16`` is tested, its lanes before the tensor reading 0."""
    return signs.of(em).proves(start)


def tma_may_store(em, region) -> bool:
    """May a TMA store write global `region`: is every start provably >= 0 (`tile_starts_inside`)?
    A TMA store from a start before the tensor stopped the H100 with "an illegal instruction was
    encountered" (both backends, from registers and straight from shared memory; bench/NOTES.md,
    session 28), while past the end it drops the elements as a masked store does and a TMA load
    before the start reads zeros.  Such stores take the masked path."""
    return all(tile_starts_inside(em, start) for start in region.starts)


def tile_inside(em, start, extent: int, size) -> bool:
    """Whether the indices `start` .. `start` + `extent` - 1 of a global tile along a dim of
    `size` stay below it on every run (`signs.NonNegative.upper_bound` of block indices, loop
    variables and `Let`s: ``j * 64`` for j < ceildiv(4096, 64)), so that the tile's test
    against `size` is dropped (the lower bound: `tile_starts_inside`)."""
    analysis = signs.of(em)
    top, least = analysis.upper_bound(start), analysis.interval(size)[0]
    return top is not None and least is not None and top + extent - 1 < least


def lower_var(em, e: ir.Var) -> Val:
    """A T.Parallel loop variable (its index tile), or a bound name (with the Parallel dims of
    the value a `Let` gave it, `em.let_dims`: inside T.Parallel a name may stand for a tile)."""
    if em.par is not None and e in em.par.index:
        return Val(em.par.index[e], frozenset([em.par.loop.vars.index(e)]))
    if id(e) not in em.defined:
        raise CompileError(f"{e.name} is used in the kernel but is neither a block index, a loop variable, a "
                           f"bound name nor a T.dynamic dimension of the kernel's parameters", None)
    return Val(em.name(e), em.let_dims.get(id(e), frozenset()))


EXPR_RULES = {ir.Var: lower_var, ir.Const: lower_const, ir.BinOp: lower_binop, ir.UnaryOp: lower_unary,
              ir.Call: lower_call, ir.Cast: lower_cast}


def lower_scalar_expr(em, e, backend_rules: dict) -> Val:
    """`e` lowered by `EXPR_RULES` joined with the backend's rules (Load, TableRead)."""
    if isinstance(e, (int, float, bool)):
        return Val(repr(e))
    if isinstance(e, (ir.BinOp, ir.UnaryOp, ir.Call, ir.Cast)) and is_constant(e):
        # folded with the interpreter's meaning: Python would evaluate it at trace time with
        # its own (unbounded ints, true division)
        return lower_const(em, ir.Const(Evaluator({}, None).eval(e), e.dtype))
    rule = backend_rules.get(type(e)) or EXPR_RULES.get(type(e))
    if rule is None:
        raise unsupported(em, f"the expression {type(e).__name__}")
    return rule(em, e)
