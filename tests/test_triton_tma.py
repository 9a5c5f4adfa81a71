"""The triton.language backend's TMA tensor descriptors (tritile/codegen/triton/descriptors.py).

On sm_90 / sm_100 a global <-> on-chip `T.copy` whose tensor and tile TMA can take is a
descriptor load / store on a host `TensorDescriptor`; everything else, and every copy on sm_80
and AMD, stays a masked `tl.load` / `tl.store`.  Checked on CPU:

* the generated source, Triton's TTIR (`tt.descriptor_load` / `tt.descriptor_store`) and PTX
  (`cp.async.bulk.tensor`) per target, and each case TMA cannot take falling back;
* results: Triton's interpreter running the descriptor code (its TensorDescriptor model: zero
  fill on load, lanes past the tensor dropped on store) == tritile's interpreter == torch, on
  random inputs with edge tiles hanging past the tensor in every dim - the tensors views into
  larger buffers filled with NaN / sentinels, so a lane read or written past a dim shows;
* the launcher's inputs: row-major strides, a misaligned tensor named before the launch.

The `gpu` tests run the same programs on the GPU with both backends.
"""
import pytest
import torch

import kernels as K
import tritile
import tritile.language as T
from test_kernels_attention import flash_attention as FA

TMA_TARGETS = ["cuda:90", "cuda:100"]
BACKENDS = ["gluon", "triton"]


@pytest.fixture(autouse=True)
def default_backend(monkeypatch):
    """These tests name their backend: `TRITILE_BACKEND` does not choose for them."""
    monkeypatch.delenv("TRITILE_BACKEND", raising=False)


def kernel_body(kernel) -> str:
    """The generated triton.language kernel (after the module's helpers)."""
    return kernel.get_source("triton").split("@triton.jit\ndef main")[1]


@tritile.jit
def tile_copy(M, N, block_M, block_N, dtype="float16", col_offset=0):
    """B's tiles = A's tiles (B passed in: lanes outside the tiles keep what B held)."""
    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            tile = T.alloc_shared((block_M, block_N), dtype)
            T.copy(A[by * block_M, bx * block_N + col_offset], tile)
            T.copy(tile, B[by * block_M, bx * block_N + col_offset])

    return main


@tritile.jit
def column_sums(M, N, block_M, block_N, dtype="float32"):
    """Out[j] = sum_i A[i, j] over row tiles of `block_M` (a pipelined loop) and column tiles
    of `block_N`: an edge tile's lanes past M or N must read 0 and never be written."""
    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), Out: T.Tensor((1, N), "float32")):
        with T.Kernel(T.ceildiv(N, block_N), threads=128) as bx:
            tile = T.alloc_shared((block_M, block_N), dtype)
            acc = T.alloc_fragment((1, block_N), "float32")
            part = T.alloc_fragment((block_N,), "float32")
            T.clear(acc)
            for k in T.Pipelined(T.ceildiv(M, block_M), num_stages=2):
                T.copy(A[k * block_M, bx * block_N], tile)
                T.reduce_sum(tile, part, dim=0)
                for j in T.Parallel(block_N):
                    acc[0, j] += part[j]
            T.copy(acc, Out[0, bx * block_N])

    return main


@tritile.jit
def add_one_in_place(M, N, block):
    """A += 1 through a tile: A is read and written by the kernel."""
    @T.prim_func
    def main(A: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(M, block), threads=128) as bx:
            tile = T.alloc_fragment((block, N), "float32")
            T.copy(A[bx * block, 0], tile)
            for i, j in T.Parallel(block, N):
                tile[i, j] = tile[i, j] + 1.0
            T.copy(tile, A[bx * block, 0])

    return main


@tritile.jit
def column_copy(M, N, block):
    """B[:, j] = A[:, j]: tiles along the outer dim only (one element per row)."""
    @T.prim_func
    def main(A: T.Tensor((M, N), "float16"), B: T.Tensor((M, N), "float16")):
        with T.Kernel(N, T.ceildiv(M, block), threads=128) as (bx, by):
            column = T.alloc_fragment((block,), "float16")
            T.copy(A[by * block:(by + 1) * block, bx], column)
            T.copy(column, B[by * block:(by + 1) * block, bx])

    return main


def compiled_for(jit_kernel, target):
    return tritile.compile(jit_kernel.stages[0][1], target=target, backend="triton")


