"""`tilelang.language.eager.ast.mutate` on tritile's frontend.

TileLang's `mutate(fn)` rewrites the function's AST into calls on its IR builder (`__tb.bind`,
`__tb.aug_assign(...)`, ...) and returns an `IRGenerator`: `gen` (the rewritten function,
called with a builder), `source` (the rewritten source text), `extra_type_hints` (parameters
annotated in the body).  tritile's frontend does not rewrite the AST: it walks the function's
own AST and builds tile IR as it goes (`tritile.frontend.parser`).  So here:

* `source` is the function as tritile's frontend parses it: `ast.unparse` of the tree it
  walks, decorators dropped - no `__tb.*` calls, because there is no rewrite (a test that looks
  for TileLang's rewritten text cannot pass, by design);
* `extra_type_hints` is TileLang's: a parameter annotated in the body with a dtype maps to the
  dtype, one annotated with `T.Tensor` / `T.Buffer` to tritile's `T.Tensor` (TileLang's
  `T.ptr` marker, which tritile does not have);
* `gen` raises NotImplementedError: tritile has no builder object to call it with.
"""
from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field

from tritile.frontend.source import MISSING, FunctionSource
from tritile.ir.dtypes import DType


@dataclass
class IRGenerator:
    """What `mutate(fn)` returns: the attributes of TileLang's `IRGenerator`."""

    source: str
    extra_type_hints: dict = field(default_factory=dict)
    name: str = ""

    @property
    def gen(self):
        raise NotImplementedError(
            f"IRGenerator.gen of {self.name}: tritile has no IR builder to call a rewritten function with (its "
            f"frontend walks the function's AST itself); use T.prim_func, T.macro or tritile.jit")


def mutate(func) -> IRGenerator:
    """TileLang's `mutate(func)`: `func`'s source as tritile's frontend parses it, and the
    parameters its body annotates (see the module docstring)."""
    src = FunctionSource(func)
    tree = copy.copy(src.tree)  # the frontend's tree stays as it is
    tree.decorator_list = []
    return IRGenerator(source=ast.unparse(tree), extra_type_hints=_body_annotated_params(src), name=func.__name__)


def _body_annotated_params(src: FunctionSource) -> dict:
    """{parameter: dtype | T.Tensor} for each parameter annotated in the body's top level
    (`A: T.Tensor[...]`, `A: T.StridedTensor(...)`, `n: T.int32`), as TileLang's mutator collects them."""
    from tritile import language as T

    args = src.tree.args
    params = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    hints = {}
    for stmt in src.tree.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is None
                and stmt.target.id in params):
            continue
        annotation = stmt.annotation
        head = annotation.func if isinstance(annotation, ast.Call) else \
            annotation.value if isinstance(annotation, ast.Subscript) else annotation
        value = _value_of(head, src)
        if isinstance(value, DType):
            hints[stmt.target.id] = value
        elif value is T.Tensor or value is T.StridedTensor:
            hints[stmt.target.id] = T.Tensor
    return hints


def _value_of(node, src: FunctionSource):
    """The value of a name or attribute chain (`T.float16`) in the function's scope, else MISSING."""
    if isinstance(node, ast.Name):
        return src.lookup(node.id)
    if isinstance(node, ast.Attribute):
        base = _value_of(node.value, src)
        return MISSING if base is MISSING else getattr(base, node.attr, MISSING)
    return MISSING
