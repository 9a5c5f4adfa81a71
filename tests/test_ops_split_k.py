"""Split-K GEMMs (tritile/ops/split_k.py): the one kernel (partials, last-arrival sum, epilogue)
equals torch's product (through the reference interpreter, or Triton's under
TRITILE_BACKEND=triton, on CPU; the compiled kernel on a GPU), sums the partials in split order
whichever program arrives last, leaves its counters at zero; tritile.mm and tritile.linear take
the split path where the plan says so (`TRITILE_SPLIT_K=on` forces it on CPU), and the plan
follows its measured rule or takes a candidate."""
import itertools
import subprocess
import tempfile
import types
from pathlib import Path

import pytest
import torch
import triton

import tritile.language as T
from tritile.interpreter import executor
from tritile.ops import linear as tritile_linear
from tritile.ops import matmul as tritile_matmul
from tritile.ops.epilogues import activation_fn
from tritile.ops.split_k import SplitKGemm, matmul_split_k, split_k_config

DTYPES = {torch.float16: T.float16, torch.bfloat16: T.bfloat16, torch.float32: T.float32}
TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 5e-2, torch.float32: 1e-4}
CPU_TILES = dict(block_M=64, block_N=64, block_K=32, num_stages=2, threads=128)


def _operands(M, N, K, dtype, trans_a, trans_b, device="cpu"):
    """Random A (M, K), B (K, N) and the tensors the kernel takes (a transposed operand as the
    contiguous (K, M) / (N, K) matrix it is the transpose of)."""
    a = torch.randn(M, K, device=device).to(dtype)
    b = torch.randn(K, N, device=device).to(dtype)
    return a, b, (a.t().contiguous() if trans_a else a), (b.t().contiguous() if trans_b else b)


def _in_split_order(workspace: torch.Tensor) -> torch.Tensor:
    """The float32 sum of the partials in split order 0, 1, .., S-1 (the kernel's order)."""
    total = workspace[0].clone()
    for partial in workspace[1:]:
        total += partial
    return total


@pytest.mark.parametrize("M, N, K, splits, trans_a, trans_b, dtype", [
    (16, 96, 200, 3, False, False, torch.float16),    # 7 K tiles in shares of 3: the last one short
    (70, 130, 256, 2, True, False, torch.bfloat16),   # ragged M and N, A read transposed
    (33, 64, 320, 4, False, True, torch.float16),     # B read transposed
    (40, 64, 96, 4, False, False, torch.bfloat16),    # 3 K tiles in 4 shares: the last share reads only zeros
])
def test_split_gemm_equals_the_product(M, N, K, splits, trans_a, trans_b, dtype):
    a, b, a_operand, b_operand = _operands(M, N, K, dtype, trans_a, trans_b)
    gemm = SplitKGemm.build(a_operand, b_operand, dict(CPU_TILES, splits=splits), DTYPES[dtype], trans_A=trans_a,
                            trans_B=trans_b)
    expected = a.float() @ b.float()
    tol = TOLERANCE[dtype]
    for _ in range(2):  # the second call starts from the counters the first left at zero
        gemm.workspace.fill_(float("nan"))  # a partial read before it is written would show
        out = gemm(a_operand, b_operand)
        assert out.shape == (M, N) and out.dtype == dtype
        torch.testing.assert_close(out.float(), expected, rtol=tol, atol=tol * K ** 0.5)
        assert not gemm.counters.any()
        assert gemm.workspace.shape == (splits, M, N)
        torch.testing.assert_close(gemm.workspace.sum(0), expected, rtol=1e-4, atol=1e-3)
        # the output is the in-order sum rounded once to the output's dtype
        assert torch.equal(out, _in_split_order(gemm.workspace).to(dtype))


def test_split_gemm_applies_the_fused_epilogue():
    M, N, K = 48, 160, 256
    a, b = torch.randn(M, K).half(), torch.randn(N, K).half()  # B as nn.Linear's weight, read transposed
    bias, residual = torch.randn(N).half(), torch.randn(M, N).half()
    pre = torch.empty(M, N, dtype=torch.float16)
    gemm = SplitKGemm.build(a, b, dict(CPU_TILES, splits=3), T.float16, trans_B=True,
                            epilogue_operands=(bias, residual, pre), has_bias=True, activation="silu",
                            has_residual=True, keep_pre=True)
    out = gemm(a, b, bias, residual, pre)
    expected_pre = a.float() @ b.float().t() + bias.float()
    torch.testing.assert_close(pre.float(), expected_pre, rtol=1e-2, atol=5e-2)
    torch.testing.assert_close(out.float(), activation_fn("silu")(expected_pre) + residual.float(), rtol=1e-2,
                               atol=5e-2)
    assert not gemm.counters.any()


