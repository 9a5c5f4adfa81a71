"""Consumer partitions (lowering/consumer_partitions.py): a warp-specialized kernel's rows split
across its consumer warpgroups, one partition each.

CPU: the pass's rewrite and refusals, interpreter(every stage) == torch, and the generated
sm_90 partitions (PTX compiled without a GPU).  GPU: the split kernels against torch.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tritile
import tritile.language as T
from tritile.interpreter import execute
from tritile.ir import nodes as ir
from tritile.ir.printer import format_func
from tritile.lowering import run_passes
from tritile.runtime.kernel import JITKernel
from tritile.runtime.target import Target

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_warp_specialization import attention_ir, function, gemm_ir  # noqa: E402

pytestmark = pytest.mark.usefixtures("gluon_backend")  # the Gluon backend's own code

H100 = Target("cuda", 90)


@pytest.fixture
def warp_specialize(monkeypatch):
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "1")


def row_max_program(rows=128, n=512, k=64, block_n=64, stages=2, threads=256, along_rows=False):
    """Y = X W^T for a block of `rows` rows of X; each row's max over Y's columns (or, with
    `along_rows`, each column tile's max over the rows: a reduction the split must refuse),
    and Y's last column tile written element by element."""

    @T.prim_func
    def row_max(X: T.Tensor((256, k), "float16"), W: T.Tensor((n, k), "float16"),
                M: T.Tensor((256,), "float32"), Y: T.Tensor((256, block_n), "float32")):
        with T.Kernel(256 // rows, threads=threads) as bx:
            X_shared = T.alloc_shared((rows, k), "float16")
            W_shared = T.alloc_shared((block_n, k), "float16")
            S = T.alloc_fragment((rows, block_n), "float32")
            best = T.alloc_fragment((rows,), "float32")
            col_best = T.alloc_fragment((block_n if along_rows else rows,), "float32")
            T.copy(X[bx * rows:(bx + 1) * rows, :], X_shared)
            T.fill(best, -T.infinity("float32"))
            for j in T.Pipelined(n // block_n, num_stages=stages):
                T.copy(W[j * block_n:(j + 1) * block_n, :], W_shared)
                T.clear(S)
                T.gemm(X_shared, W_shared, S, transpose_B=True)
                if along_rows:
                    T.reduce_max(S, col_best, dim=0)
                T.reduce_max(S, best, dim=1, clear=False)
            T.copy(best, M[bx * rows:(bx + 1) * rows])
            for i, c in T.Parallel(rows, block_n):
                Y[bx * rows + i, c] = S[i, c] + best[i] * 0.0 + i
    return row_max


def row_max_ir(**kw):
    return tritile.compile(row_max_program(**kw), out_idx=[2, 3], target="cuda:90").stages[0][1]


def row_max_reference(x, w):
    y = x.float() @ w.float().T
    last = y[:, -64:] + torch.arange(128).repeat(2)[:, None].float()
    return y.max(dim=1).values, last


def split_of(func):
    return next((s for s in func.kernel.body.stmts if isinstance(s, ir.ConsumerPartitions)), None)


def stages_with(func):
    return dict(run_passes(func, H100))


# ------------------------------------------------------------------ the pass


def test_attention_rows_split_across_two_warpgroups(warp_specialize):
    stages = stages_with(attention_ir(False))
    func = stages["consumer_partitions"]
    split = split_of(func)
    assert split is not None and split.count == 2 and func.kernel.partition_threads == 128
    text = format_func(func)
    assert "for part in T.consumer_partitions(2):" in text
    assert "Q_shared = T.alloc_shared([2, 64, 128], float16)" in text  # one version per partition
    assert "K_shared = T.alloc_shared([2, 128, 128], float16)" in text  # the producer's ring, shared
    assert "acc_s = T.alloc_fragment([64, 128], float32)" in text
    assert "T.copy(Q[bz, by, bx * 128 + part * 64:bx * 128 + part * 64 + 64, :], Q_shared[part, :, :])" in text
    assert "T.gemm(Q_shared[part, :, :], K_shared[" in text
    # shared buffers are allocated before the partitions, fragments inside them
    allocs = [s.buffer.scope for s in func.kernel.body.stmts if isinstance(s, ir.Alloc)]
    assert allocs == ["shared"] * 4


def test_causal_mask_uses_the_kernel_row(warp_specialize):
    text = format_func(stages_with(attention_ir(True))["consumer_partitions"])
    assert "for i, j in T.Parallel(64, 128):" in text
    assert "q_idx = bx * 128 + (i + part * 64)" in text


@pytest.mark.parametrize("causal", [False, True])
def test_every_stage_of_split_attention_matches_torch(causal, warp_specialize):
    from examples.flash_attention import ref_program

    stages = stages_with(attention_ir(causal))
    assert split_of(stages["layout_inference"]) is not None
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 512, 128, dtype=torch.float16) for _ in range(3))
    ref = ref_program(q, k, v, causal)
    for name in ("tile", "warp_specialization", "consumer_partitions", "layout_inference"):
        out = torch.empty_like(q)
        execute(stages[name], [q, k, v, out], {})
        torch.testing.assert_close(out.float(), ref.float(), rtol=1e-2, atol=1e-2, msg=lambda m: f"{name}: {m}")


def test_row_reduction_kernel_split_matches_torch(warp_specialize):
    stages = stages_with(row_max_ir())
    func = stages["layout_inference"]
    text = format_func(func)
    assert split_of(func) is not None, text
    assert "T.copy(best[:], M[bx * 128 + part * 64:bx * 128 + part * 64 + 64])" in text
    assert "Y[bx * 128 + (i + part * 64), c] = S[i, c]" in text
    torch.manual_seed(2)
    x, w = torch.randn(256, 64, dtype=torch.float16), torch.randn(512, 64, dtype=torch.float16)
    want_max, want_last = row_max_reference(x, w)
    for name in ("tile", "consumer_partitions", "layout_inference"):
        m, y = torch.empty(256), torch.empty(256, 64)
        execute(stages[name], [x, w, m, y], {})
        torch.testing.assert_close(m, want_max, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(y, want_last, rtol=1e-3, atol=1e-3)


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.sampled_from([(128, 256), (256, 256), (256, 512)]), block_n=st.sampled_from([32, 64]),
       k=st.sampled_from([32, 64]), trips=st.integers(3, 5), stages=st.integers(2, 3), seed=st.integers(0, 99))
def test_split_programs_match_torch(shape, block_n, k, trips, stages, seed, warp_specialize):
    """Generated row programs (rows, warpgroups, tiles, stages, trip counts above the stage
    count - a producer needs a steady-state loop): the split is planned, and
    interpreter(original) == interpreter(split) == torch."""
    rows, threads = shape
    func = tritile.compile(row_max_program(rows, block_n * trips, k, block_n, stages, threads),
                           out_idx=[2, 3], target="cuda:90").stages[0][1]
    stages_ = stages_with(func)
    split = split_of(stages_["layout_inference"])
    assert split is not None and split.count == threads // 128
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(256, k, generator=gen).half()
    w = torch.randn(block_n * trips, k, generator=gen).half()
    y_full = x.float() @ w.float().T
    want_max = y_full.max(dim=1).values
    want_last = y_full[:, -block_n:] + (torch.arange(256) % rows)[:, None].float()
    for name in ("tile", "consumer_partitions"):
        m, y = torch.empty(256), torch.empty(256, block_n)
        execute(stages_[name], [x, w, m, y], {})
        torch.testing.assert_close(m, want_max, rtol=1e-3, atol=1e-3, msg=lambda msg: f"{name}: {msg}")
        torch.testing.assert_close(y, want_last, rtol=1e-3, atol=1e-3, msg=lambda msg: f"{name}: {msg}")


@pytest.mark.parametrize("case", ["gemm", "one_warpgroup", "reduce_along_rows", "switched_off", "no_producer"])
def test_kernels_that_stay_whole(case, warp_specialize, monkeypatch):
    if case == "gemm":  # a plain GEMM loop: nothing for one warpgroup to run under the other's wgmmas
        func = gemm_ir()
    elif case == "one_warpgroup":
        func = row_max_ir(threads=128)
    elif case == "reduce_along_rows":
        func = row_max_ir(along_rows=True, block_n=128)  # col_best has R entries: only the reduction refuses
    else:
        monkeypatch.setenv("TRITILE_CONSUMER_PARTITIONS" if case == "switched_off" else "TRITILE_WARP_SPECIALIZE", "0")
        func = attention_ir(False)
    final = run_passes(func, H100)[-1][1]
    assert split_of(final) is None
    assert "T.consumer_partitions" not in format_func(final)
    if case in ("gemm", "reduce_along_rows"):  # a producer was planned: the IR says why it stays whole
        reason = {"gemm": "nothing in the loops for one partition's wgmmas to cover",
                  "reduce_along_rows": "a reduction along the rows"}[case]
        assert f"# consumer partitions: not split: {reason}" in format_func(final)


def test_by_default_kernels_of_several_warpgroups_get_a_producer(monkeypatch):
    for switch in ("TRITILE_WARP_SPECIALIZE", "TRITILE_PERSISTENT"):
        monkeypatch.delenv(switch, raising=False)
    attention = run_passes(attention_ir(False), H100)[-1][1]
    assert "warp_specialization" in attention.attrs and split_of(attention) is not None
    causal = run_passes(attention_ir(True), H100)[-1][1]
    assert split_of(causal) is not None
    # the GEMM's two warpgroups cooperate on one 128x256 tile: a producer, persistent, not split
    gemm = run_passes(gemm_ir(), H100)[-1][1]
    assert "warp_specialization" in gemm.attrs and split_of(gemm) is None
    assert "persistent_programs" in gemm.attrs
    # one warpgroup: the producer's extra warpgroup would halve the CTAs per SM
    assert "warp_specialization" not in run_passes(row_max_ir(threads=128), H100)[-1][1].attrs


# examples/gemm_fp8.py's CUDA tiles promoting every 4 k-steps on 3 stages: steps that promote and
# steps that skip (its default promotes every step)
FP8_PROMOTE_4 = dict(block_M=128, block_N=128, block_K=128, num_stages=3, threads=256, promote_every=4)


def fp8_gemm_ir(M=256, N=256, K=1024):
    from examples.gemm_fp8 import gemm_fp8

    return gemm_fp8(M, N, K, **FP8_PROMOTE_4).stages[0][1]


def fp8_operands(M, N, K, seed=3):
    from examples.gemm_fp8 import quantize

    gen = torch.Generator().manual_seed(seed)
    a8, sa = quantize(torch.randn(M, K, generator=gen))
    b8, sb = quantize(torch.randn(N, K, generator=gen))
    scales = torch.stack([sa.float().reshape(()), sb.float().reshape(())])
    return a8, b8, scales, (a8.double() @ b8.double().t()) * (sa.double() * sb.double())


def test_fp8_gemm_rows_split_and_read_the_producers_a_tile_in_place(monkeypatch):
    """FP8 GEMM (examples/gemm_fp8.py at 128x128 tiles, two warpgroups, promotion every 4
    k-steps): by default its rows split across the two warpgroups, each gemm reading
    its 64 rows of the producer's A tile where they are (no per-partition copy), B whole; the
    split program, run by the interpreter, equals the fp64 product of the same fp8 values."""
    monkeypatch.delenv("TRITILE_CONSUMER_PARTITIONS", raising=False)
    monkeypatch.delenv("TRITILE_WARP_SPECIALIZE", raising=False)
    stages = stages_with(fp8_gemm_ir())
    func = stages["consumer_partitions"]
    split = split_of(func)
    assert split is not None and split.count == 2, format_func(func)
    text = format_func(func)
    assert "A_shared = T.alloc_shared([3, 128, 128], float8_e4m3fn)" in text  # the producer's ring, whole
    assert re.search(r"T\.gemm\(A_shared\[\(k_t - 2\) % 3, part \* 64:part \* 64 \+ 64, :\], "
                     r"B_shared\[\(k_t - 2\) % 3, :, :\], partial\[:, :\]", text), text
    a8, b8, scales, exact = fp8_operands(256, 256, 1024)
    for name in ("tile", "consumer_partitions"):
        c = torch.empty(256, 256, dtype=torch.float16)
        execute(stages[name], [a8, b8, scales, c], {})
        torch.testing.assert_close(c.double(), exact, rtol=1e-2, atol=1e-2 * exact.abs().max().item(),
                                   msg=lambda m: f"{name}: {m}")


def test_plain_gemm_splits_only_when_switched_on(monkeypatch):
    """A GEMM whose loop has nothing but its gemm keeps its warpgroups together by default;
    TRITILE_CONSUMER_PARTITIONS=1 splits it too, with the same values."""
    monkeypatch.setenv("TRITILE_CONSUMER_PARTITIONS", "1")
    stages = stages_with(gemm_ir())
    split = split_of(stages["consumer_partitions"])
    assert split is not None and split.count == 2
    torch.manual_seed(4)
    a, b = torch.randn(512, 512, dtype=torch.float16), torch.randn(512, 512, dtype=torch.float16)
    for name in ("tile", "consumer_partitions"):
        c = torch.empty(512, 512, dtype=torch.float16)
        execute(stages[name], [a, b, c], {})
        torch.testing.assert_close(c.float(), a.float() @ b.float(), rtol=1e-2, atol=1e-1, msg=lambda m: f"{name}: {m}")


def test_generated_fp8_gemm_partitions(monkeypatch):
    """The split FP8 GEMM's sm_90 module: each consumer slices its rows of the A slot with the
    partition index (a constexpr of each partition), both release every slot, the promotion
    waits inside its `if` so a wgmma stays in flight across the other steps, ptxas keeps the
    wgmmas pipelined, and the mbarrier protocol, replayed with the partitions running
    concurrently, has no dead wait."""
    from pipeline_programs import mbarrier_problems

    monkeypatch.delenv("TRITILE_CONSUMER_PARTITIONS", raising=False)
    monkeypatch.delenv("TRITILE_WARP_SPECIALIZE", raising=False)
    kernel = JITKernel(fp8_gemm_ir(), target=H100)
    source, ptx = kernel.get_source("gluon"), kernel.get_source("ptx")
    consumer = function(source, "main_consumer")
    assert ", part):" in consumer.splitlines()[0] and "warps_per_cta=[4, 1]" in consumer
    assert ".slice((part * 64), 64, 0), B_shared.index(" in consumer
    assert "mbarrier.init(k_t_bars_empty.index(_stage), count=2)" in source
    steady = consumer.split("for k_t in range(")[1]
    promote = steady.index("if ((((k_t - 2) + 1) % 4) == 0):")
    assert steady.index("warpgroup_mma_wait(num_outstanding=0", promote) < steady.index("total = (total + partial)")
    assert "warpgroup_mma_wait(num_outstanding=1" in steady  # the steps that skip the promotion
    advisories = ptxas_advisories(ptx)
    assert not [line for line in advisories if "C75" in line or "serialized" in line], advisories
    args = [torch.zeros(p.shape, dtype=p.dtype.torch) for p in kernel.func.params]
    assert mbarrier_problems(source, args) == []


# ------------------------------------------------------------------ generated code (sm_90, CPU)


def test_generated_partitions(warp_specialize):
    kernel = JITKernel(attention_ir(False), target=H100)
    source, ptx = kernel.get_source("gluon"), kernel.get_source("ptx")
    consumer = function(source, "main_consumer")
    assert consumer.startswith("def main_consumer(") and ", part):" in consumer.splitlines()[0]
    assert "warps_per_cta=[4, 1]" in consumer and "warps_per_cta=[8, 1]" not in source
    assert "Q_shared.index(part)" in consumer and "tma.async_copy_global_to_shared" not in consumer
    # both consumers release every slot: the producer's empty barriers count two arrivals
    assert "mbarrier.init(k_t_bars_empty.index(_stage), count=2)" in source
    fork = next(line for line in source.splitlines() if "gl.warp_specialize(" in line)
    assert fork.count("(main_consumer, (") == 2 and fork.endswith("[4, 1], [240, 24])")
    assert re.search(r"Q_shared_free, 0,\)\), \(main_consumer, \(.*Q_shared_free, 1,\)\)", fork)
    # the producer also loads each consumer's Q rows once per tile (a tile load)
    producer = function(source, "main_producer")
    assert producer.count("tma.async_copy_global_to_shared(Q_desc") == 2
    assert consumer.index("mbarrier.wait(Q_shared_loaded.index(part), ") < consumer.index("warpgroup_mma(Q_shared")
    assert consumer.count("mbarrier.arrive(Q_shared_free.index(part))") == 1
    regs = set(re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx))
    assert {"240", "24"} <= regs and "wgmma.mma_async" in ptx
    assert kernel._codegen(H100).metadata.num_warps == 12  # two consumer warpgroups + the producer's


