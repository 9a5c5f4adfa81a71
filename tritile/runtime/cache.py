"""Kernel caches: safe to share between threads and processes, and healing themselves.

* In memory: compiled kernels per key (`lookup` / `remember`).
* tritile's disk cache, ``$TRITILE_CACHE_DIR`` (default ``~/.cache/tritile``): the generated
  Gluon modules (``gluon/k_<key>_<digest>.py``, `store_module`) and the autotuner's results
  (``autotune/``).  Files are replaced in one step (`write_atomic`), so no reader ever sees a
  half-written one.  A module file whose bytes are not the freshly generated source (corrupt,
  truncated) is rewritten with a `CacheWarning` naming it.  A directory that cannot be used
  (read-only, a regular file, removed and not re-creatable) costs one `CacheWarning` per
  directory and process, and the module is kept in memory only: `compiler._load_module`
  executes every module from its source string and registers that source in `linecache`,
  which is where `@gluon.jit` reads it from - the file is never read back.
* Triton's cache (``TRITON_CACHE_DIR``, laid out by ``triton/runtime/cache.py``): one directory
  per compile key holding ``<kernel>.{source,ttir,ttgir,llir,ptx,cubin,json}`` and
  ``__grp__<kernel>.json``, the group listing the absolute paths a cache hit reads.
  `triton_compile` inspects that entry before a hit is served: artifacts that cannot be what
  Triton wrote (undecodable text, a json that does not parse, a ``.ptx`` that is not complete
  PTX, a ``.cubin`` that is not a complete ELF file, a listed file that is missing) are
  discarded with one `CacheWarning` naming them, and Triton compiles afresh.  A compile that
  fails while reading the cache (any failure of a hit; an `OSError`, e.g. the directory
  removed mid-way) is retried once on a discarded entry.  A Triton cache directory that cannot
  be used at all (a regular file, not creatable) is replaced, for the rest of the process, by a
  private temporary directory, with one `CacheWarning`.  Cache trouble is never reported as a
  fault of the user's kernel.
* `compile_lock(key)`: one compile per key at a time - a `threading.Lock` per key in this
  process, an exclusive ``flock`` on ``gluon/k_<key>.lock`` across processes sharing the cache.

Key = sha256 of (final IR text, specialization, target, tritile version, triton version).
Triton's own key is extended with tritile's version by `compiler.TritileGluonSource.hash`,
because in Triton 3.6 nothing else of ours is part of it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Optional

import triton

import tritile
from tritile.frontend.source import ast_parse_turn

try:
    import fcntl
except ImportError:  # Windows: no cross-process lock; atomic writes keep concurrent compiles harmless
    fcntl = None

VERSION_KEY = f"tritile-{tritile.__version__}/triton-{triton.__version__}"

_memory = {}

_key_locks = {}  # cache key -> threading.Lock serializing its compiles in this process
_key_locks_guard = threading.Lock()
_unusable_warned = set()  # directories already reported unusable by this process
_unusable_guard = threading.Lock()


class CacheWarning(UserWarning):
    """A cache entry or directory could not be used; tritile rebuilt the entry or kept the result
    in memory, and the compile (or tuning) went on."""


def cache_dir() -> Path:
    root = os.environ.get("TRITILE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tritile")
    return Path(root)


def cache_key(ir_text: str, specialization, target) -> str:
    h = hashlib.sha256()
    for part in (ir_text, repr(specialization), str(target), VERSION_KEY):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def lookup(key: str):
    return _memory.get(key)


def remember(key: str, value):
    _memory[key] = value
    return value


def warn(message: str) -> None:
    warnings.warn(message, CacheWarning, stacklevel=3)


def warn_unusable(directory: Path, err: OSError, consequence: str) -> None:
    """One `CacheWarning` per directory and process: a cache directory that cannot be written
    fails every compile the same way, and the fallback (`consequence`) needs saying once."""
    with _unusable_guard:
        if str(directory) in _unusable_warned:
            return
        _unusable_warned.add(str(directory))
    warn(f"the cache directory {directory} cannot be used ({type(err).__name__}: {err}); {consequence}")


# ---------------------------------------------------------------- tritile's disk cache
def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` by a file holding `data` in one step: a temporary file in the same
    directory, then `os.replace`, so readers in other threads and processes see the old file or
    the new one, never a part.  The directory is (re)created first, and the write tried once more
    if the directory vanished in between (another process clearing the cache).  Raises OSError
    when the directory cannot be used."""
    try:
        _replace(path, data)
    except FileNotFoundError:
        _replace(path, data)


