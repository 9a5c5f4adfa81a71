"""Where a warm tritile call's host time goes on a GPU machine (bench/host_overhead.py times the
CPU-side pieces without a GPU; this one times the real launch path, piece by piece).

For the 128^3 fp16 GEMM of examples/gemm.py (the kernel bench_h100.py's launch overhead uses),
µs per call, best of 5 x N calls, each piece with everything before it already done:
* the whole call `kernel(a, b)`;
* `GluonKernel.launch_bound` (alignment check, the generated `tritile_launch`, the launcher);
* tritile's `DirectLaunch` alone (Triton's C launcher, descriptors remembered);
* tritile's `TritonLaunch` (`compiled[grid](...)` with host TensorDescriptors built per call:
  the path every call took before the direct one);
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

    from tritile.runtime.launcher import DirectLaunch, TritonLaunch, host_descriptor

    kernel = build_matmul_kernel(128, 128, 128)
    a, b = (torch.randn(128, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    kernel(a, b)
    gluon = kernel._device_kernel
    tensors, dims = kernel._bind((a, b))[:2]
    captured = []
    gluon._host_launch(lambda *launch: captured.append(launch), *tensors)
    grid, kernel_tensors, tma_operands, dim_args = captured[0]
    compiled = gluon.compiled
    triton_launch = TritonLaunch(compiled, gluon.descriptors, gluon._launcher.names)
    device = triton.runtime.driver.active.get_current_device()
    stream = triton.runtime.driver.active.get_current_stream(device)
    host_descriptors = [host_descriptor(op, spec) for op, spec in zip(tma_operands, gluon.descriptors)]
    rows = {
        "kernel(a, b)": lambda: kernel(a, b),
        "GluonKernel.launch_bound (alignment, tritile_launch, launcher)": lambda: gluon.launch_bound(tensors, dims),
        f"launcher alone ({type(gluon._launcher).__name__})":
            lambda: gluon._launcher(grid, kernel_tensors, tma_operands, dim_args),
        "TritonLaunch: compiled[grid](...), host descriptors built per call":
            lambda: triton_launch(grid, kernel_tensors, tma_operands, dim_args),
        "compiled.run(...), stream, metadata and host descriptors prebuilt": lambda: compiled.run(
            grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, None, None, None,
            *kernel_tensors, *host_descriptors, *dim_args),
    }
    launcher = gluon._launcher
    if isinstance(launcher, DirectLaunch):  # Triton's C launcher alone, two ways of passing tensors
        expanded = [x for index, op in enumerate(tma_operands) for x in launcher._encode(op, index)]
        head = (grid[0], grid[1], grid[2], stream, compiled.function, *launcher._flags, None, None,
                compiled.packed_metadata, None, None, None)
        pointers = [t.data_ptr() for t in kernel_tensors]
        rows["C launcher, tensors as objects (a cuPointerGetAttribute each)"] = lambda: launcher._c_launch(
            *head, *kernel_tensors, *expanded, *dim_args)
        rows["C launcher, raw addresses"] = lambda: launcher._c_launch(*head, *pointers, *expanded, *dim_args)
    meta = compiled.metadata.tensordesc_meta[0] if getattr(compiled.metadata, "tensordesc_meta", None) else None
    if meta is not None:
        desc = host_descriptors[0]
        rows["one fill_tma_descriptor"] = lambda: triton.runtime.driver.active.utils.fill_tma_descriptor(
            desc.base.data_ptr(), meta["swizzle"], meta["elem_size"], TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]],
            meta["block_size"], desc.shape, desc.strides, 0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"µs per call, 128^3 fp16 GEMM, {len(tma_operands)} TMA descriptors, "
          f"direct path: {isinstance(gluon._launcher, DirectLaunch)}")
    for label, fn in rows.items():
        print(f"{per_call_us(fn):8.2f}  {label}", flush=True)


if __name__ == "__main__":
    main()