def view_with_padding(rows, cols, dtype, fill, extra_rows=8, extra_cols=0, device="cpu"):
    """(a random rows x cols tensor, the buffer it is a view of): the buffer's other elements
    - rows after it and, with `extra_cols`, columns past it (the view is then the leading
    rows x cols block of a wider buffer's rows, flattened: still contiguous) - hold `fill`."""
    total = rows * cols + extra_rows * cols + extra_cols
    buffer = torch.full((total,), fill, dtype=dtype, device=device)
    view = buffer[:rows * cols].view(rows, cols)
    view.copy_(torch.randn(rows, cols).to(dtype))
    return view, buffer


# ---------------------------------------------------------------------------- which copies take TMA


@pytest.mark.parametrize("target", TMA_TARGETS)
def test_gemm_tiles_move_through_descriptors_on_tma_targets(target):
    kernel = tritile.compile(K.gemm(80, 72, 64, 32, 32, 32, num_stages=2), out_idx=[-1], target=target,
                             backend="triton")
    body = kernel_body(kernel)
    assert "A_desc.load([" in body and "B_desc.load([" in body and "C_desc.store([" in body
    assert "tl.load(" not in body and "tl.store(" not in body
    assert "TMA_DESCRIPTORS = (((32, 32), None), ((32, 32), None), ((32, 32), None), )" in kernel.get_source("triton")
    ttir = kernel.get_source("ttir")
    assert ttir.count("tt.descriptor_load") == 2 and ttir.count("tt.descriptor_store") == 1
    ptx = kernel.get_source("ptx")
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" in ptx  # TMA loads
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in ptx  # the TMA store of C


@pytest.mark.parametrize("target", TMA_TARGETS)
def test_attention_tiles_use_rank_4_descriptors(target):
    """[B, H, S, D] tensors: a descriptor over the whole tensor, its block 1 x 1 x rows x D (each
    dim clipped against its own size, as the masked path masks it)."""
    kernel = tritile.compile(FA.flashattn.fn(1, 2, 256, 256, 64, True, 128, 64, 2, 128), target=target,
                             backend="triton")
    body = kernel_body(kernel)
    assert "K_desc.load([bz, by, (k * 64), 0])" in body and "Output_desc.store([bz, by, (bx * 128), 0]" in body
    assert "tl.load(" not in body
    assert "cp.async.bulk.tensor.4d" in kernel.get_source("ptx")


@pytest.mark.parametrize("target", ["cuda:80", "hip:gfx942"])
def test_targets_without_tma_keep_masked_copies(target):
    kernel = tritile.compile(K.gemm(80, 72, 64, 32, 32, 32, num_stages=2), out_idx=[-1], target=target,
                             backend="triton")
    source = kernel.get_source("triton")
    assert "_desc" not in source and "TMA_DESCRIPTORS = ()" in source
    assert kernel_body(kernel).count("tl.load(") == 2 and "tl.store(" in kernel_body(kernel)
    if target == "cuda:80":
        ptx = kernel.get_source("ptx")
        assert "cp.async.bulk" not in ptx and "cp.async.cg" in ptx  # Triton's pipeliner: cp.async


FALLBACKS = {
    # name: (kernel, whether A's copy takes a descriptor, whether B's does)
    "aligned": (lambda: tile_copy(64, 64, 16, 32), True, True),
    "fp8": (lambda: tile_copy(64, 64, 16, 32, "float8_e4m3"), True, True),
    "inner start 16 bytes": (lambda: tile_copy(64, 64, 16, 32, col_offset=8), True, True),
    "row pitch 66 bytes": (lambda: tile_copy(64, 33, 16, 32), False, False),
    "padded tile": (lambda: tile_copy(64, 64, 16, 48), False, False),
    "box over 256": (lambda: tile_copy(16, 512, 16, 512), False, False),
    "inner box 8 bytes": (lambda: tile_copy(64, 64, 16, 4), False, False),
    "inner start 8 bytes": (lambda: tile_copy(64, 64, 16, 32, col_offset=4), False, False),
    "float64": (lambda: tile_copy(64, 64, 16, 16, "float64"), False, False),
    "int64": (lambda: tile_copy(64, 64, 16, 16, "int64"), False, False),
    "column tile": (lambda: column_copy(64, 32, 32), False, False),
    "unit dim between wider ones": (lambda: head_rows_copy(2, 64, 4, 32, 16), False, False),
}