def ptxas_advisories(ptx: str) -> list:
    """ptxas's info lines for `ptx` compiled for sm_90a (with -v: registers, performance advisories)."""
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        run = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True, check=True)
    return run.stderr.splitlines()


@pytest.mark.parametrize("causal", [False, True])
def test_split_attention_keeps_its_wgmmas_pipelined(causal, monkeypatch):
    """The example's default schedule at the benchmark's shape (split, persistent): ptxas
    pipelines the consumers' wgmmas.  Causal's consumer waits on its PV wgmma at the end of
    the iteration; left in flight across the back edge, ptxas serialized every wgmma of the
    kernel (advisory C7512) - a wait after each of them, measured on an H100 as half of all
    warp stall samples (bench/NOTES.md, session 10)."""
    from examples.flash_attention import flashattn, tile_config

    for switch in ("TRITILE_WARP_SPECIALIZE", "TRITILE_PERSISTENT", "TRITILE_CONSUMER_PARTITIONS"):
        monkeypatch.delenv(switch, raising=False)
    kernel = JITKernel(flashattn.fn(4, 32, 4096, 4096, 128, causal, **tile_config("cuda", 128)), target=H100)
    source, ptx = kernel.get_source("gluon"), kernel.get_source("ptx")
    consumer = function(source, "main_consumer")
    assert "for tile_iter in range(" in consumer and ", part):" in consumer.splitlines()[0]
    advisories = ptxas_advisories(ptx)
    assert not [line for line in advisories if "C7512" in line or "serialized" in line], advisories
    steady = consumer.split("for k_t in range(")[1].split("\n        mbarrier")[0].split("\n        if")[0]
    last_issue = steady.rindex("warpgroup_mma(")
    if causal:  # the iteration ends with the wait on its PV wgmma
        assert "warpgroup_mma_wait(num_outstanding=0" in steady[last_issue:]
        assert "warpgroup_mma_wait(" not in steady[:steady.index("warpgroup_mma(")]


