"""Caches that heal themselves, on CPU (Gluon compiles for sm_90 need no GPU).

Each test gets private, cold tritile and Triton cache directories and an empty memory cache,
compiles the shared small GEMM once, damages what a later compile reads, and compiles again
(memory cache cleared, so through the disk caches): the compile must succeed with the PTX of the
first one, after exactly one `CacheWarning` naming the damaged file or the unusable directory.
The kernels also run on CPU tensors (the interpreter) against torch.
"""
import errno
import json
import os
import shutil
import threading
import warnings
from pathlib import Path

import pytest
import torch

import tritile
from kernels import gemm, gemm_reference, make_operands
from tritile.runtime import cache
from tritile.runtime.cache import CacheWarning

pytestmark = pytest.mark.usefixtures("gluon_backend")  # the Gluon backend's own code

SHAPE = (64, 64, 64)
# Parsed once, here: the threads of the tests below compile; they do not parse Python, which
# CPython before 3.11.8 / 3.12.2 cannot do in several threads at once (gh-106905).
GEMMS = {stages: gemm(*SHAPE, 64, 64, 32, num_stages=stages) for stages in (0, 2)}


@pytest.fixture
def cold(tmp_path, monkeypatch):
    """Private cache directories (tmp/tritile, tmp/triton) and an empty memory cache."""
    monkeypatch.setenv("TRITILE_CACHE_DIR", str(tmp_path / "tritile"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(cache, "_memory", {})
    return tmp_path


def compile_gemm(num_stages=2):
    """A fresh `JITKernel` of a 64x64x64 fp16 GEMM, its sm_90 code generated."""
    kernel = tritile.compile(GEMMS[num_stages], out_idx=[-1], target="cuda:90")
    kernel.get_source("ptx")
    return kernel


def compile_again():
    """`compile_gemm()` with the memory cache emptied first; returns the kernel and the
    `CacheWarning`s it raised."""
    cache._memory.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel = compile_gemm()
    return kernel, [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]


def assert_correct(kernel, ptx=None):
    """Sound sm_90 PTX (equal to `ptx` when given), and the kernel's result on fresh random CPU
    inputs equal to torch's."""
    compiled = kernel.get_source("ptx")
    assert ".version" in compiled and ".target sm_90a" in compiled and "wgmma.mma_async" in compiled
    if ptx is not None:
        assert compiled == ptx
    a, b = make_operands(*SHAPE)
    torch.testing.assert_close(kernel(a, b).float(), gemm_reference(a, b).float(), rtol=1e-2, atol=1e-2)


def module_file(root: Path) -> Path:
    (path,) = (root / "tritile" / "gluon").glob("k_*.py")
    return path


def triton_file(root: Path, name: str) -> Path:
    (path,) = (root / "triton").glob(f"*/{name}")
    return path


def non_utf8(data: bytes) -> bytes:
    return b"\xff\xfe\x80" + data[3:]


def truncated(data: bytes) -> bytes:
    return data[:len(data) // 2]


@pytest.mark.parametrize("damage", [non_utf8, truncated])
def test_damaged_module_is_rewritten(cold, damage):
    first = compile_gemm()
    path = module_file(cold)
    path.write_bytes(damage(path.read_bytes()))
    kernel, caught = compile_again()
    assert len(caught) == 1 and str(path) in caught[0], caught
    assert path.read_text() == kernel.get_source("gluon") == first.get_source("gluon")
    assert_correct(kernel, first.get_source("ptx"))


def test_module_of_an_older_code_generator_is_replaced_silently(cold):
    """The key covers the IR, not the generator's code: a module an older generator wrote for
    the same key is intact, just stale (another digest in its name), and is no damage."""
    first = compile_gemm()
    path = module_file(cold)
    stale = path.with_name(path.name.rsplit("_", 1)[0] + "_0123456789abcdef.py")
    path.rename(stale)
    stale.write_text(stale.read_text() + "# written by an older code generator\n")
    kernel, caught = compile_again()
    assert caught == [] and not stale.exists()
    assert module_file(cold).read_text() == first.get_source("gluon")
    assert_correct(kernel, first.get_source("ptx"))


def garbage(text: str) -> str:
    return "garbage that no compiler wrote\n"


def cut(text: str) -> str:
    return text[:len(text) // 2]


@pytest.mark.parametrize("name, damage", [
    ("main.json", cut),  # the metadata: not JSON
    ("main.ptx", garbage),  # returned by get_source("ptx") if not caught
    ("main.ptx", cut),
    ("__grp__main.json", garbage),  # the index of the entry
])
def test_damaged_triton_artifact_is_discarded(cold, name, damage):
    first = compile_gemm()
    path = triton_file(cold, name)
    path.write_text(damage(path.read_text()))
    kernel, caught = compile_again()
    assert len(caught) == 1 and str(path) in caught[0], caught
    assert_correct(kernel, first.get_source("ptx"))
    assert json.loads(triton_file(cold, "main.json").read_text())["name"] == "main"


def test_truncated_cubin_is_discarded(cold):
    first = compile_gemm()
    path = triton_file(cold, "main.cubin")
    whole = path.read_bytes()
    path.write_bytes(whole[:len(whole) - 100])
    kernel, caught = compile_again()
    assert len(caught) == 1 and str(path) in caught[0] and "truncated ELF" in caught[0], caught
    assert path.read_bytes() == whole
    assert_correct(kernel, first.get_source("ptx"))


def test_cache_hit_that_fails_is_compiled_again(cold):
    """Metadata that parses but is not Triton's (no "target"): the hit itself raises, which the
    artifact checks cannot foresee; the compile is retried on a discarded entry, not blamed on
    the kernel."""
    first = compile_gemm()
    path = triton_file(cold, "main.json")
    path.write_text("{}")
    kernel, caught = compile_again()
    assert len(caught) == 1 and str(path.parent) in caught[0] and "KeyError" in caught[0], caught
    assert_correct(kernel, first.get_source("ptx"))


def a_regular_file(root: Path) -> Path:
    root.write_text("not a directory")
    return root


def a_directory_under_a_file(root: Path) -> Path:
    return a_regular_file(root) / "cache"


@pytest.mark.parametrize("unusable", [a_regular_file, a_directory_under_a_file])
def test_unusable_cache_dir_falls_back_to_memory(cold, monkeypatch, unusable):
    root = unusable(cold / "tritile-root")
    monkeypatch.setenv("TRITILE_CACHE_DIR", str(root))
    with pytest.warns(CacheWarning) as caught:
        kernels = [compile_gemm(num_stages=2), compile_gemm(num_stages=0)]
    messages = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(messages) == 1 and str(root) in messages[0] and "kept in memory" in messages[0], messages
    for kernel in kernels:
        assert_correct(kernel)
        assert "def main(" in kernel.get_source("gluon")


@pytest.mark.parametrize("unusable", [a_regular_file, a_directory_under_a_file])
def test_unusable_triton_cache_dir_is_replaced_by_a_private_one(cold, monkeypatch, unusable):
    root = unusable(cold / "triton-root")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(root))  # restored after the test: the fallback sets it
    with pytest.warns(CacheWarning) as caught:
        kernels = [compile_gemm(num_stages=2), compile_gemm(num_stages=0)]
    messages = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(messages) == 1 and str(root) in messages[0] and "Triton's cache is" in messages[0], messages
    assert os.environ["TRITON_CACHE_DIR"] != str(root)
    for kernel in kernels:
        assert_correct(kernel)
        assert ".target sm_90" in kernel.get_source("ptx")


def test_read_only_cache_dir_falls_back_to_memory(cold, monkeypatch):
    """Tests run as root, which permission bits do not stop, so the read-only directory is
    simulated where it bites: creating a file in the cache directory fails with EACCES, as
    `tempfile.mkstemp` would there (the lock file, made by `os.open`, is still created)."""
    root = cold / "tritile"
    mkstemp = cache.tempfile.mkstemp

    def refuse_cache_dir(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).is_relative_to(root):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(dir))
        return mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(cache.tempfile, "mkstemp", refuse_cache_dir)
    with pytest.warns(CacheWarning) as caught:
        kernel = compile_gemm()
    messages = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(messages) == 1 and str(root / "gluon") in messages[0] and "PermissionError" in messages[0]
    assert not list((root / "gluon").glob("k_*.py"))
    assert_correct(kernel)


def test_cache_dirs_deleted_during_concurrent_compiles(cold, monkeypatch):
    """Both cache directories are removed while Triton writes the first compile's PTX, and 8
    threads compile the kernel at once: all succeed with one PTX, the first compile after one
    warning (its entry's earlier files are gone), and the caches are rebuilt afterwards."""
    from triton.runtime.cache import FileCacheManager

    put, removed = FileCacheManager.put, threading.Event()

    def put_then_clear_caches(self, data, filename, binary=True):
        written = put(self, data, filename, binary)
        if filename.endswith(".ptx") and not removed.is_set():
            removed.set()
            shutil.rmtree(cold / "tritile")
            shutil.rmtree(cold / "triton")
        return written

    monkeypatch.setattr(FileCacheManager, "put", put_then_clear_caches)
    start, kernels = threading.Barrier(8), [None] * 8

    def compile_one(index):
        start.wait()
        kernels[index] = compile_gemm()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=compile_one, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    messages = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert removed.is_set() and all(kernels), "a compile failed"
    assert len(messages) == 1 and str(cold / "triton") in messages[0], messages
    for kernel in kernels:
        assert_correct(kernel, kernels[0].get_source("ptx"))
    monkeypatch.setattr(FileCacheManager, "put", put)
    kernel, caught_after = compile_again()
    assert caught_after == [] and module_file(cold).read_text() == kernel.get_source("gluon")
    assert triton_file(cold, "__grp__main.json").exists()
    assert_correct(kernel, kernels[0].get_source("ptx"))


# ---------------------------------------------------------------- the autotuner's cache
def make_tuned_gemm():
    """A fresh `@tritile.autotune` over the lazy GEMM (an empty in-memory cache, like a new process)."""
    configs = [{"block_M": 32}, {"block_M": 64}]

    @tritile.autotune(configs=configs, warmup=1, rep=1)
    @tritile.jit(out_idx=[-1])
    def matmul(M, N, K, block_M=64):
        return gemm(M, N, K, block_M, 64, 32)

    return matmul


def test_tuning_kept_in_memory_when_its_cache_cannot_be_written(cold, monkeypatch):
    root = a_regular_file(cold / "tritile-root")
    monkeypatch.setenv("TRITILE_CACHE_DIR", str(root))
    matmul = make_tuned_gemm()
    with pytest.warns(CacheWarning) as caught:
        kernel = matmul(*SHAPE)
    messages = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(messages) == 1 and str(root / "autotune") in messages[0] and "kept in memory" in messages[0]
    assert matmul.last_result.source == "tuned" and kernel.config in ({"block_M": 32}, {"block_M": 64})
    assert matmul(*SHAPE) is kernel and matmul.last_result.source == "memory"
    a, b = make_operands(*SHAPE)
    torch.testing.assert_close(kernel(a, b).float(), gemm_reference(a, b).float(), rtol=1e-2, atol=1e-2)


def test_damaged_tuning_entry_is_tuned_again(cold):
    make_tuned_gemm()(*SHAPE)
    (path,) = (cold / "tritile" / "autotune").glob("*.json")
    path.write_bytes(b'{"config_index": \xff')
    fresh = make_tuned_gemm()
    with pytest.warns(CacheWarning) as caught:
        kernel = fresh(*SHAPE)
    messages = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert len(messages) == 1 and str(path) in messages[0], messages
    assert fresh.last_result.source == "tuned"
    assert json.loads(path.read_text())["config_index"] in (0, 1)
    a, b = make_operands(*SHAPE)
    torch.testing.assert_close(kernel(a, b).float(), gemm_reference(a, b).float(), rtol=1e-2, atol=1e-2)


def test_the_cache_key_follows_tritiles_sources(tmp_path):
    """Kernels cached by one state of tritile's sources are not served to another with the same
    version number: the key holds a digest of every module of the package, which any edit, new
    file or rename changes."""
    from tritile.runtime import cache

    (tmp_path / "codegen").mkdir()
    (tmp_path / "codegen" / "rules.py").write_text("RULES = {}\n")
    (tmp_path / "__init__.py").write_text("")
    first = cache.sources_digest(tmp_path)
    assert cache.sources_digest(tmp_path) == first
    (tmp_path / "codegen" / "rules.py").write_text("RULES = {'atomic': 'reduce'}\n")
    edited = cache.sources_digest(tmp_path)
    (tmp_path / "codegen" / "rules.py").rename(tmp_path / "codegen" / "table.py")
    assert len({first, edited, cache.sources_digest(tmp_path)}) == 3
    assert cache.sources_digest() in cache.VERSION_KEY