def _blocks_in_reverse(*ranges):
    """The interpreter's blocks in reverse launch order: each tile's split 0 arrives last."""
    return reversed(list(itertools.product(*ranges)))


def test_split_sum_is_bit_identical_whatever_arrives_last(gluon_backend, monkeypatch):
    """float32 output (no rounding after the sum): launch order and its reverse (split S-1, then
    split 0 the last to arrive) give the same bits, the in-order sum of the partials (not
    torch's own sum, whose order differs)."""
    M, N, K, splits = 40, 96, 320, 4
    a, b = torch.randn(M, K), torch.randn(K, N)
    gemm = SplitKGemm.build(a, b, dict(CPU_TILES, splits=splits), T.float32)
    in_launch_order = gemm(a, b)
    assert torch.equal(in_launch_order, _in_split_order(gemm.workspace))
    assert not torch.equal(in_launch_order, _in_split_order(gemm.workspace.flip(0)))  # the order shows in the bits
    monkeypatch.setattr(executor, "itertools", types.SimpleNamespace(product=_blocks_in_reverse))
    gemm.workspace.fill_(float("nan"))  # a partial read before it is written would show
    in_reverse_order = gemm(a, b)
    assert torch.equal(in_reverse_order, in_launch_order)
    assert not gemm.counters.any()


@pytest.fixture
def split_everywhere(monkeypatch):
    monkeypatch.setenv("TRITILE_SPLIT_K", "on")
    tritile_matmul._gemms.clear()
    tritile_linear._linears.clear()
    yield
    tritile_matmul._gemms.clear()
    tritile_linear._linears.clear()


@pytest.mark.parametrize("trans_b", [False, True])
def test_tritile_mm_runs_the_split_gemm_where_planned(split_everywhere, trans_b):
    a = torch.randn(24, 160).half()
    b = torch.randn(72, 160).half().t() if trans_b else torch.randn(160, 72).half()
    out = torch.ops.tritile.mm(a, b)
    (kernel, _, remembered_trans_b), = tritile_matmul._gemms.values()
    assert isinstance(kernel, SplitKGemm) and remembered_trans_b == trans_b
    torch.testing.assert_close(out.float(), a.float() @ b.float(), rtol=2e-2, atol=5e-2)


def test_split_gemms_of_one_shape_share_the_kept_workspace(split_everywhere):
    a, b = torch.randn(24, 160).half(), torch.randn(160, 72).half()
    torch.ops.tritile.mm(a, b)
    torch.ops.tritile.mm(a.bfloat16(), b.bfloat16())  # another signature, the same (device, shape)
    first, second = (kernel for kernel, _, _ in tritile_matmul._gemms.values())
    assert first.workspace is second.workspace and first.counters is second.counters


def test_a_split_gemm_builds_from_the_function_given():
    """`SplitKGemm.build(..., split_gemm=)`: the split kernel of another build of the same function
    (bench/bench_h100.py's per-backend columns), with the kept workspace of the shape."""
    import tritile

    a, b = torch.randn(40, 256).half(), torch.randn(256, 48).half()
    config = dict(block_M=32, block_N=32, block_K=32, num_stages=2, threads=128, splits=3)
    on_triton = tritile.jit(matmul_split_k.fn, backend="triton")
    gemm = SplitKGemm.build(a, b, config, "float16", split_gemm=on_triton)
    assert gemm.kernel.backend == "triton"
    torch.testing.assert_close(gemm(a, b).float(), a.float() @ b.float(), rtol=1e-2, atol=1e-2)
    assert int(gemm.counters.abs().sum()) == 0


def test_tritile_linear_keeps_its_epilogue_when_split(split_everywhere):
    x, weight = torch.randn(2, 9, 128).bfloat16(), torch.randn(80, 128).bfloat16()
    bias, residual = torch.randn(80).bfloat16(), torch.randn(2, 9, 80).bfloat16()
    out, pre = torch.ops.tritile.linear(x, weight, bias, residual, "gelu_tanh", True)
    (call,) = tritile_linear._linears.values()
    assert isinstance(call.kernel, SplitKGemm)
    expected_pre = x.float() @ weight.float().t() + bias.float()
    torch.testing.assert_close(pre.float(), expected_pre, rtol=5e-2, atol=1e-1)
    torch.testing.assert_close(out.float(), activation_fn("gelu_tanh")(expected_pre) + residual.float(), rtol=5e-2,
                               atol=1e-1)


