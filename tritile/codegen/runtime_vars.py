"""What both backends' kernel objects share about their runtime scalars (dims and scalar
parameters): a compiled kernel looks each one up by an IR `Var`, and a divisibility variant
(ir/divisibility.py) is called with the frontend's Vars, which its own replaced."""
from __future__ import annotations

import copy


class RuntimeVarsLookup:
    """Mixin of GluonKernel / TritonKernel; the kernel keeps its Vars in `_runtime_vars`."""

    _runtime_vars: list

    def with_runtime_vars(self, runtime_vars: list):
        """This kernel looking its runtime scalars up by `runtime_vars` (its own, in order, or
        the Vars they replaced: a divisibility variant called with the frontend's values)."""
        if all(a is b for a, b in zip(self._runtime_vars, runtime_vars)):
            return self
        kernel = copy.copy(self)
        kernel._runtime_vars = list(runtime_vars)
        return kernel
