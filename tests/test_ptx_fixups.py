"""codegen/ptx_fixups.py: the PTX rewrites around ptxas faults, and the compile hook applying them.

What the rewritten kernels compute is tested with the faults' programs (test_semantics_properties.py,
int16 negation: through the interpreters on the CPU, on the GPU by its suite); here the text and
the hook's manners: it acts on tritile's compiles only, keeps a user's hook, and is part of
Triton's cache key."""
import threading

import pytest
import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import tritile
import tritile.language as T
from tritile.codegen import ptx_fixups
from tritile.codegen.ptx_fixups import fixed_ptx
from tritile.runtime import cache


@triton.jit
def users_kernel(A, C):
    """A user's own Triton kernel, compiled beside tritile's: an int16 negation Triton keeps."""
    offsets = tl.arange(0, 16)
    tl.store(C + offsets, (-tl.load(A + offsets)).to(tl.int32))


def users_source():
    return ASTSource(users_kernel, {"A": "*i16", "C": "*i32"}, constexprs={})


def test_int16_negation_and_abs_become_32_bit_ones():
    ptx = ("\tneg.s16 \t%rs5, %rs1;\n"
           "\t@%p3 abs.s16 %rs7, %rs2;\n"
           "\t@!%p1 neg.s16 %rs8, %rs4;\n"
           "\tneg.s32 \t%r2, %r1;\n\tneg.f16 %rs9, %rs3;\n\tabs.s16x2 %r5, %r4;\n")
    lines = fixed_ptx(ptx).splitlines()
    assert lines[0] == ("\t{ .reg .b32 %tritile_wide; cvt.s32.s16 %tritile_wide, %rs1; neg.s32 %tritile_wide, "
                        "%tritile_wide; cvt.u16.u32 %rs5, %tritile_wide; }")
    assert lines[1].endswith("abs.s32 %tritile_wide, %tritile_wide; @%p3 cvt.u16.u32 %rs7, %tritile_wide; }")
    assert lines[2].endswith("@!%p1 cvt.u16.u32 %rs8, %tritile_wide; }")
    assert lines[3:] == ptx.splitlines()[3:]  # other widths and types are untouched


def _negation(n):
    @T.prim_func
    def kernel(A: T.Tensor((n,), T.int16), C: T.Tensor((n,), T.int32)):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(n):
                C[i] = T.int32(~A[i] + 1)

    return kernel


@pytest.fixture
def cold(tmp_path, monkeypatch):
    """Private cache directories: every compile runs Triton's stages (a cache hit skips them)."""
    monkeypatch.setenv("TRITILE_CACHE_DIR", str(tmp_path / "tritile"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(cache, "_memory", {})


@pytest.mark.parametrize("backend", ["gluon", "triton"])
def test_the_hook_keeps_a_users_hook_and_acts_on_tritiles_compiles_only(backend, cold, monkeypatch):
    from triton import knobs

    seen = []

    def users_hook(backend, stages, options, language, capability):
        seen.append(sorted(stages))

    monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", users_hook)
    ptx = tritile.compile(_negation(16), out_idx=[-1], target="cuda:90", backend=backend).get_source("ptx")
    assert "neg.s16" not in ptx and "%tritile_wide" in ptx
    assert seen and "ptx" in seen[0]
    assert knobs.runtime.add_stages_inspection_hook is users_hook
    compiled = triton.compile(users_source(), target=GPUTarget("cuda", 90, 32))
    assert "neg.s16" in compiled.asm["ptx"] and "%tritile_wide" not in compiled.asm["ptx"]


def test_a_compile_on_another_thread_is_not_rewritten(cold):
    """While one thread is inside `applied()`, another thread's Triton compile is left alone."""
    results = {}

    def compile_elsewhere():
        results["ptx"] = triton.compile(users_source(), target=GPUTarget("cuda", 90, 32)).asm["ptx"]

    with ptx_fixups.applied():
        other = threading.Thread(target=compile_elsewhere)
        other.start()
        other.join()
    assert "neg.s16" in results["ptx"]


def test_triton_keys_cover_tritiles_sources():
    """The hook changes what Triton makes of a source without changing the source, so both
    backends' sources hash tritile's version and sources into Triton's cache key."""
    from triton.experimental.gluon._runtime import GluonASTSource

    for source_class in (ASTSource, GluonASTSource):
        keyed = cache.keyed_source(source_class)
        assert issubclass(keyed, source_class) and keyed is cache.keyed_source(source_class)
    keyed = cache.keyed_source(ASTSource)(users_kernel, {"A": "*i16", "C": "*i32"}, constexprs={})
    assert keyed.hash() != users_source().hash()


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_not_plus_one_of_int16_wraps(backend, device):
    if backend == "triton" and device == "cuda":
        pytest.skip("the GPU suite runs the triton backend under TRITILE_BACKEND=triton")
    a = torch.randint(-32768, 32767, (1024,), dtype=torch.int16)
    a[::5] = -32768
    kernel = tritile.compile(_negation(1024), out_idx=[-1], backend=backend)
    assert torch.equal(kernel(a.to(device)).cpu(), (-a).int())
