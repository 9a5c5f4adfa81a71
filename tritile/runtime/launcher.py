"""Launching a compiled kernel (either backend's, on NVIDIA) from its host arguments.

Contract: `kernel_launcher(compiled, descriptors, names)` returns `launch(grid, tensors,
tma_operands, dims)`, which runs Triton `CompiledKernel` `compiled` on the current CUDA stream
of the current device, exactly as `compiled[grid](*tensors, *host_descriptors, *dims)` would:
* `tensors` are the kernel's global tensors in parameter order (`names`), all CUDA tensors;
  one that is not 16-byte aligned, as the kernel was compiled to assume, raises ValueError
  naming it, before anything is launched;
* `tma_operands` holds, per TMA descriptor argument in the kernel's order, `(tensor, shape,
  strides)` of the (possibly rows-view) tensor it addresses; `descriptors` holds each
  one's `DescriptorSpec` (its block shape, and the shared layout of a Gluon descriptor;
  a triton.language kernel's descriptors take the layout Triton chose, None here);
* `dims` are the runtime dims.

A warm call takes the direct path (`DirectLaunch`): Triton's C launcher for the kernel's
signature, called with the stream and metadata looked up once, and each TMA descriptor
(`cuTensorMapEncodeTiled`) encoded once per (pointer, shape, strides) and then reused.  A
descriptor encodes only the address and geometry, never the contents, so reusing it for a new
tensor at the same address with the same geometry is exact.  This skips Triton's per-call
Python layers (device and stream lookup, launch metadata, scratch and descriptor wrappers),
about 4.5 + 3.3 us of a 26.5 us call on the H100 host (bench/results/host_launch_pieces_h100.txt).
Triton's own path (`TritonLaunch`) runs instead whenever the direct one would differ: launch
hooks installed (a profiler), a kernel needing global or profile scratch memory, or descriptors
Triton did not lower to `nvTmaDesc`.
"""
from __future__ import annotations

from dataclasses import dataclass

from triton import knobs

_DESCRIPTORS_REMEMBERED = 64  # per descriptor argument; past it the memo starts over


@dataclass(frozen=True)
class DescriptorSpec:
    """What a host `TensorDescriptor` needs besides its tensor: the TMA box and shared layout."""

    block_shape: tuple
    layout: object = None  # a gluon NVMMASharedLayout; None for a triton.language descriptor


def host_descriptor(operand, spec: DescriptorSpec):
    """Triton's host `TensorDescriptor` for one `(tensor, shape, strides)` TMA operand: Gluon's
    (with its shared layout) or, without a layout, `triton.tools`' (the layout is the compiled
    kernel's: Triton's launcher encodes it from the kernel's `tensordesc_meta`).  Out-of-bounds
    elements read 0."""
    tensor, shape, strides = operand
    if spec.layout is None:
        from triton.tools.tensor_descriptor import TensorDescriptor

        return TensorDescriptor(tensor, list(shape), list(strides), list(spec.block_shape), padding="zero")
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(tensor, list(shape), list(strides), list(spec.block_shape), spec.layout,
                            padding="zero")


def addresses(tensors, names) -> list:
    """The tensors' device addresses, each checked 16-byte aligned."""
    pointers = [t.data_ptr() for t in tensors]
    for pointer, name in zip(pointers, names):
        if pointer % 16:
            raise ValueError(f"argument {name} must be 16-byte aligned")
    return pointers


class TritonLaunch:
    """`compiled[grid](...)` with freshly built host descriptors: Triton's complete path."""

    def __init__(self, compiled, descriptors, names):
        self.compiled = compiled
        self.descriptors = list(descriptors)
        self.names = list(names)

    def __call__(self, grid, tensors, tma_operands, dims):
        addresses(tensors, self.names)
        descriptors = [host_descriptor(op, spec) for op, spec in zip(tma_operands, self.descriptors)]
        self.compiled[grid](*tensors, *descriptors, *dims)