def test_plan_follows_the_measured_rule(monkeypatch):
    monkeypatch.delenv("TRITILE_SPLIT_K", raising=False)
    # a weight gradient with few wide tiles and a long K: two shares of 128 K tiles each fill the SMs
    assert split_k_config("cuda", 1024, 1024, 16384, torch.bfloat16)["splits"] == 2
    assert split_k_config("cuda", 512, 512, 8192, torch.float16)["splits"] == 4
    # 16 rows whose (swapped) narrow tiles leave 3/4 of the SMs idle: two shares on those tiles
    assert split_k_config("cuda", 16, 1024, 4096, torch.bfloat16) == dict(SWAPPED_THIN_TILES, splits=2)
    for shape in [(16, 8192, 8192), (16, 4096, 4096), (64, 1024, 1024),  # small M: splitting measured slower
                  (128, 8192, 8192),
                  (3072, 1024, 16384), (4096, 4096, 4096),                # enough tiles to fill the SMs
                  (1024, 1024, 1024)]:                                    # K too short to share
        assert split_k_config("cuda", *shape, torch.float16) is None, shape
    assert split_k_config("cpu", 1024, 1024, 16384, torch.float16) is None
    assert split_k_config("cuda", 1024, 1024, 16384, torch.float32) is None
    monkeypatch.setenv("TRITILE_SPLIT_K", "off")
    assert split_k_config("cuda", 1024, 1024, 16384, torch.float16) is None
    monkeypatch.setenv("TRITILE_SPLIT_K", "on")
    assert split_k_config("cpu", 64, 64, 256, torch.float16)["splits"] >= 2
    assert split_k_config("cpu", 64, 64, 32, torch.float16) is None  # one K tile: nothing to split


SMALL_M_TILES = dict(block_M=64, block_N=64, block_K=128, num_stages=6, threads=128)
SWAPPED_THIN_TILES = dict(block_M=16, block_N=64, block_K=256, num_stages=5, threads=128, swap_ab=True)


def test_plan_takes_a_candidate(monkeypatch):
    monkeypatch.setenv("TRITILE_SPLIT_K", "off")  # a candidate is the caller's, whatever the switch says
    assert split_k_config("cuda", 16, 4096, 4096, torch.float16, tiles=SMALL_M_TILES, splits=3) == \
        dict(SMALL_M_TILES, splits=3)
    with pytest.raises(ValueError, match="'splits' is 33; K = 4096 has 32 tiles"):
        split_k_config("cuda", 16, 4096, 4096, torch.float16, tiles=SMALL_M_TILES, splits=33)
    with pytest.raises(ValueError, match="'splits' is 1"):
        split_k_config("cuda", 16, 4096, 4096, torch.float16, tiles=SMALL_M_TILES, splits=1)
    with pytest.raises(ValueError, match="both 'tiles' and 'splits'"):
        split_k_config("cuda", 16, 4096, 4096, torch.float16, splits=2)


def _small_m_kernel(backend=None, target=None, num_stages=3):
    """A decoding linear's shape in 4 shares on the small-M tiles (3 stages: sm_80's shared
    memory holds them)."""
    options = {} if target is None else dict(target=target, backend=backend)
    return matmul_split_k.compile(M=16, N=4096, K=4096, dtype=T.float16, splits=4,
                                  **dict(SMALL_M_TILES, num_stages=num_stages), **options)


def _split_weight_gradient_kernel(backend=None, target=None):
    """The plan's weight gradient (A read transposed) with a bias and GELU epilogue."""
    options = {} if target is None else dict(target=target, backend=backend)
    config = split_k_config("cuda", 1024, 1024, 16384, torch.bfloat16)
    return matmul_split_k.compile(M=1024, N=1024, K=16384, dtype=T.bfloat16, trans_A=True, has_bias=True,
                                  activation="gelu", **config, **options)


