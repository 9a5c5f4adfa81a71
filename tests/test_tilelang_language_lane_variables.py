"""Per-lane scalar variables inside `T.Parallel` (TileLang's examples/dsa_sparse_finetune/
indexer_bwd.py: `d_relu = T.alloc_var(accum_dtype)` then `if logits[i, j] > 0: d_relu = 1.0 else:
d_relu = 0.0` in the lane): each element has its own copy of a `T.alloc_var` or a plain name bound
in the lane.  The frontend keeps such a variable an SSA value: an assignment rebinds it, one under a
lane `if` is `T.if_then_else(cond, then, else)` after the branches.  The interpreter and Triton's
interpreter of the triton.language kernel against torch, sm_90 PTX of both backends, and the
CompileErrors (a read before any assignment, a loop-carried value)."""
import pytest
import torch

import tritile
import tritile.language as T
from tritile.errors import CompileError

BACKENDS = ["auto", "triton"]  # on CPU tensors: tritile's interpreter / Triton's interpreter
M, N = 16, 32


def relu_twice(declare):
    """The per-lane variable declared by `T.alloc_var` (declare="var"), `T.alloc_var` with an init
    ("init") or a plain name ("name"), reassigned, then reassigned under an `if`."""

    @T.prim_func
    def main(x: T.Tensor((M, N), T.float32), y: T.Tensor((M, N), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            for i, j in T.Parallel(M, N):
                if declare == "var":
                    v = T.alloc_var(T.float32)
                elif declare == "init":
                    v = T.alloc_var(T.float32, init=7.0)
                else:
                    v = x[i, j]
                v = x[i, j] * 2
                if x[i, j] < 0:
                    v = 0
                y[i, j] = v

    return main


def branches():
    """if/elif/else, nested ifs, an int variable (assignments cast to its dtype), `+=` in a branch,
    a branch with no assignment, names first bound in both branches, an init kept on a path."""

    @T.prim_func
    def main(x: T.Tensor((M, N), T.float32), w: T.Tensor((M, N), T.float32), y: T.Tensor((4, M, N), T.float32),
             c: T.Tensor((M, N), T.int32)):
        with T.Kernel(1, threads=128) as bx:
            for i, j in T.Parallel(M, N):
                a = T.alloc_var(T.float32)
                if x[i, j] < -0.5:
                    a = -1.0
                elif x[i, j] < 0.5:
                    a = x[i, j] * x[i, j]
                else:
                    a = 1.0
                b = x[i, j]
                if x[i, j] > 0:
                    if w[i, j] > 0:
                        b = x[i, j] * w[i, j]
                    else:
                        b += 10
                else:
                    b = w[i, j]
                if w[i, j] > 0:
                    t = w[i, j] + 1
                else:
                    t = w[i, j] - 1
                d = T.alloc_var(T.float32, init=5.0)
                if x[i, j] > 0:
                    d = d * x[i, j]
                elif w[i, j] > 0:
                    pass
                else:
                    d = w[i, j]
                k = T.alloc_var(T.int32)
                k = x[i, j] * 4
                if w[i, j] > 0:
                    k = k + 100
                y[0, i, j] = a
                y[1, i, j] = b
                y[2, i, j] = t
                y[3, i, j] = d
                c[i, j] = k

    return main


def relu_grad(block_I=32, heads=16):
    """indexer_bwd's d_relu: the per-lane variable in a store, the fragment it fills then reduced."""

    @T.prim_func
    def main(logits: T.Tensor((block_I, heads), T.float32), w: T.Tensor((heads,), T.float32),
             g: T.Tensor((block_I, heads), T.float32), s: T.Tensor((block_I,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            lg = T.alloc_fragment((block_I, heads), T.float32)
            w_shared = T.alloc_shared((heads,), T.float32)
            d = T.alloc_shared((block_I, heads), T.float32)
            d_frag = T.alloc_fragment((block_I, heads), T.float32)
            s_frag = T.alloc_fragment((block_I,), T.float32)
            T.copy(logits, lg)
            T.copy(w, w_shared)
            for i, j in T.Parallel(block_I, heads):
                d_relu = T.alloc_var(T.float32)
                if lg[i, j] > 0:
                    d_relu = 1.0
                else:
                    d_relu = 0.0
                d[i, j] = lg[i, j] * d_relu * w_shared[j]
            T.copy(d, d_frag)
            T.reduce_sum(d_frag, s_frag, dim=1)
            T.copy(d, g)
            T.copy(s_frag, s)

    return main


def branch_writes():
    """A branch that stores to memory, also to what the condition reads (the condition is the
    value it had at the `if`), and conditions that are the same for every lane (the block index:
    one branch runs for no lane) or true for no lane."""

    @T.prim_func
    def main(x: T.Tensor((M, N), T.float32), y: T.Tensor((2, M, N), T.float32), z: T.Tensor((2, M, N), T.float32)):
        with T.Kernel(2, threads=128) as bx:
            f = T.alloc_fragment((M, N), T.float32)
            T.copy(x, f)
            for i, j in T.Parallel(M, N):
                v = T.alloc_var(T.float32)
                if f[i, j] > 0:
                    f[i, j] = -f[i, j]
                    z[bx, i, j] = 1.0
                    v = f[i, j] * 3
                else:
                    v = f[i, j] + 2
                if bx > 0:
                    v = v * 10
                if f[i, j] > 100:
                    v = 0.0
                y[bx, i, j] = v + f[i, j]

    return main


def in_lane_loop(K=4):
    """A variable bound inside a serial loop in the lane and reassigned under an `if` there."""

    @T.prim_func
    def main(x: T.Tensor((M, K), T.float32), y: T.Tensor((M, K), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(M):
                for k in T.serial(K):
                    v = x[i, k]
                    if v < 0:
                        v = -v * k
                    y[i, k] = v

    return main


def _relu_twice_ref(x):
    return torch.where(x < 0, torch.zeros_like(x), x * 2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("declare", ["var", "init", "name"])
def test_per_lane_variable(backend, declare):
    torch.manual_seed(0)
    x = torch.randn(M, N)
    y = torch.full((M, N), 5.0)
    tritile.compile(relu_twice(declare), backend=backend)(x, y)
    torch.testing.assert_close(y, _relu_twice_ref(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_branches(backend):
    torch.manual_seed(1)
    x, w = torch.randn(M, N), torch.randn(M, N)
    y, c = torch.full((4, M, N), 3.0), torch.full((M, N), 3, dtype=torch.int32)
    tritile.compile(branches(), backend=backend)(x, w, y, c)
    a = torch.where(x < -0.5, -1.0, torch.where(x < 0.5, x * x, 1.0))
    b = torch.where(x > 0, torch.where(w > 0, x * w, x + 10), w)
    t = torch.where(w > 0, w + 1, w - 1)
    d = torch.where(x > 0, 5 * x, torch.where(w > 0, 5.0, w))
    k = (x * 4).to(torch.int32) + torch.where(w > 0, 100, 0).to(torch.int32)
    torch.testing.assert_close(y, torch.stack([a, b, t, d]))
    torch.testing.assert_close(c, k)


@pytest.mark.parametrize("backend", BACKENDS)
def test_relu_grad_store_and_reduction(backend):
    torch.manual_seed(2)
    logits, w = torch.randn(32, 16), torch.rand(16) + 0.5
    g, s = torch.full((32, 16), 3.0), torch.full((32,), 3.0)
    tritile.compile(relu_grad(), backend=backend)(logits, w, g, s)
    ref = logits * (logits > 0).float() * w
    torch.testing.assert_close(g, ref)
    torch.testing.assert_close(s, ref.sum(1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_branch_writes_and_uniform_conditions(backend):
    torch.manual_seed(3)
    x = torch.randn(M, N)
    y, z = torch.full((2, M, N), 5.0), torch.zeros(2, M, N)
    tritile.compile(branch_writes(), backend=backend)(x, y, z)
    f = -x.abs()
    v = torch.where(x > 0, -x * 3, x + 2)
    ref = torch.stack([v + f, v * 10 + f])
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(z, (x > 0).float().expand(2, M, N))


@pytest.mark.parametrize("backend", BACKENDS)
def test_variable_of_a_loop_in_the_lane(backend):
    torch.manual_seed(4)
    x = torch.randn(M, 4)
    y = torch.full((M, 4), 5.0)
    tritile.compile(in_lane_loop(), backend=backend)(x, y)
    k = torch.arange(4).float()
    torch.testing.assert_close(y, torch.where(x < 0, -x * k, x))


def test_lane_variables_compile_for_hopper():
    for func in (relu_twice("var"), relu_twice("name"), branches(), relu_grad(), branch_writes(), in_lane_loop()):
        for backend in ("gluon", "triton"):
            ptx = tritile.compile(func, target="cuda:90", backend=backend).get_source("ptx")
            assert ".target sm_90" in ptx, backend


def test_read_before_assignment_is_a_compile_error():
    def main(x: T.Tensor((M, N), T.float32), y: T.Tensor((M, N), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            for i, j in T.Parallel(M, N):
                v = T.alloc_var(T.float32)
                if x[i, j] > 0:
                    v = 1.0
                y[i, j] = v + x[i, j]  # assigned on one path: defined (TileLang's is undefined on the other)
                w = T.alloc_var(T.float32)
                y[i, j] = w + x[i, j]

    with pytest.raises(CompileError, match="read before it is assigned") as info:
        T.prim_func(main)
    assert "y[i, j] = w + x[i, j]" in str(info.value)


def test_loop_carried_lane_variable_is_a_compile_error():
    def main(x: T.Tensor((M, 4), T.float32), y: T.Tensor((M,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(M):
                acc = T.alloc_var(T.float32, init=0.0)
                for k in T.serial(4):
                    acc = acc + x[i, k]
                y[i] = acc

    with pytest.raises(CompileError, match="loop-carried per-lane value") as info:
        T.prim_func(main)
    assert "acc = acc + x[i, k]" in str(info.value)


def test_alloc_var_outside_parallel_is_a_variable():
    """Outside T.Parallel `T.alloc_var` is still one variable of the block (a loop carries it)."""

    @T.prim_func
    def main(x: T.Tensor((4,), T.float32), y: T.Tensor((1,), T.float32)):
        with T.Kernel(1, threads=128) as bx:
            acc = T.alloc_var(T.float32, init=0.0)
            for k in T.serial(4):
                if x[k] > 0:
                    acc = acc + x[k]
            y[0] = acc

    for backend in BACKENDS:
        x = torch.tensor([1.0, -2.0, 3.0, 0.5])
        y = torch.zeros(1)
        tritile.compile(main, backend=backend)(x, y)
        torch.testing.assert_close(y, torch.tensor([4.5]))
