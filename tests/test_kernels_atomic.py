"""Split-K GEMM with `T.atomic_add`, TileLang's examples/gemm_splitk style.

The grid's third dimension splits K; every split accumulates its partial product into C with an
atomic add: the tile form (`T.atomic_add(C[region or head address], C_shared)`) and the scalar
form (`T.atomic_add(C[i, j], value)` inside `T.Parallel`, guarded for a padded shape).  C starts
from random values, so the kernel must add to it, not overwrite it.  On the `device` fixture's
tensors (CPU: the reference interpreter; CUDA: the Gluon kernel).
"""
import pytest
import torch

import tritile
from kernels import splitk_gemm

matmul_splitk = tritile.jit(splitk_gemm)


SPLITK_CASES = [
    ("tile_region", 128, 128),
    ("tile_head", 128, 128),
    ("scalar", 128, 128),
    ("scalar", 200, 136),  # padded: the guard keeps edge tiles inside C
    ("scalar_unguarded", 200, 136),  # padded, no guard: the adds past the edges must be dropped
]
K, SPLIT_K = 128, 2


@pytest.mark.parametrize("form, M, N", SPLITK_CASES)
def test_splitk_atomic_add(form, M, N, device, assert_close):
    kernel = matmul_splitk(M, N, K, 64, 64, 32, SPLIT_K, form)
    a = torch.randn(M, K, dtype=torch.float16, device=device)
    b = torch.randn(K, N, dtype=torch.float16, device=device)
    storage = torch.randn(M + 64, N, device=device)  # C, then rows no kernel may write
    c, after = storage[:M], storage[M:].clone()
    expected = c + a.float() @ b.float()
    kernel(a, b, c)
    assert_close(c, expected)
    assert torch.equal(storage[M:], after)


# The specialisations tests/test_kernels_compile.py compiles for sm_90 and sm_80.
COMPILE_CASES = {f"matmul_splitk-{form}-{M}x{N}": (lambda form=form, M=M, N=N: matmul_splitk(
    M, N, K, 64, 64, 32, SPLIT_K, form)) for form, M, N in SPLITK_CASES}
