"""What-if edits of generated Gluon sources, for upper bounds the profiler cannot give: time a
kernel with one piece of work removed (its results are then wrong, and reported as such).

`schedule_variants.py` applies them to a variant whose environment names them:
    EXTRA_VARIANTS='{"no_q_reload": {"SOURCE_PATCHES": "q_first_tile_only"}}'
Each patch edits the module text `tritile.codegen.gluon.kernel_module.emit_module` returns; one
whose pattern a kernel lacks leaves that kernel alone.
"""
from __future__ import annotations

import dataclasses
import re


def q_first_tile_only(source: str) -> str:
    """A persistent attention consumer loads its Q tile for the first tile only: the most a
    prefetch of the next tile's Q (under the current tile's last iterations) could save."""
    return re.sub(r"^(\s*)(Q_shared\.index\(part\)\.store\(gl\.load\()", r"\1if tile_iter == 0: \2", source,
                  flags=re.M)


def no_output_store(source: str) -> str:
    """The attention epilogue still writes O to shared memory, but neither reads it back nor
    stores it to global memory: the most an asynchronous (TMA) store could save."""
    source = re.sub(r"^\s*_v\d+ = O_shared\.index\(part\)\.load\(.*\n", "", source, flags=re.M)
    return re.sub(r"^\s*gl\.store\(Output \+ .*\n", "", source, flags=re.M)


def no_q_load(source: str) -> str:
    """A one-tile-per-CTA attention kernel never loads its Q tile: the most loading Q through
    TMA (or ahead of time) could save there."""
    return re.sub(r"^(\s*)Q_shared\.store\(gl\.load\(.*\n", "", source, flags=re.M)


PATCHES = {f.__name__: f for f in (q_first_tile_only, no_output_store, no_q_load)}


def install(names: str) -> None:
    """Make every kernel compiled in this process go through the patches `names` (comma-separated)."""
    from tritile.codegen.gluon import kernel_module

    chosen = [PATCHES[n] for n in names.split(",") if n]
    emit = kernel_module.emit_module

    def patched(func, target):
        gen = emit(func, target)
        source = gen.source
        for patch in chosen:
            source = patch(source)
        return dataclasses.replace(gen, source=source)

    kernel_module.emit_module = patched
