"""TileLang's `T.sync_grid()` (a barrier across every block of the grid; deepseek_mla/
example_mla_decode_persistent.py): at the kernel body's own level, with no on-chip buffer live
across it, tritile splits the kernel there into consecutive kernels of the same grid and block
variables (tritile/frontend/grid_sync.py).  A two-phase reduction against torch on tritile's
interpreter and on Triton's interpreter of the triton.language kernel, sm_90 PTX of both backends,
and the CompileErrors at the user's line."""
import importlib.util

import pytest
import torch

import tritile
import tritile.language as T
from tritile.errors import CompileError

BACKENDS = ["auto", "triton"]  # on CPU tensors: tritile's interpreter / Triton's interpreter


def two_phase(blocks, block, threads=64):
    """Phase 1: block b sums its chunk of X into Partial[b] (and keeps a row of X in a fragment it
    overwrites after the sync); grid barrier; phase 2: block b writes Out[b, :] = X's chunk b
    scaled by the total of every block's partial sum, plus its own index `base` (a name bound
    before the sync to an expression of the block index, recomputed after it)."""

    @T.prim_func
    def main(X: T.Tensor((blocks, block), T.float32), Partial: T.Tensor((blocks,), T.float32),
             Out: T.Tensor((blocks, block), T.float32), scale: T.float32):
        with T.Kernel(blocks, threads=threads) as b:
            row = T.alloc_fragment((block,), T.float32)
            part = T.alloc_fragment((1,), T.float32)
            total = T.alloc_var(T.float32)
            base = b * 2 + 1
            T.copy(X[b, :], row)
            T.reduce_sum(row, part, dim=0)
            Partial[b] = part[0] * scale
            T.sync_grid()
            total = 0.0
            for k in T.serial(blocks):
                total += Partial[k]
            T.copy(X[b, :], row)
            for i in T.Parallel(block):
                Out[b, i] = row[i] * total + base

    return main


def two_phase_workspace(blocks, block):
    """The partial sums in a `T.alloc_global` workspace, their running sums in another, two syncs;
    the last kernel's result an output the runtime allocates."""

    @T.prim_func
    def main(X: T.Tensor((blocks, block), T.float32), Out: T.Tensor((blocks,), T.float32)):
        partial = T.alloc_global((blocks,), T.float32)
        prefix = T.alloc_global((blocks,), T.float32)
        with T.Kernel(blocks, threads=32) as b:
            s = T.alloc_fragment((block,), T.float32)
            part = T.alloc_fragment((1,), T.float32)
            run = T.alloc_var(T.float32, init=0.0)  # used after the first sync only: allocated again there
            T.copy(X[b, :], s)
            T.reduce_sum(s, part, dim=0)
            partial[b] = part[0]
            T.sync_grid()
            for k in T.serial(b + 1):
                run += partial[k]
            prefix[b] = run
            T.sync_grid()
            Out[b] = prefix[blocks - 1 - b] - partial[b]

    return main


