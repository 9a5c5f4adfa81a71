"""The frontend: Python source -> tile IR (structure, regions, symbols, scoping, printer)."""
import torch

import tritile
import tritile.language as T
from tritile.frontend import parse_kernel, probe_const_dims
from tritile.ir import nodes as ir
from tritile.ir.printer import format_func
from tritile.ir.transform import walk
from kernels import gemm, gemm_eager


def _stmts(func, cls):
    return [n for n in walk(func.kernel.body) if isinstance(n, cls)]


def test_lazy_gemm_structure():
    func = gemm(256, 128, 96, 64, 64, 32, num_stages=3)
    assert [p.name for p in func.params] == ["A", "B", "C"]
    assert [p.shape for p in func.params] == [(256, 96), (96, 128), (256, 128)]
    assert all(p.scope == "global" and p.dtype == T.float16 for p in func.params)
    kernel = func.kernel
    assert [g.value for g in kernel.grid] == [2, 4] and kernel.threads == 128
    allocs = {a.buffer.name: a.buffer for a in _stmts(func, ir.Alloc)}
    assert allocs["A_shared"].scope == "shared" and allocs["A_shared"].shape == (64, 32)
    assert allocs["C_local"].scope == "fragment" and allocs["C_local"].dtype == T.float32
    (loop,) = _stmts(func, ir.For)
    assert loop.kind == "pipelined" and loop.num_stages == 3 and loop.stop.value == 3
    copies = _stmts(func, ir.Copy)
    # head addresses take the other operand's extents
    assert [c.src.extents for c in copies] == [(64, 32), (32, 64), (64, 64)]
    assert copies[-1].dst.buffer.name == "C" and copies[-1].dst.extents == (64, 64)
    (gemm_op,) = _stmts(func, ir.Gemm)
    assert (gemm_op.a.buffer, gemm_op.b.buffer, gemm_op.c.buffer) == (allocs["A_shared"], allocs["B_shared"],
                                                                     allocs["C_local"])
    assert not gemm_op.transpose_a and not gemm_op.transpose_b and gemm_op.policy == "Square"
    # every statement points at its source line: the kernel's, or the inlined macro's (ops/matmul.py)
    assert all(s.loc is not None and s.loc.filename.endswith(("kernels.py", "ops/gemm_loop.py")) for s in walk(kernel.body)
               if isinstance(s, ir.Stmt) and not isinstance(s, ir.Seq))


def test_printer_shows_the_program():
    text = format_func(gemm(128, 128, 128, 64, 64, 32, num_stages=3))
    for fragment in ("T.Kernel(2, 2, threads=128)", "T.alloc_shared([64, 32], float16)",
                     "T.Pipelined(0, 4, num_stages=3)", "T.gemm(A_shared", "T.copy(A[by * 64"):
        assert fragment in text, fragment


def test_eager_gemm_with_const_dims():
    assert probe_const_dims(gemm_eager, {}) == {"M": (0, 0), "K": (0, 1), "N": (1, 1)}
    func = parse_kernel(gemm_eager, {"M": 128, "N": 64, "K": 96, "block_M": 32})
    assert [p.name for p in func.params] == ["A", "B", "C"] and func.out_idx == [2]
    assert func.params[2].shape == (128, 64) and func.params[1].dtype == T.float16
    assert [g.value for g in func.kernel.grid] == [1, 4]
    assert _stmts(func, ir.For)[0].num_stages == 2


def test_region_copy_with_unit_dims():
    @T.prim_func
    def rows(Q: T.Tensor((2, 128, 4, 32), "float16"), O: T.Tensor((2, 128, 4, 32), "float16")):
        with T.Kernel(2, 4, 2) as (bx, by, bz):
            Q_shared = T.alloc_shared((64, 32), "float16")
            T.copy(Q[bz, bx * 64:(bx + 1) * 64, by, :], Q_shared)
            T.copy(Q_shared, O[bz, bx * 64:(bx + 1) * 64, by, :])

    load, store = _stmts(rows, ir.Copy)
    assert load.src.extents == (1, 64, 1, 32) and load.src.tile_shape == (64, 32)
    assert store.dst.extents == (1, 64, 1, 32) and store.dst.buffer.name == "O"


def test_head_address_aligns_to_trailing_dims():
    @T.prim_func
    def batched(X: T.Tensor((2, 128, 32), "float32"), Y: T.Tensor((2, 128, 32), "float32")):
        with T.Kernel(2, 2) as (bx, bz):
            tile = T.alloc_fragment((64, 32), "float32")
            T.copy(X[bz, bx * 64, 0], tile)
            T.copy(tile, Y[bz, bx * 64, 0])

    load, store = _stmts(batched, ir.Copy)
    assert load.src.extents == (1, 64, 32) and store.dst.extents == (1, 64, 32)


def test_dynamic_dims_are_vars_bound_from_arguments():
    m, n = T.dynamic("m, n")

    @T.prim_func
    def scale(X: T.Tensor((m, n), "float32"), Y: T.Tensor((m, n), "float32")):
        with T.Kernel(T.ceildiv(n, 32), T.ceildiv(m, 32)) as (bx, by):
            for i, j in T.Parallel(32, 32):
                Y[by * 32 + i, bx * 32 + j] = X[by * 32 + i, bx * 32 + j] * 2.0

    assert scale.dynamic_vars == [m, n]
    assert scale.dim_bindings[m] == (0, 0) and scale.dim_bindings[n] == (0, 1)
    (par,) = _stmts(scale, ir.Parallel)
    (store,) = par.body.stmts
    assert isinstance(store.value, ir.BinOp) and store.value.dtype == T.float32


def test_loop_carried_name_becomes_a_var_buffer(assert_close):
    @T.prim_func
    def prefix(X: T.Tensor((64,), "float32"), Y: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=1) as bx:
            total = 0.0
            for i in range(64):
                total = total + X[i]
                Y[i] = total

    (var,) = [a.buffer for a in _stmts(prefix, ir.Alloc) if a.buffer.scope == "var"]
    assert var.dtype == T.float32
    kernel = tritile.compile(prefix, out_idx=-1, target="cpu")
    x = torch.randn(64)
    assert_close(kernel(x), torch.cumsum(x, 0))


def test_runtime_if_ternary_while_and_alloc_var(assert_close):
    @T.prim_func
    def clamp_count(X: T.Tensor((128,), "float32"), Y: T.Tensor((128,), "float32"), N: T.Tensor((1,), "int32")):
        with T.Kernel(1, threads=1) as bx:
            count = T.alloc_var(T.int32, 0)
            for i in T.serial(128):
                v = X[i]
                if v > 0.5 and not v > 1.5:
                    count = count + 1
                Y[i] = v if v < 1.0 else 1.0
            j = T.alloc_var("int32", init=0)
            while j < 3:
                j += 1
            N[0] = count + j * 0

    kernel = tritile.compile(clamp_count, out_idx=[-2, -1], target="cpu")
    x = torch.randn(128) * 2
    y, n = kernel(x)
    assert_close(y, torch.clamp(x, max=1.0))
    assert int(n[0]) == int(((x > 0.5) & ~(x > 1.5)).sum())


def test_end_to_end_gemm_through_the_interpreter(assert_close):
    kernel = tritile.compile(gemm(128, 128, 64, 64, 64, 32, num_stages=2), out_idx=[2], target="cpu")
    a, b = torch.randn(128, 64, dtype=torch.float16), torch.randn(64, 128, dtype=torch.float16)
    assert_close(kernel(a, b), (a.float() @ b.float()).half())