def test_split_attention_stores_each_tile_with_a_tma_store_that_drains_under_the_next(monkeypatch):
    """The example's epilogue (``T.copy(acc_o, O_shared); T.copy(O_shared, Output[..])``) in
    the persistent split kernel: each consumer stores its rows with one TMA store read straight
    from its O_shared slot, waited for only before the next tile writes that slot and after
    the tile loop - no register round trip and no global stores from the consumers.  Upper
    bound measured before (bench/NOTES.md, session 12): dropping the old epilogue's read-back
    and global stores gave the non-causal kernel 3-8 %."""
    from examples.flash_attention import flashattn, tile_config

    for switch in ("TRITILE_WARP_SPECIALIZE", "TRITILE_PERSISTENT", "TRITILE_CONSUMER_PARTITIONS"):
        monkeypatch.delenv(switch, raising=False)
    kernel = JITKernel(flashattn.fn(4, 32, 4096, 4096, 128, False, **tile_config("cuda", 128)), target=H100)
    consumer = function(kernel.get_source("gluon"), "main_consumer")
    tile_loop = consumer[consumer.index("for tile_iter in range("):]
    write = tile_loop.index("O_shared.index(part).store(")
    store = tile_loop.index("tma.async_copy_shared_to_global(Output_desc, [")
    assert tile_loop.rindex("tma.store_wait(0)", 0, write) > tile_loop.rindex("for k_t in range(", 0, write)
    assert write < store and tile_loop.count("tma.store_wait(0)") == 2
    assert tile_loop.rindex("tma.store_wait(0)") > store and tile_loop.rstrip().endswith("tma.store_wait(0)")
    assert "gl.store(" not in consumer and "O_shared.index(part).load(" not in consumer