def reference(X, scale):
    partial = X.sum(1) * scale
    total = partial.sum()
    base = torch.arange(X.shape[0], dtype=torch.float32) * 2 + 1
    return partial, X * total + base[:, None]


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_phase_reduction_across_the_grid(backend):
    torch.manual_seed(0)
    blocks, block = 6, 32
    X = torch.randn(blocks, block)
    Partial = torch.zeros(blocks)
    Out = torch.zeros(blocks, block)
    kernel = tritile.compile(two_phase(blocks, block), backend=backend)
    kernel(X, Partial, Out, 0.5)
    partial, out = reference(X, 0.5)
    torch.testing.assert_close(Partial, partial)
    torch.testing.assert_close(Out, out, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_syncs_through_workspaces(backend):
    torch.manual_seed(1)
    blocks, block = 5, 16
    X = torch.randn(blocks, block)
    kernel = tritile.compile(two_phase_workspace(blocks, block), out_idx=[1], backend=backend)
    out = kernel(X)
    partial = X.sum(1)
    prefix = partial.cumsum(0)
    torch.testing.assert_close(out, prefix.flip(0) - partial, rtol=1e-4, atol=1e-4)


def test_the_kernel_is_split_at_the_sync():
    func = tritile.compile(two_phase(4, 32), backend="triton").get_source("tile")
    assert func.count("with T.Kernel(") == 2
    ptx = tritile.compile(two_phase_workspace(4, 16), out_idx=[1], target="cuda:90").get_source("ptx")
    assert ptx.count(".entry ") == 3


def test_sync_grid_compiles_for_hopper():
    for func, out_idx in ((two_phase(8, 64), None), (two_phase_workspace(8, 32), [1])):
        for backend in ("gluon", "triton"):
            ptx = tritile.compile(func, out_idx=out_idx, target="cuda:90", backend=backend).get_source("ptx")
            assert ".target sm_90" in ptx, backend
            assert ptx.count(".entry ") >= 2, backend


def _load(tmp_path, body):
    src = f'''import tritile.language as T


def make():
    @T.prim_func
    def main(A: T.Tensor((4, 32), T.float32), B: T.Tensor((4, 32), T.float32)):
        with T.Kernel(4, threads=32) as b:
            f = T.alloc_fragment((32,), T.float32)
            v = T.alloc_var(T.float32)
{body}
    return main
'''
    path = tmp_path / "kernel_src.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("kernel_src", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make, src.splitlines()


_IN_LOOP = """            for k in T.serial(2):
                T.sync_grid()
"""
_IN_BRANCH = """            if b > 0:
                T.sync_grid()
"""
_IN_PARALLEL = """            for i in T.Parallel(32):
                T.sync_grid()
"""
_FRAGMENT_LIVE = """            T.copy(A[b, :], f)
            T.sync_grid()
            T.copy(f, B[b, :])
"""
_VAR_LIVE = """            v = A[b, 0]
            T.sync_grid()
            B[b, 0] = v
"""
_PARTLY_OVERWRITTEN = """            T.copy(A[b, :], f)
            T.sync_grid()
            T.fill(f[0:16], 0.0)
            T.copy(f, B[b, :])
"""
_NAME_FROM_MEMORY = """            x = A[b, 0] * 2.0
            T.sync_grid()
            B[b, 0] = x
"""


@pytest.mark.parametrize("body, line, message", [
    (_IN_LOOP, "T.sync_grid()", "inside a loop, an `if`, T.Parallel"),
    (_IN_BRANCH, "T.sync_grid()", "inside a loop, an `if`, T.Parallel"),
    (_IN_PARALLEL, "T.sync_grid()", "inside a loop, an `if`, T.Parallel"),
    (_FRAGMENT_LIVE, "T.copy(f, B[b, :])", r"fragment buffer f \(allocated at line 8\) is written before "
                                             r"T.sync_grid\(\) at line 11"),
    (_VAR_LIVE, "B[b, 0] = v", r"var buffer v \(allocated at line 9\) is written before T.sync_grid\(\) at line 11"),
    (_PARTLY_OVERWRITTEN, "T.fill(f[0:16], 0.0)", "fragment buffer f"),
    (_NAME_FROM_MEMORY, "B[b, 0] = x", r"'x' \(bound at line 10 to a value read from memory\) is read after "
                                      r"T.sync_grid\(\) at line 11"),
])
def test_what_is_not_a_kernel_boundary_is_a_compile_error(tmp_path, body, line, message):
    make, lines = _load(tmp_path, body)
    with pytest.raises(CompileError, match=message) as info:
        tritile.compile(make(), backend="triton")
    assert "kernel_src.py" in str(info.value)
    assert str(info.value).splitlines()[-1].strip() == line


def test_a_buffer_wholly_overwritten_after_the_sync_is_not_live(tmp_path):
    make, _ = _load(tmp_path, """            T.copy(A[b, :], f)
            v = 1.0
            T.copy(f, B[b, :])
            T.sync_grid()
            T.fill(f, 2.0)
            v = 3.0
            for i in T.Parallel(32):
                B[b, i] = B[b, i] + f[i] + v
""")
    A = torch.randn(4, 32)
    B = torch.zeros(4, 32)
    tritile.compile(make(), backend="triton")(A, B)
    torch.testing.assert_close(B, A + 5.0)


@T.macro
def _grid_barrier():
    T.sync_grid()


def reverse_after_increment(n):
    """Syncs first, last, two in a row and one in a macro: the pieces that do nothing launch no
    kernel."""

    @T.prim_func
    def main(A: T.Tensor((n,), T.float32), B: T.Tensor((n,), T.float32)):
        with T.Kernel(n, threads=32) as b:
            T.sync_grid()
            A[b] = A[b] + 1.0
            _grid_barrier()
            T.sync_grid()
            B[b] = A[n - 1 - b]
            T.sync_grid()

    return main


@pytest.mark.parametrize("backend", BACKENDS)
def test_syncs_in_a_macro_first_last_and_in_a_row(backend):
    kernel = tritile.compile(reverse_after_increment(6), backend=backend)
    assert kernel.get_source("tile").count("with T.Kernel(") == 2
    A = torch.randn(6)
    B = torch.zeros(6)
    expected = A + 1.0
    kernel(A, B)
    torch.testing.assert_close(A, expected)
    torch.testing.assert_close(B, expected.flip(0))
