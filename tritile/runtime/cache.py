"""Kernel caches: an in-process dict and an on-disk directory of generated sources.

Key = sha256 of (final IR text, specialization, target, tritile version, triton version).
The disk cache lives under ``$TRITILE_CACHE_DIR`` (default ``~/.cache/tritile``); it holds
the generated Gluon modules (``gluon/<key>.py``), which `@gluon.jit` needs as real files to
read its source.  Triton's own cache then serves the cubin for an unchanged module: its
key is extended with tritile's version by `compiler.TritileGluonSource.hash`, because in
Triton 3.6 nothing else of ours is part of it.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import triton

import tritile

VERSION_KEY = f"tritile-{tritile.__version__}/triton-{triton.__version__}"

_memory = {}


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


def write_source(key: str, source: str) -> Path:
    """The generated module's path for `key`, written atomically unless already there."""
    directory = cache_dir() / "gluon"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"k_{key}.py"
    if not path.exists() or path.read_text() != source:
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    return path
