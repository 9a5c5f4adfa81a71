"""Gluon backend: CPU compile tests (no GPU needed) for sm_90 and sm_80.

Programs are built as the frontend's IR (`pipelined_gemm` mirrors a TileLang GEMM with
``T.Pipelined(K // BK, num_stages=S)``), run through the whole pass list
(`tritile.lowering.run_passes`: pipelining, versioning, injection, budget, layouts) and
compiled to PTX.  `tests/test_gpu.py` launches the same
kernels on a GPU.
"""
from __future__ import annotations

import re

import pytest
import torch

import tritile.language as T
from tritile.errors import CompileError
from tritile.ir import dtypes as dt
from tritile.ir import layouts as lay
from tritile.ir import nodes as ir
from tritile.ir.transform import walk
from tritile.runtime.target import Target

LOC = ir.SourceLoc("test_codegen.py", 1, 0, "for ko in T.Pipelined(K // BK, num_stages=S):")
H100 = Target("cuda", 90)
TMA_LOAD = "cp.async.bulk.tensor.2d.shared::cluster.global"  # PTX of a TMA global->shared copy
TMA_STORE = "cp.async.bulk.tensor.2d.global.shared::cta"  # PTX of a TMA shared->global copy
A100 = Target("cuda", 80)


def c(v):
    return ir.const(v)


def add(a, b):
    return ir.BinOp("+", a, b if isinstance(b, ir.Expr) else c(b))


def mul(a, b):
    return ir.BinOp("*", a, b if isinstance(b, ir.Expr) else c(b))


def mod(a, b):
    return ir.BinOp("%", a, b if isinstance(b, ir.Expr) else c(b))


def region(buf, starts, extents):
    return ir.Region(buf, tuple(s if isinstance(s, ir.Expr) else c(s) for s in starts), tuple(extents))


