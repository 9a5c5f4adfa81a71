"""Where a warm tritile call's host time goes on a GPU machine (bench/host_overhead.py times the
CPU-side pieces without a GPU; this one times the real launch path, piece by piece).

For the 128^3 fp16 GEMM of examples/gemm.py (the kernel bench_h100.py's launch overhead uses),
µs per call, best of 5 x N calls, each piece with everything before it already done:
* the whole call `kernel(a, b)`;
* `GluonKernel.launch` (its checks, the generated `tritile_launch`: host TensorDescriptors and
  `compiled[grid](...)`);
* `compiled[grid](...)` with the descriptors built once;
* Triton's `CudaLauncher` (`compiled.run`) with the stream and metadata looked up once;
* one `fill_tma_descriptor` (the cuTensorMapEncodeTiled call Triton makes per descriptor per
  launch).
Run: PYTHONPATH=$PWD python bench/host_launch_pieces.py
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from examples.gemm import build_matmul_kernel  # noqa: E402


def per_call_us(fn, n=3000) -> float:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best


def main():
    import triton
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST

    kernel = build_matmul_kernel(128, 128, 128)
    a, b = (torch.randn(128, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    kernel(a, b)
    gluon = kernel._device_kernel
    tensors, dims = kernel._bind((a, b))
    compiled = gluon.compiled
    captured = {}

    class Capture:  # records what tritile_launch passes to compiled[grid](...)
        def __getitem__(self, grid):
            def launch(*args):
                captured["grid"], captured["args"] = grid, args
            return launch

    gluon._host_launch(Capture(), *tensors)
    grid, args = captured["grid"], captured["args"]
    device = triton.runtime.driver.active.get_current_device()
    stream = triton.runtime.driver.active.get_current_stream(device)
    compiled._init_handles()
    meta = compiled.metadata.tensordesc_meta[0] if getattr(compiled.metadata, "tensordesc_meta", None) else None
    desc = next(x for x in args if hasattr(x, "block_shape"))
    rows = {
        "kernel(a, b)": lambda: kernel(a, b),
        "GluonKernel.launch (checks, descriptors, launch)": lambda: gluon.launch(tensors, dims),
        "compiled[grid](...), descriptors prebuilt": lambda: compiled[grid](*args),
        "compiled.run(...), stream and metadata prebuilt": lambda: compiled.run(
            grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, None, None, None, *args),
    }
    if meta is not None:
        rows["one fill_tma_descriptor"] = lambda: triton.runtime.driver.active.utils.fill_tma_descriptor(
            desc.base.data_ptr(), meta["swizzle"], meta["elem_size"], TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]],
            meta["block_size"], desc.shape, desc.strides, 0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"µs per call, 128^3 fp16 GEMM, {sum(hasattr(x, 'block_shape') for x in args)} TMA descriptors")
    for label, fn in rows.items():
        print(f"{per_call_us(fn):8.2f}  {label}", flush=True)


if __name__ == "__main__":
    main()