def _replace(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def store_module(key: str, source: str) -> Optional[Path]:
    """The file of the generated module for `key`, holding `source`: an identical file is kept,
    a missing one written, a damaged one (other bytes: corrupt, truncated; or unreadable) written
    again with a `CacheWarning` naming it.  None when the directory cannot be used (one
    `CacheWarning` per directory): the caller keeps the module in memory.

    The file name carries a digest of `source` besides the key: the key does not cover the code
    generator itself, so a module an older generator wrote for the same key has another name and
    is replaced silently, while other bytes under this name can only be damage."""
    data = source.encode()
    path = cache_dir() / "gluon" / f"k_{key}_{hashlib.sha256(data).hexdigest()[:16]}.py"
    try:
        if path.read_bytes() == data:
            return path
        damage = "its bytes are not the generated module: corrupt or truncated"
    except (FileNotFoundError, NotADirectoryError):
        damage = None  # a cold entry; or an unusable directory, which the write reports
    except OSError as err:
        damage = f"unreadable: {type(err).__name__}: {err}"
    try:
        write_atomic(path, data)
    except OSError as err:
        warn_unusable(path.parent, err, "generated modules are kept in memory only")
        return None
    if damage is not None:
        warn(f"discarded tritile's cache entry {path} ({damage}) and wrote it again")
    for stale in path.parent.glob(f"k_{key}_*.py"):
        if stale != path:
            with contextlib.suppress(OSError):
                stale.unlink()
    return path


@contextlib.contextmanager
def compile_lock(key: str):
    """Hold `key`'s compile lock: a `threading.Lock` per key in this process, and an exclusive
    `flock` on ``gluon/k_<key>.lock`` across processes sharing the cache directory.  Where that
    file cannot be made (an unusable directory, no `fcntl`) only the in-process lock is taken:
    concurrent processes then compile the same kernel twice, which atomic writes make harmless."""
    with _key_locks_guard:
        lock = _key_locks.setdefault(key, threading.Lock())
    with lock:
        fd = _flock(cache_dir() / "gluon" / f"k_{key}.lock")
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)  # releases the flock


def _flock(path: Path) -> Optional[int]:
    """An open descriptor of `path` holding an exclusive flock, or None where that cannot be had.
    Lock files are never removed: a process waiting on a removed one would lock a stale inode."""
    if fcntl is None:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None  # store_module reports the unusable directory
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:  # a file system without flock
        os.close(fd)
        return None
    return fd


# ---------------------------------------------------------------- Triton's cache
def triton_compile(src, gpu_target, options: dict):
    """`triton.compile(src, target=gpu_target, options=options)`, served from Triton's cache only
    when the entry is sound (see the module docstring).  Exceptions of a compile that does not
    involve the cache (the kernel does not compile) propagate unchanged; an `OSError` that a retry
    on a discarded entry does not cure means Triton's cache directory is unusable: the compile
    runs again with a private one (`_private_triton_cache`)."""
    with ast_parse_turn:  # Triton parses the kernel's source: one parse at a time (gh-106905)
        try:
            return _triton_compile_healing(src, gpu_target, options)
        except OSError as err:
            if not _private_triton_cache(err):
                raise
        return triton.compile(src, target=gpu_target, options=options)


def _triton_compile_healing(src, gpu_target, options: dict):
    entry = triton_cache_entry(src, gpu_target, options)
    group = entry / f"__grp__{src.name[:150]}.json" if entry is not None else None
    hit = group is not None and group.exists() and not _discard_damaged(group)
    try:
        return triton.compile(src, target=gpu_target, options=options)
    except Exception as err:
        if group is None or not (hit or isinstance(err, OSError)):
            raise
        with contextlib.suppress(OSError):
            group.unlink()
        compiled = triton.compile(src, target=gpu_target, options=options)  # OSError: the whole dir
        warn(f"Triton's cache entry {entry} could not be used ({type(err).__name__}: {err}); "
             f"discarded it and compiled again")
        return compiled