@pytest.mark.parametrize("backend", ["gluon", "triton"])
@pytest.mark.parametrize("shape", ["small_m", "weight_gradient"])
def test_one_kernel_counts_in_after_a_barrier(backend, shape):
    """sm_90: one kernel; the partial's stores, `bar.sync` (on Gluon's weight gradient, warp
    specialized and persistent: the consumers' `bar.sync 0, 256`), then one thread's gpu-scope
    acq_rel atomic; the fixup's workspace loads plain `ld.global` (no `.nc`: the read-only path
    may not serve another program's stores) after it; wgmma for the shares.  In the SASS: the
    release's `MEMBAR.ALL.GPU` before the atomic, and its acquire's `CCTL.IVALL` (the SM's L1
    invalidated) before the barrier and the loads: no stale partial can be read."""
    if shape == "small_m":
        kernel = _small_m_kernel(backend, "cuda:90", num_stages=6)
    else:
        kernel = _split_weight_gradient_kernel(backend, "cuda:90")
        assert backend == "triton" or "gl.warp_specialize(" in kernel.get_source("gluon")
    assert not kernel._parts  # one kernel: no second launch
    ptx = kernel.get_source("ptx")
    assert ptx.count(".entry") == 1 and "wgmma.mma_async" in ptx
    atomic = ptx.index("atom.global.gpu.acq_rel.add")
    assert ptx.count("atom.global") == 1
    assert ptx.rfind("st.global", 0, atomic) < ptx.rfind("bar.sync", 0, atomic) < atomic
    assert "ld.global" in ptx[atomic:] and "ld.global.nc" not in ptx[atomic:]
    sass = _sass(kernel)
    if sass is not None:  # what ptxas made of it: the release fence, the atomic, L1 invalidated, the loads
        atomic = sass.index("ATOMG.E.ADD.STRONG.GPU")
        assert "MEMBAR.ALL.GPU" in sass[sass.rfind("BAR.SYNC", 0, atomic):atomic]
        invalidate = sass.index("CCTL.IVALL", atomic)
        assert invalidate < sass.index("BAR.SYNC", atomic) < sass.index("LDG.E", atomic)


def _sass(kernel):
    """The kernel's sm_90 SASS by the nvdisasm Triton ships (None where it has none)."""
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    if not nvdisasm.exists():
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel._codegen(kernel.plan_target).asm["cubin"])
        cubin.flush()
        return subprocess.run([str(nvdisasm), cubin.name], check=True, capture_output=True, text=True).stdout


# for tests/test_kernels_compile.py (sm_90 and sm_80)
COMPILE_CASES = {
    "split-k-weight-gradient-bias-gelu-bf16": _split_weight_gradient_kernel,
    "split-k-small-m-fp16": _small_m_kernel,
}


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K, trans_a", [(1024, 1024, 16384, True), (512, 768, 8192, False)])
def test_split_gemm_on_the_gpu(M, N, K, trans_a):
    """The shapes the plan splits, through tritile.mm on the device (the weight gradient's
    transposed A read in place)."""
    assert split_k_config("cuda", M, N, K, torch.bfloat16) is not None
    a = torch.randn(K, M, device="cuda").bfloat16().t() if trans_a else torch.randn(M, K, device="cuda").bfloat16()
    b = torch.randn(K, N, device="cuda").bfloat16()
    expected = a.float() @ b.float()
    torch.testing.assert_close(torch.ops.tritile.mm(a, b).float(), expected, rtol=2e-2, atol=2e-2 * K ** 0.5)


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K, splits, dtype", [
    (16, 4096, 4096, 4, torch.float16),
    (128, 8192, 8192, 3, torch.bfloat16),
    (100, 1000, 3000, 6, torch.float16),  # ragged: partial tiles, 24 K tiles in 6 shares
])
def test_small_m_split_gemm_on_the_gpu_is_deterministic(M, N, K, splits, dtype):
    """The sweep's small-M candidates on the device: the product, counters back at zero, and the
    same bits on every call (the arrival order changes from call to call, the sum's order not)."""
    a, b = torch.randn(M, K, device="cuda").to(dtype), torch.randn(K, N, device="cuda").to(dtype)
    config = split_k_config("cuda", M, N, K, dtype, tiles=SMALL_M_TILES, splits=splits)
    gemm = SplitKGemm.build(a, b, config, DTYPES[dtype])
    first = gemm(a, b)
    torch.testing.assert_close(first.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-2 * K ** 0.5)
    assert torch.equal(first, _in_split_order(gemm.workspace).to(dtype))
    for _ in range(20):
        assert torch.equal(gemm(a, b), first)
    assert not gemm.counters.any()