@tritile.jit
def head_rows_copy(batch, seq, heads, dim, block):
    """A [batch, seq, heads, dim] tensor's rows of one head, `A[b, rows, h, :]` (a box of
    [1, block, 1, dim]: a unit dim between two wider ones), copied through shared memory."""
    @T.prim_func
    def main(A: T.Tensor((batch, seq, heads, dim), "float16"), B: T.Tensor((batch, seq, heads, dim), "float16")):
        with T.Kernel(seq // block, heads, batch, threads=128) as (bx, h, b):
            tile = T.alloc_shared((block, dim), "float16")
            T.copy(A[b, bx * block:(bx + 1) * block, h, :], tile)
            T.copy(tile, B[b, bx * block:(bx + 1) * block, h, :])

    return main


@pytest.mark.parametrize("case", sorted(FALLBACKS))
def test_copies_tma_cannot_take_keep_the_masked_path(case):
    build, a_desc, b_desc = FALLBACKS[case]
    body = kernel_body(compiled_for(build(), "cuda:90"))
    assert ("A_desc.load(" in body) == a_desc and ("tl.load(A +" in body) == (not a_desc)
    assert ("B_desc.store(" in body) == b_desc and ("tl.store(B +" in body) == (not b_desc)


@tritile.jit
def rows_in_a_loop(M, N, block, rounds):
    """B's row blocks written by one `T.copy` inside a loop; C by a fill and a copy."""
    @T.prim_func
    def main(A: T.Tensor((M, N), "float16"), B: T.Tensor((M, N), "float16"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(1, threads=128) as _:
            tile = T.alloc_shared((block, N), "float16")
            for i in T.serial(rounds):
                T.copy(A[i * block, 0], tile)
                T.copy(tile, B[i * block, 0])
            T.fill(C[0:block, 0:N], 0)
            T.copy(tile, C[0, 0])

    return main


def test_a_tensor_read_and_written_keeps_the_masked_path():
    """TMA's asynchronous proxy is not ordered with the kernel's own loads and stores of the
    same tensor: a tensor the kernel reads and writes takes none."""
    body = kernel_body(compiled_for(add_one_in_place(64, 32, 16), "cuda:90"))
    assert "_desc" not in body and "tl.load(A +" in body and "tl.store(A +" in body


def test_stores_that_may_write_the_same_bytes_twice_keep_the_masked_path(assert_close):
    """A TMA store is waited for only until it has read its shared source: a tensor written in
    a loop, or by two statements, takes masked stores; a read-only one still loads by TMA."""
    kernel = rows_in_a_loop(64, 32, 16, 4)
    body = kernel_body(compiled_for(kernel, "cuda:90"))
    assert "A_desc.load(" in body and "B_desc" not in body and "C_desc" not in body
    a = torch.randn(64, 32).half()
    for backend in ("auto", "triton"):
        b, c = torch.zeros(64, 32).half(), torch.full((64, 32), 5.0).half()
        tritile.compile(kernel.stages[0][1], backend=backend)(a, b, c)
        assert torch.equal(b, a) and torch.equal(c[:16], a[48:]) and torch.equal(c[16:], torch.full((48, 32), 5.0).half())


def test_the_switch_keeps_every_copy_masked(monkeypatch, assert_close):
    """`TRITILE_TRITON_TMA=0`: masked copies on sm_90 too (another kernel: the switch is part of
    the compile cache key), the same results."""
    a, b = K.make_operands(80, 72, 64)
    sources = {}
    for switch in ("0", "auto"):
        monkeypatch.setenv("TRITILE_TRITON_TMA", switch)
        kernel = tritile.compile(K.gemm(80, 72, 64, 32, 32, 32), out_idx=[-1], target="cuda:90", backend="triton")
        sources[switch] = kernel_body(kernel)
        assert_close(tritile.compile(kernel.stages[0][1], backend="triton")(a, b), K.gemm_reference(a, b))
    assert "_desc" not in sources["0"] and sources["0"].count("tl.load(") == 2
    assert "A_desc.load(" in sources["auto"]


def test_runtime_dims_take_descriptors_in_the_variant_that_knows_them_multiples_of_16():
    """A runtime dim may be 0 (no descriptor describes an empty dim) or make the row pitch
    unaligned: only the variant whose dims are positive multiples of 16 (ir/divisibility.py)
    proves the tensors describable."""
    M, N, K_ = T.dynamic("m, n, k")
    kernel = tritile.compile(K.gemm(M, N, K_, 32, 32, 32), out_idx=[-1], target="cuda:90", backend="triton")
    plain = kernel.get_source("triton").split("def main")[1]
    assert "_desc" not in plain
    divisible = kernel.get_source("triton", dims=dict(m=1024, n=1024, k=1024)).split("def main")[1]
    assert "A_desc.load(" in divisible and "B_desc.load(" in divisible and "C_desc.store(" in divisible
    ragged_m = kernel.get_source("triton", dims=dict(m=1000, n=1024, k=1024)).split("def main")[1]
    assert "tl.load(A +" in ragged_m and "B_desc.load(" in ragged_m and "tl.store(C +" in ragged_m


# ---------------------------------------------------------------------------- results, edge tiles


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_edge_tiles_read_zeros_and_drop_lanes_past_every_dim(dtype, assert_close):
    """Column sums over 40 x 72: the last row tile (rows 32..63) hangs past M into NaN, the last
    column tile (columns 64..95) past N into the next row; the output's lanes past N would land
    on sentinels.  Triton's interpreter runs the descriptor code; tritile's interpreter the IR."""
    M, N, torch_dtype = 40, 72, getattr(torch, dtype)
    jit_kernel = column_sums(M, N, 32, 32, dtype)
    assert "A_desc.load(" in kernel_body(compiled_for(jit_kernel, "cuda:90"))
    for backend in ("auto", "triton"):  # CPU tensors: tritile's interpreter, Triton's
        kernel = tritile.compile(jit_kernel.stages[0][1], backend=backend)
        a, _ = view_with_padding(M, N, torch_dtype, float("nan"))
        out, out_buffer = view_with_padding(1, N, torch.float32, -7.0, extra_rows=1)
        kernel(a, out)
        expected = a.float().sum(0, keepdim=True)
        assert_close(out, expected)
        assert torch.equal(out_buffer[N:], torch.full((N,), -7.0)), f"{backend}: a lane past N was written"


@pytest.mark.parametrize("case", ["aligned", "fp8", "inner start 16 bytes", "row pitch 66 bytes"])
def test_tile_copies_with_edge_tiles_three_ways(case):
    """Descriptor and masked copies alike: B's tiles = A's, everything of B's buffer outside
    them left alone (rows past M and, with a column offset, columns before it)."""
    jit_kernel = FALLBACKS[case][0]()
    func = jit_kernel.stages[0][1]
    M, N = func.params[0].shape
    dtype = func.params[0].dtype.torch
    for backend in ("auto", "triton"):
        kernel = tritile.compile(func, backend=backend)
        a, _ = view_with_padding(M, N, dtype, float("nan"))
        b, b_buffer = view_with_padding(M, N, dtype, -3.0)
        before = b.clone()
        kernel(a, b)
        offset = 8 if case == "inner start 16 bytes" else 0
        expected = before.clone()
        expected[:, offset:] = a[:, offset:]
        assert torch.equal(b.float(), expected.float()), f"{backend}: B differs"
        assert torch.equal(b_buffer[M * N:].float(), torch.full((8 * N,), -3.0)), f"{backend}: wrote past M"


def test_gemm_with_ragged_edges_three_ways(assert_close):
    a, b = K.make_operands(80, 72, 64)
    expected = K.gemm_reference(a, b)
    for backend in ("auto", "triton"):
        kernel = tritile.compile(K.gemm(80, 72, 64, 32, 32, 32, num_stages=2), out_idx=[-1], backend=backend)
        assert_close(kernel(a, b), expected)
    assert "C_desc.store(" in kernel.get_source("triton")


def test_a_size_one_dims_stride_does_not_reach_the_descriptor(assert_close):
    """A contiguous tensor may carry any stride along a dim of size 1 (here 1): the launcher
    passes the row-major strides the kernel assumes, never the tensor's own."""
    a = torch.randn(64, 1).t()  # shape (1, 64), strides (1, 1), contiguous
    assert a.is_contiguous() and a.stride() == (1, 1)
    kernel = tritile.compile(tile_copy(1, 64, 1, 64, "float32").stages[0][1], backend="triton")
    assert "A_desc.load(" in kernel_body(kernel)
    b = torch.zeros(1, 64)
    kernel(a, b)
    assert torch.equal(b, a)


def test_a_misaligned_tensor_read_through_a_descriptor_is_named():
    storage = torch.randn(64 * 64 + 1).half()
    a = storage[1:].view(64, 64)  # 2 bytes past an aligned address
    kernel = tritile.compile(tile_copy(64, 64, 16, 32).stages[0][1], backend="triton")
    with pytest.raises(ValueError, match="argument A must be 16-byte aligned"):
        kernel(a, torch.zeros(64, 64).half())


def test_the_launcher_gets_each_descriptors_tensor_shape_and_row_major_strides():
    """The generated `tritile_launch` hands `tritile.runtime.launcher` one (tensor, shape,
    strides) per descriptor argument, which becomes a `triton.tools` TensorDescriptor (the
    layout is the compiled kernel's: None in its spec)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from tritile.runtime.launcher import DescriptorSpec, host_descriptor

    kernel = tritile.compile(K.gemm(80, 72, 64, 32, 32, 32), out_idx=[-1], target="cuda:90", backend="triton")
    triton_kernel = kernel._codegen(kernel.plan_target)
    specs = triton_kernel._descriptor_specs()
    assert specs == [DescriptorSpec((32, 32))] * 3
    launches = []
    triton_kernel._launcher = lambda *args: launches.append(args)  # stands in for the GPU launcher
    a, b = K.make_operands(80, 72, 64)
    c = torch.empty(80, 72, dtype=torch.float16)
    triton_kernel.launch_bound([a, b, c])
    (grid, tensors, operands, dims), = launches
    assert grid == (3, 3, 1) and tensors == (a, b, c) and dims == ()
    assert [(t is x, tuple(shape), strides) for (t, shape, strides), x in zip(operands, (a, b, c))] == [
        (True, (80, 64), (64, 1)), (True, (64, 72), (72, 1)), (True, (80, 72), (72, 1))]
    descriptor = host_descriptor(operands[2], specs[2])
    assert isinstance(descriptor, TensorDescriptor) and descriptor.base is c
    assert (descriptor.shape, descriptor.strides, descriptor.block_shape) == ([80, 72], [72, 1], [32, 32])
    assert descriptor.padding == "zero"


# ---------------------------------------------------------------------------- the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_edge_tiles_on_the_gpu(backend, dtype, assert_close):
    M, N, torch_dtype = 40, 72, getattr(torch, dtype)
    kernel = tritile.compile(column_sums(M, N, 32, 32, dtype).stages[0][1], backend=backend)
    a, _ = view_with_padding(M, N, torch_dtype, float("nan"), device="cuda")
    out, out_buffer = view_with_padding(1, N, torch.float32, -7.0, extra_rows=1, device="cuda")
    kernel(a, out)
    assert_close(out, a.float().sum(0, keepdim=True))
    assert torch.equal(out_buffer[N:].cpu(), torch.full((N,), -7.0))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["aligned", "fp8", "inner start 16 bytes", "row pitch 66 bytes", "box over 256"])
def test_tile_copies_on_the_gpu(backend, case):
    func = FALLBACKS[case][0]().stages[0][1]
    M, N = func.params[0].shape
    dtype = func.params[0].dtype.torch
    kernel = tritile.compile(func, backend=backend)
    a, _ = view_with_padding(M, N, dtype, float("nan"), device="cuda")
    b, b_buffer = view_with_padding(M, N, dtype, -3.0, device="cuda")
    expected = b.clone()
    offset = 8 if case == "inner start 16 bytes" else 0
    expected[:, offset:] = a[:, offset:]
    kernel(a, b)
    assert torch.equal(b.float(), expected.float())
    assert torch.equal(b_buffer[M * N:].float().cpu(), torch.full((8 * N,), -3.0))


@pytest.mark.gpu
def test_triton_backend_launch_encodes_each_descriptor_once_per_geometry(assert_close):
    """On a TMA GPU the triton.language kernel goes through tritile's direct launcher, its host
    descriptors encoded once per (address, shape, strides)."""
    from tritile.runtime.launcher import DirectLaunch

    kernel = tritile.compile(K.gemm(256, 256, 128, 64, 64, 32, num_stages=3), out_idx=[-1], backend="triton")
    a, b = K.make_operands(256, 256, 128, device="cuda")
    outputs = [kernel(a, b) for _ in range(3)]  # kept: three outputs at three addresses
    for c in outputs:
        assert_close(c, K.gemm_reference(a, b))
    launcher = kernel._device_kernel._launcher
    if torch.cuda.get_device_capability()[0] >= 9:
        assert isinstance(launcher, DirectLaunch)
        assert [len(memo) for memo in launcher._encoded] == [1, 1, 3]  # C: a new output each call
