"""Compiles that run concurrently, on CPU (Gluon compiles for sm_90 need no GPU).

Threads and processes compile one kernel at the same moment into cold caches: each must
succeed with the same PTX, and the kernel must be compiled from scratch exactly once (the
per-key lock: a thread lock in a process, a file lock between processes), the others being
served by the memory cache or Triton's disk cache.
"""
import hashlib
import linecache
import multiprocessing
import sys
import threading

import pytest
import torch

import tritile
from kernels import gemm, gemm_reference, make_operands
from tritile.codegen import generated_module
from tritile.runtime import cache

pytestmark = pytest.mark.usefixtures("gluon_backend")  # the Gluon backend's own code

SHAPE = (64, 64, 64)


@pytest.fixture
def cold(tmp_path, monkeypatch):
    """Private cache directories, an empty memory cache and no generated module imported yet."""
    monkeypatch.setenv("TRITILE_CACHE_DIR", str(tmp_path / "tritile"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(cache, "_memory", {})
    for name in [name for name in sys.modules if name.startswith("tritile_gluon_k_")]:
        monkeypatch.delitem(sys.modules, name)
    return tmp_path


def count_triton_compiles(monkeypatch=None) -> list:
    """A list that gets one entry per `triton.compile` that missed Triton's cache."""
    import triton

    misses = []

    def listener(*, cache_hit, **_):
        if not cache_hit:
            misses.append(1)

    if monkeypatch is None:
        triton.knobs.compilation.listener = listener
    else:
        monkeypatch.setattr(triton.knobs.compilation, "listener", listener)
    return misses


def assert_sound_ptx(ptx: str) -> None:
    assert ".version" in ptx and ".target sm_90a" in ptx and "wgmma.mma_async" in ptx


def test_threads_compile_one_kernel_once(cold, monkeypatch):
    misses = count_triton_compiles(monkeypatch)
    start, kernels, errors = threading.Barrier(16), [None] * 16, []

    def compile_one(index):
        start.wait()
        try:  # each thread traces the kernel too: parses take turns before CPython 3.11.8 (gh-106905)
            kernel = tritile.compile(gemm(*SHAPE, 64, 64, 32), out_idx=[-1], target="cuda:90")
            kernel.get_source("ptx")
            kernels[index] = kernel
        except Exception as err:  # reported below, with the thread's index
            errors.append((index, err))

    threads = [threading.Thread(target=compile_one, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    compiled = {id(kernel._codegen(kernel.plan_target)) for kernel in kernels}
    assert len(compiled) == 1 and len(misses) == 1  # one compile, fifteen memory hits
    ptx = kernels[0].get_source("ptx")
    assert_sound_ptx(ptx)
    assert all(kernel.get_source("ptx") == ptx for kernel in kernels)
    a, b = make_operands(*SHAPE)
    torch.testing.assert_close(kernels[3](a, b).float(), gemm_reference(a, b).float(), rtol=1e-2, atol=1e-2)


def compile_in_process(start, results) -> None:
    """A spawned process's work: compile the GEMM when all processes are ready; report the PTX's
    digest and how many of its Triton compiles missed the (shared) cache."""
    try:
        misses = count_triton_compiles()
        func = gemm(*SHAPE, 64, 64, 32)
        start.wait(timeout=120)
        ptx = tritile.compile(func, out_idx=[-1], target="cuda:90").get_source("ptx")
        assert_sound_ptx(ptx)
        results.put((hashlib.sha256(ptx.encode()).hexdigest(), len(misses)))
    except BaseException as err:
        results.put((None, f"{type(err).__name__}: {err}"))
        raise


def test_processes_share_one_cold_cache(cold):
    spawn = multiprocessing.get_context("spawn")
    start, results = spawn.Barrier(8), spawn.Queue()
    processes = [spawn.Process(target=compile_in_process, args=(start, results)) for _ in range(8)]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert all(process.exitcode == 0 for process in processes), outcomes
    digests = {digest for digest, _ in outcomes}
    assert None not in digests and len(digests) == 1, outcomes
    # the file lock: one process compiled, seven waited and read Triton's cache
    assert sum(misses for _, misses in outcomes) == 1, outcomes
    assert len(list((cold / "tritile" / "gluon").glob("k_*.py"))) == 1
    assert len(list((cold / "triton").glob("*/__grp__main.json"))) == 1


def test_module_published_only_once_executed(cold):
    """The half-executed module the per-key lock keeps callers away from: threads that load one
    module at once each get it complete (the module sleeps between its first and last names)."""
    source = "import time\nFIRST = 1\ntime.sleep(0.05)\nLAST = 2\n"
    name, start, modules = "tritile_gluon_k_published_once", threading.Barrier(8), []

    def load():
        start.wait()
        module = generated_module.load_module(name, source, "<published once>")
        modules.append((module, hasattr(module, "LAST")))  # complete when handed out?

    threads = [threading.Thread(target=load) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert len(modules) == 8 and all(complete for _, complete in modules)
        assert all(module is sys.modules[name] for module, _ in modules)  # one module, shared
    finally:
        del sys.modules[name]
        linecache.cache.pop("<published once>", None)
