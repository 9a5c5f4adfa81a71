"""TileLang constructs tritile does not implement yet are CompileErrors at the user's line that
name the construct (not a confusing unknown-name or attribute error)."""
import pytest

import tritile
import tritile.language as T


@pytest.mark.parametrize("name,args", [
    ("reshape", (None, (8, 8))),
    ("view", (None, (8, 8))),
])
def test_unsupported_construct_is_named(name, args):
    with pytest.raises(tritile.CompileError, match=rf"T\.{name}.* not supported") as err:
        @T.prim_func
        def main(A: T.Tensor((64,), T.float32)):
            with T.Kernel(1, threads=128) as bx:
                op = getattr(T, name)
                op(*[A if x is None else x for x in args])
    assert "test_tilelang_language_unsupported.py" in str(err.value)

