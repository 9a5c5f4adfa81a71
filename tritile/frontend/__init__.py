"""Python AST -> tile IR.

Entry points:
* `parse_prim_func(fn, caller_locals)`: a `@T.prim_func` (lazy style) -> verified `PrimFunc`.
* `parse_kernel(fn, consts)`: an eager-style `@tritile.jit` body specialised for `consts`
  (function keyword arguments and `T.const` values) -> verified `PrimFunc`.
* `probe_const_dims(fn, consts, with_globals=False)`: for an eager-style body, where each
  `T.const` name is read from: {name: (tensor parameter position, dim)}; with `with_globals`,
  the pair (that dict, the guards of the module globals the probe read).  Only the
  statements before `with T.Kernel` are evaluated.

Every `PrimFunc` returned has passed `tritile.ir.verifier.verify`; user mistakes raise
`tritile.CompileError` with the user's file:line and source line.
"""
from __future__ import annotations

from tritile.errors import CompileError
from tritile.frontend.parser import Parser
from tritile.ir import nodes as ir
from tritile.ir.verifier import verify


def parse_prim_func(fn, caller_locals: dict = None) -> ir.PrimFunc:
    return verify(Parser().parse(fn, caller_locals))


def parse_kernel(fn, consts: dict) -> ir.PrimFunc:
    return verify(Parser(consts).parse(fn))


def probe_const_dims(fn, consts: dict, with_globals: bool = False):
    parser = Parser(consts, probe=True)
    partial = parser.parse(fn)
    tensor_params = [name for name, _ in parser.params]
    bindings = {}
    for name, symbol in parser.const_symbols.items():
        for position, (param_name, buf) in enumerate(parser.params):
            if isinstance(buf, ir.Buffer) and any(size is symbol for size in buf.shape):
                bindings[name] = (position, [size is symbol for size in buf.shape].index(True))
                break
        else:
            raise CompileError(f"T.const {name!r} is not a dimension of any tensor parameter "
                               f"({', '.join(tensor_params)}); pass {name}=... explicitly", partial.loc)
    return (bindings, partial.attrs["globals_read"]) if with_globals else bindings