@pytest.mark.parametrize("causal", [False, True])
def test_one_warpgroup_attention_keeps_its_wgmmas_pipelined(causal, monkeypatch):
    """The example's head-dim-64 configs (64x128 tiles, or 64x64 when causal; one warpgroup,
    no producer): with the causal mask applied after QK^T (accumulator_init), a PV wgmma left in
    flight across the back edge made ptxas serialize every wgmma (C7515); the loop now retires
    it at the end of the body.  The CTAs an SM holds by shared memory (four of 64x64, three of
    64x128) must fit its registers too."""
    from examples.flash_attention import flashattn, tile_config

    for switch in ("TRITILE_WARP_SPECIALIZE", "TRITILE_PERSISTENT", "TRITILE_CONSUMER_PARTITIONS"):
        monkeypatch.delenv(switch, raising=False)
    config = tile_config("cuda", 64, causal)
    kernel = JITKernel(flashattn.fn(16, 16, 1024, 1024, 64, causal, **config), target=H100)
    assert "gl.warp_specialize(" not in kernel.get_source("gluon")
    advisories = ptxas_advisories(kernel.get_source("ptx"))
    assert not [line for line in advisories if "C75" in line or "serialized" in line], advisories
    registers = int(re.search(r"Used (\d+) registers", "\n".join(advisories)).group(1))
    ctas_by_shared_memory = (228 * 1024) // (kernel._codegen(H100).metadata.shared + 1024)
    assert ctas_by_shared_memory >= 3
    assert registers * config["threads"] * ctas_by_shared_memory <= 65536, advisories