class DirectLaunch:
    """Triton's C launcher called directly; see the module docstring for when it applies.

    `c_launch` is the C entry point (`launch(gridX, gridY, gridZ, stream, function, cooperative,
    pdl, global_scratch, profile_scratch, packed_metadata, launch_metadata, enter_hook, exit_hook,
    *args)`), `encode(operand, index)` returns descriptor `index`'s expanded launcher arguments
    `[tensor_map, *shape, *strides]` and `current_stream()` the raw stream handle; tests pass
    stand-ins for all three."""

    def __init__(self, compiled, descriptors, names, c_launch, encode, current_stream, fallback):
        self.compiled = compiled
        self.names = list(names)
        self._c_launch = c_launch
        self._encode = encode
        self._current_stream = current_stream
        self._fallback = fallback
        self._encoded = [{} for _ in descriptors]  # per descriptor: (ptr, shape, strides) -> expansion
        metadata = compiled.metadata
        self._flags = (bool(getattr(metadata, "launch_cooperative_grid", False)),
                       bool(getattr(metadata, "launch_pdl", False)))

    def __call__(self, grid, tensors, tma_operands, dims):
        if _launch_hooks_installed():
            return self._fallback(grid, tensors, tma_operands, dims)
        # raw addresses: Triton's launcher then skips a cuPointerGetAttribute per tensor, a
        # check that the caller's (CUDA tensors only) already makes
        pointers = addresses(tensors, self.names)
        expanded = []
        for index, operand in enumerate(tma_operands):
            tensor, shape, strides = operand
            memo = self._encoded[index]
            key = (tensor.data_ptr(), shape, strides)
            arguments = memo.get(key)
            if arguments is None:
                if len(memo) >= _DESCRIPTORS_REMEMBERED:
                    memo.clear()
                arguments = memo[key] = self._encode(operand, index)
            expanded += arguments
        compiled = self.compiled
        self._c_launch(grid[0], grid[1], grid[2], self._current_stream(), compiled.function, *self._flags,
                       None, None, compiled.packed_metadata, None, None, None, *pointers, *expanded, *dims)


def _launch_hooks_installed() -> bool:
    for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):  # Triton 3.6: an empty HookChain
            return True
    return False


def kernel_launcher(compiled, descriptors, names):
    """The launch function for `compiled` (loads it on the current device first)."""
    descriptors = list(descriptors)
    fallback = TritonLaunch(compiled, descriptors, names)
    compiled._init_handles()
    metadata = compiled.metadata
    tensor_map_meta = getattr(metadata, "tensordesc_meta", None)
    if (getattr(metadata, "global_scratch_size", 0) or getattr(metadata, "profile_scratch_size", 0)
            or (descriptors and not tensor_map_meta)):
        return fallback
    try:
        c_launch, stream_of, device_of = _triton_c_launcher(compiled)
    except (ImportError, AttributeError):  # not Triton 3.6's NVIDIA driver: its own path
        return fallback
    from triton.backends.nvidia.driver import make_tensordesc_arg

    def encode(operand, index):
        return make_tensordesc_arg(host_descriptor(operand, descriptors[index]), tensor_map_meta[index])

    return DirectLaunch(compiled, descriptors, names, c_launch, encode, lambda: stream_of(device_of()), fallback)


def _triton_c_launcher(compiled):
    """Triton's compiled C launcher for `compiled`'s signature (its on-disk cache makes this a
    load, not a build: Triton built the same source when it loaded the kernel), and the
    driver's current-device and current-stream functions."""
    import triton
    from triton.backends.nvidia import driver as nvidia

    src = compiled.src
    arg_names = src.fn.arg_names

    def arg_index(key):
        return (arg_names.index(key),) if isinstance(key, str) else key

    constants = {arg_index(key): value for key, value in getattr(src, "constants", {}).items()}
    source = nvidia.make_launcher(constants, dict(src.signature), compiled.metadata.tensordesc_meta)
    module = nvidia.compile_module_from_src(src=source, name="__triton_launcher",
                                            library_dirs=nvidia.library_dirs(),
                                            include_dirs=nvidia.include_dirs, libraries=nvidia.libraries)
    driver = triton.runtime.driver.active
    return module.launch, driver.get_current_stream, driver.get_current_device
