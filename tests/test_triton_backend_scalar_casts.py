"""Casts of loop counters: on the triton.language backend under Triton's interpreter a counter of
`range` / `tl.range` / `tl.static_range` is a Python int, which has no `.to`, so a cast of a
scalar is emitted on a 0-d tensor (`tl.full([], k, tl.int32).to(...)`; compiled, the same IR
as `k.to(...)`); compiled, a `T.unroll` counter is a Python int on both backends (Gluon:
`gl.to_tensor(k).to(...)`).  `T.cast(k, ...)` of serial, pipelined and unrolled loops' counters
(to float32, float16, int64, a comparison to float32) on Triton's interpreter and tritile's
against torch, and sm_90 PTX of both backends."""
import pytest
import torch

import tritile
import tritile.language as T

STEPS = 5


def counter_casts(n, loop):
    @T.prim_func
    def main(X: T.Tensor((n,), T.float32), Y: T.Tensor((4, n), T.float32)):
        with T.Kernel(1, threads=128):
            x = T.alloc_fragment((n,), T.float32)
            acc = T.alloc_fragment((4, n), T.float32)
            T.copy(X, x)
            T.clear(acc)
            for k in (T.Pipelined(STEPS, num_stages=2) if loop == "pipelined" else
                      T.unroll(STEPS) if loop == "unroll" else T.serial(STEPS)):
                for i in T.Parallel(n):
                    acc[0, i] += T.cast(k, "float32") * x[i]
                    acc[1, i] += T.cast(T.cast(k * 3 + 1, "float16"), "float32") * x[i]
                    acc[2, i] += T.cast(T.cast(k, "int64") * 1000000000 // 1000000000, "float32")
                    acc[3, i] += T.cast(k == 2, "float32") * x[i]
            T.copy(acc, Y)

    return main


def reference(x):
    k = torch.arange(STEPS, dtype=torch.float32, device=x.device)
    return torch.stack([k.sum() * x, (3 * k + 1).sum() * x, k.sum().expand_as(x), x])


LOOPS = ["serial", "pipelined", "unroll"]


@pytest.mark.parametrize("loop", LOOPS)
def test_casts_of_loop_counters(loop, device, assert_close):
    x = torch.randn(32, generator=torch.Generator().manual_seed(0)).to(device)
    y = torch.empty(4, 32, device=device)
    tritile.compile(counter_casts(32, loop))(x, y)
    assert_close(y, reference(x))


@pytest.mark.parametrize("loop", LOOPS)
def test_casts_of_loop_counters_on_tritons_interpreter(loop, assert_close):
    x = torch.randn(32, generator=torch.Generator().manual_seed(1))
    y = torch.empty(4, 32)
    tritile.compile(counter_casts(32, loop), backend="triton")(x, y)  # CPU tensors: Triton's interpreter
    assert_close(y, reference(x))


@pytest.mark.parametrize("backend", ["gluon", "triton"])
@pytest.mark.parametrize("loop", LOOPS)
def test_casts_of_loop_counters_compile_for_hopper(loop, backend):
    """Compiled, a `T.unroll` counter is a Python int too (a `static_range` constexpr)."""
    kernel = tritile.compile(counter_casts(32, loop), target="cuda:90", backend=backend)
    assert ".target sm_90" in kernel.get_source("ptx")
