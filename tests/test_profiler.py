"""`kernel.get_profiler()`: TileLang's way of checking and timing a kernel against a reference."""
import pytest
import torch

import tritile
import tritile.language as T


@tritile.jit(out_idx=[-1])
def rms_norm(M, N, block_M):
    @T.prim_func
    def main(A: T.Tensor((M, N), "float"), B: T.Tensor((M, N), "float")):
        with T.Kernel(T.ceildiv(M, block_M), threads=128) as bx:
            A_local = T.alloc_fragment((block_M, N), "float")
            A_squared = T.alloc_fragment((block_M, N), "float")
            A_powsum = T.alloc_fragment((block_M,), "float")
            T.copy(A[bx * block_M:(bx + 1) * block_M, :], A_local)
            for i, j in T.Parallel(block_M, N):
                A_squared[i, j] = A_local[i, j] * A_local[i, j]
            T.reduce_sum(A_squared, A_powsum, dim=1)
            for i in T.Parallel(block_M):
                A_powsum[i] = T.rsqrt(A_powsum[i] / N + 1e-12)
            for i, j in T.Parallel(block_M, N):
                A_local[i, j] *= A_powsum[i]
            T.copy(A_local, B[bx * block_M:(bx + 1) * block_M, :])

    return main


def rms_reference(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-12)


def test_assert_allclose_accepts_a_correct_kernel_and_rejects_a_wrong_reference():
    profiler = rms_norm(32, 128, 4).get_profiler()
    profiler.assert_allclose(rms_reference, rtol=1e-4, atol=1e-4)
    with pytest.raises(AssertionError, match="mismatch"):
        profiler.assert_allclose(lambda x: 2 * rms_reference(x), rtol=1e-4, atol=1e-4)


def test_supply_types_and_do_bench():
    kernel = rms_norm(16, 64, 4)
    profiler = kernel.get_profiler(tritile.TensorSupplyType.Uniform)
    (x,) = profiler._inputs()
    # TileLang's meanings: Uniform in [-1, 1], Integer in {-2..2}, Auto uniform for half/float
    assert x.shape == (16, 64) and x.dtype == torch.float32 and -1 <= x.min() < 0 < x.max() <= 1
    torch.testing.assert_close(profiler.run_once(input_tensors=[x]), rms_reference(x), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(profiler.run_once(rms_reference, [x]), rms_reference(x))  # TileLang's func=
    assert kernel.run_once().shape == (16, 64)  # TileLang's JITKernel.run_once: the kernel on supplied inputs
    assert profiler.do_bench(warmup=1, rep=1) > 0
    (auto,) = kernel.get_profiler()._inputs()
    assert -1 <= auto.min() < 0 < auto.max() <= 1 and auto.unique().numel() > 5
    (integers,) = kernel.get_profiler(tritile.TensorSupplyType.Integer)._inputs()
    assert set(integers.unique().tolist()) <= {-2.0, -1.0, 0.0, 1.0, 2.0}


def test_profiler_func_is_the_kernel_called_on_the_inputs():
    # TileLang's examples/deepseek_mla/example_mla_decode_paged.py: `profiler.func(*inputs)`
    kernel = rms_norm(16, 64, 4)
    profiler = kernel.get_profiler(tritile.TensorSupplyType.Randn)
    x = torch.randn(16, 64)
    assert profiler.func is kernel
    torch.testing.assert_close(profiler.func(x), rms_reference(x), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(profiler(x), rms_reference(x), rtol=1e-4, atol=1e-4)  # TileLang's __call__