# ------------------------------------------------------------------ GPU


def close(out, ref, rel=1e-2):
    torch.testing.assert_close(out.float(), ref.float(), rtol=rel, atol=rel * ref.float().abs().max().item())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_split_attention_on_gpu(causal, warp_specialize):
    from examples.flash_attention import ref_program

    func = attention_ir(causal, seq=1024)
    kernel = JITKernel(func, target=H100)
    assert split_of(kernel.stages[-1][1]) is not None
    q, k, v = (torch.randn(1, 2, 1024, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    close(kernel(q, k, v), ref_program(q, k, v, causal))


@pytest.mark.parametrize("rows, threads", [(128, 256), (256, 512)])  # two and four consumer warpgroups
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_split_row_reduction_on_gpu(rows, threads, warp_specialize):
    kernel = JITKernel(row_max_ir(rows=rows, threads=threads), target=H100)
    assert split_of(kernel.stages[-1][1]).count == threads // 128
    x, w = torch.randn(256, 64, device="cuda", dtype=torch.float16), torch.randn(512, 64, device="cuda", dtype=torch.float16)
    m, y = kernel(x, w)
    want_max, y_full = row_max_reference(x.cpu(), w.cpu())[0], x.cpu().float() @ w.cpu().float().T
    want_last = y_full[:, -64:] + (torch.arange(256) % rows)[:, None].float()
    torch.testing.assert_close(m.cpu(), want_max, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(y.cpu(), want_last, rtol=1e-3, atol=1e-3)