def pipelined_gemm(M=256, N=256, K=256, BM=128, BN=128, BK=64, S=3, dtype=dt.float16, threads=128,
                   transpose_b=False, dynamic_m=False):
    """C = A @ B (or A @ B.T with transpose_b) as the frontend builds it from

        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((BM, BK), dtype); B_shared = ...; C_local = T.alloc_fragment((BM, BN), "float32")
            T.clear(C_local)
            for ko in T.Pipelined(K // BK, num_stages=S):
                T.copy(A[by * BM, ko * BK], A_shared); T.copy(B[ko * BK, bx * BN], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * BM, bx * BN])
    """
    m_dim = ir.Var("M") if dynamic_m else M
    A = ir.Buffer("A", (m_dim, K), dtype, "global")
    B = ir.Buffer("B", (N, K) if transpose_b else (K, N), dtype, "global")
    C = ir.Buffer("C", (m_dim, N), dtype, "global")
    bx, by, ko = ir.Var("bx"), ir.Var("by"), ir.Var("ko")
    A_s = ir.Buffer("A_shared", (BM, BK), dtype, "shared")
    B_s = ir.Buffer("B_shared", (BN, BK) if transpose_b else (BK, BN), dtype, "shared")
    C_l = ir.Buffer("C_local", (BM, BN), dt.float32, "fragment")
    k0 = mul(ko, BK)
    b_src = region(B, (mul(bx, BN), k0), (BN, BK)) if transpose_b else region(B, (k0, mul(bx, BN)), (BK, BN))
    body = [ir.Copy(region(A, (mul(by, BM), k0), (BM, BK)), ir.Region.full(A_s), loc=LOC),
            ir.Copy(b_src, ir.Region.full(B_s), loc=LOC),
            ir.Gemm(ir.Region.full(A_s), ir.Region.full(B_s), ir.Region.full(C_l), transpose_b=transpose_b, loc=LOC)]
    loop = ir.For(ko, c(0), c(K // BK), ir.Seq(body), kind="pipelined", num_stages=S, loc=LOC)
    stmts = [ir.Alloc(A_s), ir.Alloc(B_s), ir.Alloc(C_l), ir.Fill(ir.Region.full(C_l), ir.const(0.0)), loop,
             ir.Copy(ir.Region.full(C_l), region(C, (mul(by, BM), mul(bx, BN)), (BM, BN)), loc=LOC)]
    m_blocks = ir.BinOp("//", add(m_dim, BM - 1), c(BM)) if dynamic_m else c(M // BM)
    kernel = ir.Kernel((c(N // BN), m_blocks), (bx, by), threads, ir.Seq(stmts))
    return ir.PrimFunc("matmul", [A, B, C], kernel, out_idx=[2],
                       dynamic_vars=[m_dim] if dynamic_m else [], dim_bindings={m_dim: (0, 0)} if dynamic_m else {})


def softmax_rows(M=256, N=64, BM=64, threads=128, dtype=dt.float16):
    """Row softmax: a fragment load, reduce_max / reduce_sum and T.Parallel elementwise
    with 1-D broadcasting, stored straight to global from T.Parallel."""
    X = ir.Buffer("X", (M, N), dtype, "global")
    Y = ir.Buffer("Y", (M, N), dtype, "global")
    bx, i, j = ir.Var("bx"), ir.Var("i"), ir.Var("j")
    x = ir.Buffer("x_frag", (BM, N), dt.float32, "fragment")
    row_max = ir.Buffer("row_max", (BM,), dt.float32, "fragment")
    row_sum = ir.Buffer("row_sum", (BM,), dt.float32, "fragment")
    xij = ir.Load(x, (i, j), dt.float32)
    loc = ir.SourceLoc("softmax.py", 12, 0, "for i, j in T.Parallel(BM, N):")
    stmts = [
        ir.Alloc(x), ir.Alloc(row_max), ir.Alloc(row_sum),
        ir.Copy(region(X, (mul(bx, BM), 0), (BM, N)), ir.Region.full(x)),
        ir.Reduce("max", ir.Region.full(x), ir.Region.full(row_max), dim=1),
        ir.Parallel((i, j), (BM, N), ir.Seq([ir.Store(x, (i, j), ir.Call(
            "exp2", (mul(ir.BinOp("-", xij, ir.Load(row_max, (i,), dt.float32), dt.float32), ir.const(1.4426950408889634)),),
            dt.float32))]), loc=loc),
        ir.Reduce("sum", ir.Region.full(x), ir.Region.full(row_sum), dim=1),
        ir.Parallel((i, j), (BM, N), ir.Seq([ir.Store(Y, (add(mul(bx, BM), i), j), ir.Cast(
            ir.BinOp("/", xij, ir.Load(row_sum, (i,), dt.float32), dt.float32), dtype))]), loc=loc),
    ]
    kernel = ir.Kernel((c(M // BM),), (bx,), threads, ir.Seq(stmts))
    return ir.PrimFunc("softmax", [X, Y], kernel, out_idx=[1])


def shared_operand_two_gemms(order=(0, 1), dtype=dt.float16, n=64):
    """Seed 003 (FlashAttention-backward pattern): X_s feeds gemm(A_s, X_s, C1,
    transpose_B=True) and gemm(Y_s, X_s, C2); `order` permutes the two gemms."""
    A = ir.Buffer("A", (n, n), dtype, "global")
    X = ir.Buffer("X", (n, n), dtype, "global")
    Y = ir.Buffer("Y", (n, n), dtype, "global")
    O1 = ir.Buffer("O1", (n, n), dt.float32, "global")
    O2 = ir.Buffer("O2", (n, n), dt.float32, "global")
    bx = ir.Var("bx")
    A_s, X_s, Y_s = (ir.Buffer(nm, (n, n), dtype, "shared") for nm in ("A_s", "X_s", "Y_s"))
    C1, C2 = (ir.Buffer(nm, (n, n), dt.float32, "fragment") for nm in ("C1", "C2"))
    gemms = [ir.Gemm(ir.Region.full(A_s), ir.Region.full(X_s), ir.Region.full(C1), transpose_b=True, clear_accum=True),
             ir.Gemm(ir.Region.full(Y_s), ir.Region.full(X_s), ir.Region.full(C2), clear_accum=True)]
    stmts = [*(ir.Alloc(b) for b in (A_s, X_s, Y_s, C1, C2)),
             *(ir.Copy(ir.Region.full(g), ir.Region.full(s)) for g, s in ((A, A_s), (X, X_s), (Y, Y_s))),
             *(gemms[k] for k in order),
             ir.Copy(ir.Region.full(C1), ir.Region.full(O1)), ir.Copy(ir.Region.full(C2), ir.Region.full(O2))]
    kernel = ir.Kernel((c(1),), (bx,), 128, ir.Seq(stmts))
    return ir.PrimFunc("two_gemms", [A, X, Y, O1, O2], kernel, out_idx=[3, 4])


def lowered(func, target):
    from tritile.lowering import run_passes

    return run_passes(func, target)[-1][1]


def compile_for(func, target):
    from tritile.codegen.gluon import compile_kernel

    return compile_kernel(lowered(func, target), target)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TRITILE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tritile-cache"))


def test_sm90_pipelined_gemm_uses_tma_wgmma_mbarrier():
    from tritile.codegen.gluon import compile_kernel

    func = lowered(pipelined_gemm(S=3), H100)
    k = compile_kernel(func, H100)
    ptx = k.asm["ptx"]
    assert ".target sm_90a" in ptx
    assert "wgmma.mma_async" in ptx
    assert "cp.async.bulk.tensor" in ptx
    assert "mbarrier" in ptx
    planned = func.attrs["shared_bytes"]  # the budget pass: 3 versions of both tiles + a 3-slot mbarrier ring
    assert planned == 3 * (128 * 64 + 64 * 128) * 2 + 3 * 8
    assert planned <= k.metadata.shared <= planned + 1024
    assert k.metadata.num_warps == 4


def test_sm90_generated_source_is_readable():
    k = compile_for(pipelined_gemm(S=3), H100)
    src = k.source
    for name in ("A_shared", "B_shared", "C_local", "ko_t", "bx", "by"):
        assert re.search(rf"\b{name}\b", src), name
    assert "warpgroup_mma(A_shared.index(((ko_t - 2) % 3)), B_shared.index(((ko_t - 2) % 3)), C_local" in src
    assert "mbarrier.wait(ko_t_bars.index((ko_t - 2) % 3), ((ko_t - 2) // 3) & 1" in src
    assert "tma.async_copy_global_to_shared(A_desc" in src
    assert not any(";" in line for line in src.splitlines())
    assert "ttgir" in k.asm and "ptx" in k.asm


def test_sm80_pipelined_gemm_uses_mma_sync_and_cp_async():
    k = compile_for(pipelined_gemm(S=3, transpose_b=True, dynamic_m=True), A100)
    ptx = k.asm["ptx"]
    assert "mma.sync" in ptx
    assert "cp.async" in ptx
    assert "wgmma" not in ptx


def test_sm90_dynamic_m_transposed_b_compiles():
    k = compile_for(pipelined_gemm(S=2, BN=64, transpose_b=True, dynamic_m=True), H100)
    assert "wgmma.mma_async" in k.asm["ptx"]
    assert ".permute((1, 0))" in k.source
    assert "def tritile_launch(launch, A, B, C, M):" in k.source


def test_elementwise_and_reductions_compile():
    k = compile_for(softmax_rows(), H100)
    assert "gl.max(x_frag, axis=1)" in k.source
    assert "gl.sum(x_frag, axis=1)" in k.source
    assert "ex2" in k.asm["ptx"]


def test_compile_cache_hits_memory_and_writes_source(tmp_path_factory):
    from tritile.runtime import cache

    from tritile.codegen.gluon import compile_kernel

    func = lowered(pipelined_gemm(S=3), H100)
    first = compile_kernel(func, H100)
    assert compile_kernel(func, H100) is first
    files = list((cache.cache_dir() / "gluon").glob("k_*.py"))
    assert any(f.read_text() == first.source for f in files)


def test_unsupported_construct_is_a_compile_error_with_location():
    func = softmax_rows()
    par = func.kernel.body.stmts[5]
    bad = ir.Parallel(par.vars, (48, 64), par.body, loc=par.loc)
    func.kernel.body.stmts[5] = bad
    with pytest.raises(CompileError) as info:
        compile_for(func, H100)
    assert "not supported by the Gluon backend" in str(info.value)
    assert "softmax.py:12" in str(info.value)


@pytest.mark.parametrize("order", [(0, 1), (1, 0)], ids=["transposed_first", "plain_first"])
@pytest.mark.parametrize("target", [H100, A100], ids=["sm90", "sm80"])
def test_seed003_shared_tile_for_two_gemm_transposes_compiles(target, order):
    k = compile_for(shared_operand_two_gemms(order=order), target)
    ptx = k.asm["ptx"]
    assert ("wgmma.mma_async" if target is H100 else "mma.sync") in ptx


def register_operand_gemm(n=64, d=64, dtype=dt.float16):
    """O = cast(0.125 * Q @ K^T) @ V: the second gemm takes A from a fragment
    (FlashAttention's P @ V), written by T.Parallel from the first gemm's accumulator."""
    Q, K, V = (ir.Buffer(nm, (n, d), dtype, "global") for nm in ("Q", "K", "V"))
    O = ir.Buffer("O", (n, d), dt.float32, "global")
    bx, i, j = ir.Var("bx"), ir.Var("i"), ir.Var("j")
    Q_s, K_s, V_s = (ir.Buffer(nm, (n, d), dtype, "shared") for nm in ("Q_shared", "K_shared", "V_shared"))
    S = ir.Buffer("acc_s", (n, n), dt.float32, "fragment")
    P = ir.Buffer("acc_s_cast", (n, n), dtype, "fragment")
    acc_o = ir.Buffer("acc_o", (n, d), dt.float32, "fragment")
    scaled = ir.BinOp("*", ir.Load(S, (i, j), dt.float32), ir.const(0.125), dt.float32)
    stmts = [*(ir.Alloc(b) for b in (Q_s, K_s, V_s, S, P, acc_o)),
             *(ir.Copy(ir.Region.full(g), ir.Region.full(s)) for g, s in ((Q, Q_s), (K, K_s), (V, V_s))),
             ir.Gemm(ir.Region.full(Q_s), ir.Region.full(K_s), ir.Region.full(S), transpose_b=True, clear_accum=True),
             ir.Parallel((i, j), (n, n), ir.Seq([ir.Store(P, (i, j), ir.Cast(scaled, dtype))])),
             ir.Gemm(ir.Region.full(P), ir.Region.full(V_s), ir.Region.full(acc_o), clear_accum=True),
             ir.Copy(ir.Region.full(acc_o), ir.Region.full(O))]
    kernel = ir.Kernel((c(1),), (bx,), 128, ir.Seq(stmts))
    return ir.PrimFunc("attention_block", [Q, K, V, O], kernel, out_idx=[3])


@pytest.mark.parametrize("target", [H100, A100], ids=["sm90", "sm80"])
def test_register_operand_gemm_compiles(target):
    k = compile_for(register_operand_gemm(), target)
    assert ("wgmma.mma_async" if target is H100 else "mma.sync") in k.asm["ptx"]
    assert "operand_index=0" in k.source


# the pipeline pass tests' programs: sibling loops with different stage counts, data-dependent
# (block-sparse) guards, runtime trip counts, an outer loop around the pipeline
PIPELINE_CASES = {
    "siblings_2_4": dict(loops=[(2, 3, False, False), (4, 5, False, False)]),
    "guarded": dict(loops=[(3, 5, True, False)]),
    "dynamic_outer": dict(loops=[(3, 4, False, True)], outer=2),
    "read_after_short": dict(loops=[(3, 2, False, False)], read_after=True),
}


def pipeline_program(name):
    import dataclasses

    from pipeline_programs import LoopSpec, gemm_program

    cfg = dict(PIPELINE_CASES[name])
    loops = [LoopSpec(s, n, guarded=g, dynamic=d) for s, n, g, d in cfg.pop("loops")]
    prog = gemm_program(loops, tiles=(64, 64, 64), grid=(2, 1), **cfg)
    prog.func = dataclasses.replace(prog.func, dynamic_vars=list(prog.dims))
    return prog


@pytest.mark.parametrize("name", sorted(PIPELINE_CASES))
def test_pipeline_pass_programs_compile_for_sm90(name):
    k = compile_for(pipeline_program(name).func, H100)
    ptx = k.asm["ptx"]
    assert "wgmma.mma_async" in ptx
    if name == "guarded":  # data-dependent producers: cp.async groups, never a possibly-empty mbarrier phase
        assert TMA_LOAD not in ptx and "cp.async.cg" in ptx
    if name in ("siblings_2_4", "dynamic_outer"):
        assert TMA_LOAD in ptx


def test_layouts_chosen_for_another_target_are_reinferred():
    from tritile.codegen.gluon import compile_kernel

    planned_for_hopper = lowered(pipelined_gemm(S=2, BK=32), H100)
    k = compile_kernel(planned_for_hopper, A100)
    assert "mma.sync" in k.asm["ptx"]
    assert "version=[2, 0]" in k.source and "version=[3, 0]" not in k.source


def test_undeclared_runtime_value_is_a_compile_error():
    func = pipeline_program("dynamic_outer").func
    import dataclasses

    func = dataclasses.replace(func, dynamic_vars=[])  # n0 used but never declared T.dynamic
    with pytest.raises(CompileError, match="n0"):
        compile_for(func, H100)


def scan_and_atomics(n=64):
    """Y = cumsum(X, dim=1); Z += X (tile atomic); W[0] += 1 (scalar atomic) per block."""
    X = ir.Buffer("X", (n, n), dt.float32, "global")
    Y = ir.Buffer("Y", (n, n), dt.float32, "global")
    Z = ir.Buffer("Z", (n, n), dt.float32, "global")
    W = ir.Buffer("W", (1,), dt.float32, "global")
    bx = ir.Var("bx")
    x = ir.Buffer("x_frag", (n, n), dt.float32, "fragment")
    y = ir.Buffer("y_frag", (n, n), dt.float32, "fragment")
    stmts = [ir.Alloc(x), ir.Alloc(y),
             ir.Copy(ir.Region.full(X), ir.Region.full(x)),
             ir.Cumsum(ir.Region.full(x), ir.Region.full(y), dim=1),
             ir.Copy(ir.Region.full(y), ir.Region.full(Y)),
             ir.AtomicAdd(ir.Region.full(Z), ir.Region.full(x)),
             ir.AtomicAdd(region(W, (0,), (1,)), ir.const(1.0))]
    kernel = ir.Kernel((c(2),), (bx,), 128, ir.Seq(stmts))
    return ir.PrimFunc("scan_atomics", [X, Y, Z, W], kernel)


def test_scan_and_atomics_compile():
    k = compile_for(scan_and_atomics(), H100)
    assert "gl.associative_scan(x_frag, 1, _add_combine" in k.source
    assert "atom.global" in k.asm["ptx"] or "red.global" in k.asm["ptx"]


def _example_gemm(M, N, K):
    from examples.gemm import matmul, tile_config
    from tritile.frontend import parse_kernel

    return parse_kernel(matmul.fn, dict(M=M, N=N, K=K, **tile_config("cuda", M, N, K)))


def test_sm90_example_gemm_keeps_one_wgmma_in_flight_and_stores_with_tma(monkeypatch):
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "0")  # the kernel's own warps issue the TMA copies
    k = compile_for(_example_gemm(512, 512, 512), H100)
    src, ptx = k.source, k.asm["ptx"]
    steady = src.split("for k_t in range(")[1].split("\n    mbarrier.wait")[0]
    # consumers first: issue gemm(t-2), retire gemm(t-3) only, then refill its slot
    assert steady.index("warpgroup_mma(") < steady.index("num_outstanding=1") < steady.index("tma.async_copy_global")
    assert "num_outstanding=0" not in steady
    assert TMA_LOAD in ptx and TMA_STORE in ptx and "wgmma.wait_group.sync.aligned 1" in ptx
    assert "tma.async_copy_shared_to_global(C_desc" in src and "gl.store(" not in src
    assert k.metadata.num_warps == 8 and "warps_per_cta=[8, 1]" in src


def test_sm90_use_swizzle_rasterises_blocks_in_panels(monkeypatch):
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "0")  # one CTA per tile, in launch order
    src = compile_for(_example_gemm(512, 512, 512), H100).source
    assert "programs walk panels of 10 rows" in src and "gl.num_programs(0)" in src


def test_sm90_attention_loads_k_v_with_tma_over_rows_view():
    from examples.flash_attention import flashattn, tile_config

    func = flashattn.fn(2, 2, 256, 256, 64, True, **tile_config("cuda"))
    k = compile_for(func, H100)
    assert k.asm["ptx"].count(TMA_LOAD) >= 2
    # the generated launcher addresses K and V through their [B*H*S, D] rows view
    q, key, v, out = (torch.randn(2, 2, 256, 64, dtype=torch.float16) for _ in range(4))
    launches = []
    k._host_launch(lambda *launch: launches.append(launch), q, key, v, out)
    grid, tensors, tma_operands, dims = launches[0]
    assert tensors == (q, key, v, out) and dims == ()
    rows_views = [(shape, strides) for tensor, shape, strides in tma_operands if tensor is key or tensor is v]
    assert rows_views and all(view == ((2 * 2 * 256, 64), (64, 1)) for view in rows_views)


def test_sm90_attention_overlaps_pv_wgmma_with_the_softmax(monkeypatch):
    from examples.flash_attention import flashattn, tile_config

    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "0")  # the kernel's own warps issue the TMA copies
    k = compile_for(flashattn.fn(1, 2, 1024, 1024, 128, False, **tile_config("cuda")), H100)
    src, ptx = k.source, k.asm["ptx"]
    steady = src.split("for k_t in range(")[1].split("\n    mbarrier")[0]
    # PV of i-1 is issued after QK^T of i; only QK^T is retired before the row max
    pv = steady.index("warpgroup_mma(acc_s_cast")
    assert steady.index("warpgroup_mma(Q_shared") < pv < steady.index("num_outstanding=1") < steady.index("gl.max(")
    # the P operand stays live until the wait that retires PV, which precedes its rewrite
    assert "warpgroup_mma_wait(num_outstanding=0, deps=(acc_o, acc_s_cast))" in steady
    assert steady.index("gl.exp2(") < steady.index("num_outstanding=0")
    # K of i+1 and V of i share one barrier (the group's), waits cover groups up to stop + 1
    assert "V_shared.index(((k_t - 1) % 2))" in steady and "k_t_bars.index(k_t % 2), V_shared" in steady
    assert "< (8 + 1)" in steady
    assert "wgmma.wait_group.sync.aligned 1" in ptx


def _steady_loop_ptx(ptx: str) -> str:
    """The PTX of the first loop: from its header label to the branch back to it."""
    header = re.search(r"^(\$L__BB\d+_\d+):.*Inner Loop Header", ptx, re.M)
    back = re.search(r"bra(\.uni)?\s+" + re.escape(header.group(1)) + ";", ptx[header.end():])
    return ptx[header.start():header.end() + back.end()]


def test_sm90_attention_tma_lanes_take_one_cta_barrier_per_kind_of_mbarrier_op(monkeypatch):
    """Opt-in lanes: K and V signal barriers of their own allocations (one commit group, one
    phase: a lane without a copy in a group still arrives, with 0 bytes), so Triton's Membar
    puts one bar.sync before the step's expects and one before its copies instead of one
    before every mbarrier operation."""
    from examples.flash_attention import flashattn, tile_config

    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "0")  # lanes are barriers of the kernel's own TMA copies

    def steady_state(lanes: str, heads: int):
        monkeypatch.setenv("TRITILE_TMA_LANES", lanes)
        # a shape per setting: the in-process compile cache is keyed by the IR only
        k = compile_for(flashattn.fn(1, heads, 1024, 1024, 128, False, **tile_config("cuda")), H100)
        return k.source, k.source.split("for k_t in range(")[1].split("\n    mbarrier")[0], \
            _steady_loop_ptx(k.asm["ptx"])

    src, steady, loop = steady_state("1", 3)
    assert "k_t_bars_1.index(k_t % 2), V_shared" in steady and "k_t_bars.index(k_t % 2), K_shared" in steady
    assert "mbarrier.expect(k_t_bars_1.index(0), 0)" in src  # group 0 has no V copy
    assert steady.count("mbarrier.expect(") == 2
    assert loop.count("bar.sync") == 4
    _, steady, loop = steady_state("0", 5)
    assert steady.count("mbarrier.expect(k_t_bars.index(k_t % 2), 65536)") == 1
    assert loop.count("bar.sync") == 5


def test_cache_hit_binds_the_callers_runtime_dims():
    """Two IRs that print the same share one compiled kernel, and each launches with its own
    runtime-dim Vars (a cache hit used to keep the first IR's Vars: KeyError at launch)."""
    from pipeline_programs import LoopSpec, gemm_program

    from tritile.codegen.gluon import compile_kernel
    from tritile.lowering import run_passes

    target = Target("cuda", 90)
    first, second = (gemm_program([LoopSpec(3, 4, dynamic=True)]) for _ in range(2))
    k1 = compile_kernel(run_passes(first.func, target)[-1][1], target)
    k2 = compile_kernel(run_passes(second.func, target)[-1][1], target)
    assert k2.compiled is k1.compiled
    assert k2._runtime_vars == list(second.func.dynamic_vars) != list(first.func.dynamic_vars)


# ---------------------------------------------------------------- persistent tiles


def _persistent(func, programs):
    from tritile.lowering.persistent_tiles import persist

    return persist(lowered(func, H100), programs)


@pytest.mark.parametrize("programs,stages,M,N,K", [(3, 3, 160, 192, 96), (5, 2, 96, 224, 160), (7, 4, 64, 64, 32)])
def test_persistent_tiles_keep_interpreter_results(programs, stages, M, N, K):
    """Persistent scheduling (fewer programs than tiles, a tile count not a multiple of
    them, every tile once in panel order) gives the non-persistent program's values;
    the interpreter also checks that no async copy or gemm hazard crosses a tile boundary."""
    import torch

    from examples.gemm import matmul
    from tritile.frontend import parse_kernel
    from tritile.interpreter import execute

    func = parse_kernel(matmul.fn, dict(M=M, N=N, K=K, block_M=32, block_N=32, block_K=32, num_stages=stages))
    persistent = _persistent(func, programs)
    loop = persistent.kernel.body.stmts[-1]
    assert isinstance(loop, ir.For) and loop.var is persistent.attrs["persistent_tile_loop"]
    a, b = torch.randn(M, K, dtype=torch.float16), torch.randn(K, N, dtype=torch.float16)
    ref = a.float() @ b.float()
    for f in (func, persistent):
        c_out = torch.full((M, N), float("nan"), dtype=torch.float16)  # every element must be written
        execute(f, [a, b, c_out], {})
        torch.testing.assert_close(c_out.float(), ref, rtol=1e-2, atol=1e-2)


def test_persistent_tiles_by_default_only_for_warp_specialized_kernels(monkeypatch):
    from test_warp_specialization import attention_ir
    from tritile.lowering import persistent_tiles, run_passes

    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "0")
    gemm = lowered(_example_gemm(2048, 4096, 256), H100)
    monkeypatch.delenv("TRITILE_PERSISTENT", raising=False)  # auto: measured neutral without a producer
    assert "persistent_tile_loop" not in persistent_tiles.run(gemm, H100).attrs
    monkeypatch.delenv("TRITILE_WARP_SPECIALIZE")
    assert run_passes(attention_ir(True), H100)[-1][1].attrs["persistent_programs"] == 132
    monkeypatch.setenv("TRITILE_PERSISTENT", "1")
    assert persistent_tiles.run(gemm, H100).attrs.get("persistent_tile_loop") is not None
    assert "persistent_tile_loop" not in persistent_tiles.run(gemm, Target("cpu")).attrs
    monkeypatch.setenv("TRITILE_PERSISTENT", "0")
    assert "persistent_tile_loop" not in run_passes(attention_ir(True), H100)[-1][1].attrs


def test_sm90_persistent_gemm_continues_the_ring_phase_and_overlaps_the_store(monkeypatch):
    """The mbarrier ring is initialised once, before the tile loop; a tile's groups use slots
    g % S and each slot's phase continues from the earlier tiles' uses (phase bits flipped
    after each tile); the TMA store of a tile is waited on only before the staging tile is
    written again (the next tile's epilogue) and after the loop."""
    monkeypatch.setenv("TRITILE_PERSISTENT", "1")
    monkeypatch.setenv("TRITILE_WARP_SPECIALIZE", "0")  # the kernel's own warps issue the TMA copies
    func = _example_gemm(2048, 4096, 512)  # 16 x 16 = 256 tiles of 128x256 on 132 SMs
    from tritile.codegen.gluon import compile_kernel

    k = compile_kernel(lowered(func, H100), H100)
    src, ptx = k.source, k.asm["ptx"]
    loop = src.index("for tile_iter in range(")
    assert src.index("mbarrier.init(") < loop < src.index("mbarrier.expect(")
    assert src.index("mbarrier.invalidate(") > src.rindex("tma.async_copy_shared_to_global(")
    # 512 / 64 = 8 commit groups per tile on 3 slots: slots 0 and 1 are used 3 times, slot 2 twice
    assert "k_t_bars_phase_bits = k_t_bars_phase_bits ^ 3\n" in src
    assert "mbarrier.wait(k_t_bars.index(1), (2 ^ (k_t_bars_phase_bits >> 1)) & 1)" in src
    assert "tile = gl.minimum(((tile_iter * 132) + (pid + ((tile_iter % 2) * (131 - (2 * pid))))), 255)" \
        in src
    assert src.index("gl.allocate_shared_memory(gl.float16, [128, 256]") < loop
    epilogue = src[src.rindex("tma.store_wait(0)", 0, src.rindex("tma.async_copy_shared_to_global(")):]
    assert epilogue.index("tma.store_wait(0)") < epilogue.index(".store(C_local") and epilogue.count("store_wait") == 2
    assert "min((16 * 16), 132)" in src and TMA_STORE in ptx and "wgmma.wait_group.sync.aligned 1" in ptx


def shared_epilogue_gemm(M, N, K, written_by_parallel):
    """TileLang's quickstart epilogue, ``T.copy(C_local, C_shared); T.copy(C_shared, C[..])``
    (with `written_by_parallel`, C_shared is filled element by element in a T.Parallel)."""
    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, 64), T.ceildiv(M, 64), threads=128) as (bx, by):
            A_shared = T.alloc_shared((64, 32), "float16")
            B_shared = T.alloc_shared((32, 64), "float16")
            C_local = T.alloc_fragment((64, 64), "float32")
            C_shared = T.alloc_shared((64, 64), "float16")
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, 32), num_stages=2):
                T.copy(A[by * 64, k * 32], A_shared)
                T.copy(B[k * 32, bx * 64], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            if written_by_parallel:
                for i, j in T.Parallel(64, 64):
                    C_shared[i, j] = C_local[i, j]
            else:
                T.copy(C_local, C_shared)
            T.copy(C_shared, C[by * 64, bx * 64])

    return main


def _shared_epilogue_gemm(written_by_parallel=False):
    return shared_epilogue_gemm(200, 136, 72, written_by_parallel)


def test_sm90_shared_tile_epilogue_is_one_tma_store_from_that_tile():
    """The copy out of C_shared is a TMA store read straight from it (NVMMA-encoded for that),
    waited on before the kernel ends; no register round trip, no gl.store."""
    func = lowered(_shared_epilogue_gemm(), H100)
    c_shared = next(n.buffer for n in walk(func.kernel.body) if isinstance(n, ir.Alloc) and n.buffer.name == "C_shared")
    assert isinstance(c_shared.layout, lay.NVMMASharedLayout)
    from tritile.codegen.gluon import compile_kernel

    k = compile_kernel(func, H100)
    src = k.source
    store = src.index("tma.async_copy_shared_to_global(C_desc, [(by * 64), (bx * 64)], C_shared)")
    assert "gl.store(" not in src and src.index("C_shared.store(") < store < src.index("tma.store_wait(0)", store)
    assert TMA_STORE in k.asm["ptx"]


def test_sm90_shared_tile_written_elementwise_is_stored_without_tma():
    """C_shared written by a T.Parallel (no whole-tile copy to wait in front of) keeps the
    register path for its copy to global memory."""
    from tritile.codegen.gluon import compile_kernel

    src = compile_kernel(lowered(_shared_epilogue_gemm(written_by_parallel=True), H100), H100).source
    assert "async_copy_shared_to_global" not in src and "gl.store(C + " in src


@pytest.mark.parametrize("rows, blocks, trips, start, head, path", [
    (1024, 8, 1, lambda bx, part, k: add(mul(bx, 128), mul(part, 64)), None, "rows view"),  # the split 128-row tile
    # the last block runs into the next head: not a row block of the view (1024 % 192), no TMA
    (1024, 6, 1, lambda bx, part, k: add(mul(bx, 192), mul(part, 64)), None, "masked"),
    (1152, 6, 1, lambda bx, part, k: add(mul(bx, 192), mul(part, 64)), None, "rows view"),
    (1024, 8, 1, lambda bx, part, k: c(960), None, "rows view"),
    (1024, 8, 1, lambda bx, part, k: add(mul(bx, 128), c(64)), None, "rows view"),
    (1024, 8, 1, lambda bx, part, k: add(mul(bx, 128), c(128)), None, "masked"),  # past the 128-row block it offsets
    (128, 1, 2, lambda bx, part, k: mul(k, 64), None, "rows view"),                # a K loop over its head
    (128, 1, 19, lambda bx, part, k: mul(k, 64), None, "full rank"),               # T.ceildiv(128, 7) blocks (mutant 583)
    (128, 1, 3, lambda bx, part, k: mul(ir.BinOp("-", k, c(1)), 64), None, "full rank"),  # the first block before the head
    (128, 1, 2, lambda bx, part, k: mul(k, 64), lambda by: add(by, 1), "full rank"),     # the last block's next head
])
def test_rows_view_tiles_never_leave_their_head(rows, blocks, trips, start, head, path):
    """A [B, H, S, D] tile through the [B*H*S, D] view is clipped only at the view's end, so it
    takes the view only where its bounds (block indices below the grid, loop variables below their
    stop) keep every index but the last inside the tensor - its row block inside its own head's S
    rows; elsewhere a descriptor of the full rank serves it, which clips every dim.  Tiles that
    are no row block of the view at all keep the masked path."""
    from types import SimpleNamespace

    import irb
    from tritile.codegen import semantics
    from tritile.ir import instructions as isel

    q = ir.Buffer("Q", (2, 4, rows, 64), dt.float16, "global")
    q_shared = ir.Buffer("Q_shared", (64, 64), dt.float16, "shared")
    bx, part, by, k = ir.Var("bx"), ir.Var("part"), ir.Var("by"), ir.Var("k")
    tile = region(q, (c(0), head(by) if head else by, start(bx, part, k), c(0)), (1, 1, 64, 64))
    body = irb.seq(irb.alloc(q_shared), irb.for_(k, 0, trips, irb.copy(tile, irb.full(q_shared))))
    em = SimpleNamespace(func=irb.prim_func("f", [q], grid=(blocks, 2, 4), block_vars=(bx, part, by), body=body))

    def inside(start, extent, size):
        return semantics.tile_starts_inside(em, start) and semantics.tile_inside(em, start, extent, size)

    if not isel.uses_tma(ir.Copy(tile, irb.full(q_shared)), H100):
        assert path == "masked"
    else:
        assert path == ("rows view" if isel.tma_rows_view(tile, inside) else "full rank")


def _row_vectors(shift: int):
    @T.prim_func
    def kernel(L: T.Tensor((2, 4, 256), T.float32), O: T.Tensor((2, 4, 256), T.float32)):
        with T.Kernel(4, 2, threads=128) as (by, bz):
            staged = T.alloc_shared((64,), T.float32)
            row = T.alloc_fragment((64,), T.float32)
            for k in T.Pipelined(4, num_stages=2):
                T.copy(L[bz, by + shift, k * 64:(k + 1) * 64], staged)
                T.copy(staged, row)
                T.copy(row, O[bz, by, k * 64:(k + 1) * 64])

    return kernel


@pytest.mark.parametrize("shift, block", [(0, "(1, 64)"), (1, "(1, 1, 64)")])
def test_a_row_vector_whose_leading_index_may_leave_its_dim_takes_the_full_rank(shift, block):
    """A 1-D tile's (1, n) block of the rows view is clipped only at the view's end: the last
    head's ``by + 1`` would read the next batch's first row there, where the interpreter reads
    zeros.  Such a tile takes a (1, 1, n) block of a descriptor of the tensor's full rank."""
    import tritile

    src = tritile.compile(_row_vectors(shift), target="cuda:90").get_source("gluon")
    assert f"TMA_DESCRIPTORS = (({block}, HOST_L_desc_layout), )" in src


@pytest.mark.parametrize("causal", [False, True])
def test_one_tile_kernel_loads_q_with_tma_waited_at_first_use(causal, monkeypatch):
    """The head-dim-64 attention kernel (one CTA per tile, no producer): Q is one TMA copy on
    its own mbarrier, issued where the copy stands and waited for only before the first
    QK^T, after the K/V loop's first copies were issued - not a masked load every thread
    waits for before anything else starts (early_loads.py)."""
    from examples.flash_attention import flashattn, tile_config
    from tritile.runtime.kernel import JITKernel

    for switch in ("TRITILE_WARP_SPECIALIZE", "TRITILE_PERSISTENT", "TRITILE_CONSUMER_PARTITIONS"):
        monkeypatch.delenv(switch, raising=False)
    src = JITKernel(flashattn.fn(16, 16, 1024, 1024, 64, causal, **tile_config("cuda", 64)), target=H100).get_source("gluon")
    issue = src.index("tma.async_copy_global_to_shared(Q_desc, ")
    wait = src.index("mbarrier.wait(Q_shared_loaded.index(0), 0)")
    assert "gl.load(Q" not in src and "mbarrier.init(Q_shared_loaded.index(0), count=1)" in src
    assert issue < src.index("tma.async_copy_global_to_shared(K_desc, ") < wait < src.index("warpgroup_mma(Q_shared")
    assert src.index("mbarrier.invalidate(Q_shared_loaded.index(0))", wait) < src.index("warpgroup_mma(Q_shared")


def test_tile_config_by_shape():
    from examples.gemm import tile_config

    def tile(M, N, K):
        config = tile_config("cuda", M, N, K)
        return config["block_M"], config["block_N"], config["block_K"], config["num_stages"]

    # small M, long K: one wave of 64x64 programs with 192 KB of loads in flight, else 64x128
    # (M <= 32 swaps the operands: tests/test_gemm_swap_ab.py)
    assert tile(64, 4096, 4096) == tile(128, 4096, 4096) == (64, 64, 128, 6)
    assert tile(64, 8192, 8192) == (64, 64, 128, 6)
    assert tile(128, 8192, 8192) == (64, 128, 64, 6)
    assert tile(64, 1024, 1024) == (64, 64, 64, 8)  # a short K keeps the shallower tiles
    assert tile(256, 4096, 4096) == (128, 64, 64, 6)
    assert tile_config("cuda", 4096, 4096, 4096) == tile_config("cuda")


@pytest.mark.parametrize("M", [16, 128])
def test_sm90_small_m_configs_compile(M):
    k = compile_for(_example_gemm(M, 1024, 512), H100)
    assert TMA_LOAD in k.asm["ptx"] and "wgmma" in k.asm["ptx"] and k.metadata.num_warps == 4


def test_codegen_switch_is_part_of_the_compile_cache_key(monkeypatch):
    """`TRITILE_TMA_LANES` changes the generated code but not the IR: it must not hit the
    kernel compiled without it."""
    from tritile.codegen.gluon import compile_kernel

    func = lowered(pipelined_gemm(S=3), H100)
    monkeypatch.setenv("TRITILE_TMA_LANES", "0")
    plain = compile_kernel(func, H100)
    monkeypatch.setenv("TRITILE_TMA_LANES", "1")
    lanes = compile_kernel(func, H100)
    assert lanes is not plain and lanes.source != plain.source


def test_staging_tiles_past_the_shared_memory_limit_are_a_compile_error():
    """128x256x64 tiles in 4 stages fit sm_90's 227 KB as buffers (192 KB), but the
    epilogue's TMA-store staging tile takes 64 KB more: the compiled kernel is refused with
    the user's kernel line, not at its first launch inside Triton."""
    import tritile.language as T
    from examples.gemm import matmul
    from tritile.codegen.gluon import compile_kernel
    from tritile.errors import CompileError
    from tritile.frontend import parse_kernel

    func = parse_kernel(matmul.fn, dict(M=1024, N=1024, K=1024, dtype=T.float16, block_M=128, block_N=256,
                                        block_K=64, num_stages=4, threads=256))
    final = lowered(func, H100)
    assert final.attrs["shared_bytes"] <= H100.shared_memory_limit
    with pytest.raises(CompileError, match=r"matmul\.py:\d+: kernel matmul needs \d+ bytes of shared memory on cuda:90 "
                                           r"\(196\d+ B of buffers, the rest staging tiles"):
        compile_kernel(final, H100)