def _private_triton_cache(err: OSError) -> bool:
    """Point Triton's cache at a fresh temporary directory (through ``TRITON_CACHE_DIR``, which
    Triton reads on every compile; unlike an assignment to ``knobs.cache.dir`` a later change of
    the variable still counts) after `err` showed the configured one unusable; one
    `CacheWarning`.  False under a custom cache manager or a directory set through the knob,
    neither of which is ours to replace."""
    from triton import knobs

    if knobs.cache.manager_class is not None or not knobs.cache.dir or "dir" in vars(knobs.cache):
        return False
    unusable = Path(knobs.cache.dir)
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="tritile-triton-cache-")
    warn_unusable(unusable, err, f"Triton's cache is {os.environ['TRITON_CACHE_DIR']} for the rest of this process")
    return True


def triton_cache_entry(src, gpu_target, options: dict) -> Optional[Path]:
    """The directory of Triton's file cache that `triton.compile(src, gpu_target, options)` reads
    and writes, computed as Triton 3.6's `compile` does; None under a custom cache manager
    (``TRITON_CACHE_MANAGER``), whose layout is its own."""
    from triton import knobs
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import _base32, get_cache_key

    if knobs.cache.manager_class is not None or not knobs.cache.dir:
        return None
    backend = make_backend(gpu_target)
    parsed = backend.parse_options(dict(options, **src.parse_options()))
    key = get_cache_key(src, backend, parsed, get_cache_invalidating_env_vars())
    return Path(knobs.cache.dir) / _base32(hashlib.sha256(key.encode()).hexdigest())


def _discard_damaged(group: Path) -> bool:
    """Check the cache hit that Triton's `group` file promises; if any file it reads is damaged,
    remove those files and the group (Triton then compiles afresh and rewrites them), with one
    `CacheWarning` naming them.  Returns whether anything was discarded."""
    problems = _damaged_artifacts(group)
    if not problems:
        return False
    for path, _ in problems:
        with contextlib.suppress(OSError):
            path.unlink()
    with contextlib.suppress(OSError):
        group.unlink()
    listed = "; ".join(f"{path} ({why})" for path, why in problems)
    warn(f"discarded damaged files of Triton's cache: {listed}; compiling the kernel again")
    return True


def _damaged_artifacts(group: Path) -> list:
    """[(path, why)] for the group file and every file it lists that a cache hit could not use."""
    try:
        children = json.loads(group.read_bytes().decode())["child_paths"]
        paths = [Path(p) for p in children.values()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return [(group, f"not a group of Triton's cache: {type(err).__name__}: {err}")]
    problems = []
    for path in paths:
        try:
            why = _artifact_problem(path, path.read_bytes())
        except OSError as err:
            why = f"unreadable: {type(err).__name__}: {err}"
        if why is not None:
            problems.append((path, why))
    return problems


def _artifact_problem(path: Path, data: bytes) -> Optional[str]:
    """Why `data` cannot be the artifact Triton wrote at `path` (judged by its suffix), or None."""
    if path.suffix in (".cubin", ".hsaco"):  # NVIDIA / AMD code objects: both ELF64
        return _elf_problem(data)
    try:
        text = data.decode()
    except UnicodeDecodeError as err:
        return f"not UTF-8 text: {err}"
    if not text.strip():
        return "empty"
    if path.suffix == ".json":
        try:
            json.loads(text)
        except ValueError as err:
            return f"not JSON: {err}"
    elif path.suffix == ".ptx":
        if ".version" not in text or ".target" not in text:
            return "not PTX: no .version / .target directive"
        if not text.rstrip().endswith("}"):
            return "truncated PTX: does not end with a closing brace"
    return None


def _elf_problem(data: bytes) -> Optional[str]:
    """Why `data` is not a complete 64-bit little-endian ELF file (a cubin), or None: its
    headers and every section with contents must lie inside it."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return "not a 64-bit little-endian ELF file"
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
    if end > len(data):
        return f"truncated ELF file: headers end at byte {end}, the file has {len(data)}"
    for index in range(shnum):
        header = shoff + index * shentsize
        kind, = struct.unpack_from("<I", data, header + 4)
        offset, size = struct.unpack_from("<QQ", data, header + 0x18)
        if kind != 8 and offset + size > len(data):  # 8 = SHT_NOBITS: no bytes in the file
            return f"truncated ELF file: section {index} ends at byte {offset + size}, the file has {len(data)}"
    return None
