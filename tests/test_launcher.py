"""tritile.runtime.launcher: the direct launch path against Triton's own, without a GPU.

The C launcher, the descriptor encoder and the stream lookup are stand-ins that record what
they are given; what is checked is the argument order Triton's C launcher expects, when a
TMA descriptor is encoded again, and when Triton's complete path takes over.
"""
from __future__ import annotations

import types

import pytest
import torch
from triton import knobs
from triton.experimental.gluon import language as gl

import tritile.language as T
from tritile.runtime.launcher import DescriptorSpec, DirectLaunch, TritonLaunch, kernel_launcher
from tritile.runtime.target import Target

LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
SPECS = [DescriptorSpec((64, 64), LAYOUT), DescriptorSpec((64, 128), LAYOUT)]
NAMES = ["A", "C"]


class FakeCompiled:
    function = 0xF00
    packed_metadata = (8, 1, 1024)

    def __init__(self, **metadata):
        self.metadata = types.SimpleNamespace(**metadata)
        self.launched = []

    def _init_handles(self):
        pass

    def __getitem__(self, grid):
        return lambda *args: self.launched.append((grid, args))


def direct(compiled=None):
    compiled = compiled or FakeCompiled(launch_cooperative_grid=False, launch_pdl=True)
    calls, encoded = [], []

    def encode(operand, index):
        encoded.append((operand[0].data_ptr(), index))
        return [("map", index), *operand[1], *operand[2]]

    launch = DirectLaunch(compiled, SPECS, NAMES, c_launch=lambda *args: calls.append(args), encode=encode,
                          current_stream=lambda: 0x57, fallback=TritonLaunch(compiled, SPECS, NAMES))
    return launch, calls, encoded, compiled


def operands(a, c):
    return ((a, a.shape, a.stride()), (c, (c.numel() // c.shape[-1], c.shape[-1]), (c.shape[-1], 1)))


def test_direct_launch_passes_tritons_c_launcher_arguments_in_order():
    launch, calls, _, _ = direct()
    a, c = torch.randn(64, 96), torch.randn(2, 64, 128)
    launch((3, 2, 1), (a, c), operands(a, c), (17,))
    assert calls == [(3, 2, 1, 0x57, 0xF00, False, True, None, None, (8, 1, 1024), None, None, None,
                      a.data_ptr(), c.data_ptr(), ("map", 0), 64, 96, 96, 1, ("map", 1), 128, 128, 128, 1, 17)]


def test_a_descriptor_is_encoded_once_per_address_and_geometry():
    launch, calls, encoded, _ = direct()
    a, c = torch.randn(64, 96), torch.randn(2, 64, 128)
    for _ in range(3):
        launch((1, 1, 1), (a, c), operands(a, c), ())
    assert len(calls) == 3 and len(encoded) == 2
    other = torch.randn(64, 96)  # another address: encoded again, the other descriptor reused
    launch((1, 1, 1), (other, c), operands(other, c), ())
    assert encoded[2:] == [(other.data_ptr(), 0)]
    narrower = a[:32]  # same address, another shape
    launch((1, 1, 1), (narrower, c), operands(narrower, c), ())
    assert encoded[3:] == [(a.data_ptr(), 0)] and calls[-1][15:19] == (("map", 0), 32, 96, 96)


def test_a_misaligned_tensor_is_named_before_any_launch():
    launch, calls, _, compiled = direct()
    storage = torch.randn(64 * 96 + 1)
    a, c = storage[1:].view(64, 96), torch.randn(2, 64, 128)  # 4 bytes past an aligned start
    for path in (launch, launch._fallback):
        with pytest.raises(ValueError, match="argument A must be 16-byte aligned"):
            path((1, 1, 1), (a, c), operands(a, c), ())
    assert calls == [] and compiled.launched == []


def test_launch_hooks_send_the_call_through_tritons_path():
    launch, calls, _, compiled = direct()
    a, c = torch.randn(64, 96), torch.randn(2, 64, 128)
    seen = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        launch((2, 1, 1), (a, c), operands(a, c), (5,))
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    assert calls == []
    (grid, args), = compiled.launched
    assert grid == (2, 1, 1) and args[:2] == (a, c) and args[-1] == 5
    descriptors = args[2:4]
    assert [d.block_shape for d in descriptors] == [[64, 64], [64, 128]]
    assert descriptors[1].shape == [128, 128] and descriptors[1].strides == [128, 1]
    assert all(d.padding == "zero" for d in descriptors)


@pytest.mark.parametrize("metadata", [dict(global_scratch_size=256), dict(profile_scratch_size=64),
                                      dict(tensordesc_meta=None)])
def test_kernels_the_direct_path_cannot_run_take_tritons(metadata):
    compiled = FakeCompiled(**{"global_scratch_size": 0, "profile_scratch_size": 0, "tensordesc_meta": [{}, {}],
                               **metadata})
    assert isinstance(kernel_launcher(compiled, SPECS, NAMES), TritonLaunch)


@pytest.mark.usefixtures("gluon_backend")  # TMA descriptors are the Gluon backend's
def test_compiled_kernels_carry_their_descriptor_specs():
    from examples.flash_attention import flashattn, tile_config
    from tritile.runtime.kernel import JITKernel

    kernel = JITKernel(flashattn.fn(1, 2, 256, 256, 64, False, **tile_config("cuda")), target=Target("cuda", 90))
    gluon = kernel._codegen(kernel.target)
    assert gluon.descriptors and all(isinstance(d, DescriptorSpec) for d in gluon.descriptors)
    q, k, v, out = (torch.randn(1, 2, 256, 64, dtype=torch.float16) for _ in range(4))
    launches = []
    gluon._host_launch(lambda *launch: launches.append(launch), q, k, v, out)
    (_, _, tma_operands, _), = launches
    assert len(tma_operands) == len(gluon.descriptors)
    for (tensor, shape, _), spec in zip(tma_operands, gluon.descriptors):
        assert shape[-1] == tensor.shape[-1] and spec.block_shape[-1] <= shape[-1]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_a_launch_goes_to_the_current_stream_and_into_cuda_graphs(backend):
    """A launch reads the current stream at every call: a side stream's work orders after it,
    and a graph capture records the launch (a launch on another stream would fail the
    capture).  Both backends take the direct path, their TMA descriptors passed by value
    (the triton.language backend's host TensorDescriptors on sm_90 / sm_100)."""
    from examples.gemm import matmul, tile_config

    kernel = matmul.compile(M=256, N=256, K=256, dtype=T.float16, backend=backend,
                            **tile_config("cuda", 256, 256, 256))
    a, b = (torch.randn(256, 256, device="cuda", dtype=torch.float16) for _ in range(2))
    kernel(a, b)
    assert isinstance(kernel._device_kernel._launcher, DirectLaunch)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = kernel(a, b)
    side.synchronize()
    torch.testing.assert_close(out.float(), a.float() @ b.float(), rtol=1e-2, atol=1e-1)

    graph = torch.cuda.CUDAGraph()
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):
        kernel(a, b)  # warm on the capture stream
        with torch.cuda.graph(graph, stream=capture):
            captured = kernel(a, b)
    torch.cuda.current_stream().wait_stream(capture)
    for _ in range(2):  # fresh inputs in the captured buffers
        a.copy_(torch.randn_like(a))
        b.copy_(torch.randn_like(b))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(captured.float(), a.float() @ b.float(), rtol=1e-2, atol=1e-1)
