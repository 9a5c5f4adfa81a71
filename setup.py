"""Packaging for tritile.

The version is read from `tritile/__init__.py` as text (importing the package would need torch
at build time).  Install for development with ``pip install -e ".[test]"``.
"""
import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent


def read_version() -> str:
    text = (HERE / "tritile" / "__init__.py").read_text()
    match = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', text, re.MULTILINE)
    if match is None:
        raise RuntimeError("tritile/__init__.py does not define __version__")
    return match.group(1)


setup(
    name="tritile",
    version=read_version(),
    description="TileLang's tile programming model compiled through Triton's Gluon toolchain",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tritile", "tritile.*"]),
    python_requires=">=3.10",
    install_requires=["triton==3.6.0", "torch", "numpy"],
    extras_require={"test": ["pytest", "hypothesis"]},
    entry_points={"torch_dynamo_backends": ["tritile = tritile.contrib.torch_backend:tritile_backend"]},
)
