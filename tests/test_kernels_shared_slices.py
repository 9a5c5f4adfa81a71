"""Part of a shared tile read or written element by element inside `T.Parallel`: ``S[i + 64, j]``
over a loop of half the tile's rows (a slice of the shared tile on Gluon), and a consumer
partition's own rows of a shared tile every partition reads (lowering/consumer_partitions.py
rewrites ``A2_shared[i, j]`` over the tile into ``A2_shared[i + part * 64, j]`` over the
partition's rows).  The Gluon backend rejected both ("this indexing of shared buffer ... inside
T.Parallel") until the GPU pipeline replay of 2026-11-27 drew six such programs
(bench/NOTES.md, session 25).

On the `device` fixture's tensors against torch, compiled for sm_90 / sm_80 by both backends on
the CPU; the replay programs through the interpreter (every stage) and on the GPU.
"""
import sys
from pathlib import Path

import pytest
import torch

import tritile
import tritile.language as T
from tritile.interpreter import execute
from tritile.runtime.target import Target

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline_kernels as PK  # noqa: E402

H100 = Target("cuda", 90)


@tritile.jit(out_idx=[1])
def swapped_halves(rows, cols):
    """Y's first half of rows from X's first half through S's second, its second half from
    X's second half through S's first, each half a loop over `rows` // 2 rows (an offset may be
    any sum of the loop variable and constants)."""
    half = rows // 2

    @T.prim_func
    def main(X: T.Tensor((rows, cols), "float32"), Y: T.Tensor((rows, cols), "float32")):
        with T.Kernel(1, threads=128) as _:
            S = T.alloc_shared((rows, cols), "float32")
            for i, j in T.Parallel(half, cols):
                S[i + half, j] = X[i, j] * 2.0
            for i, j in T.Parallel(half, cols):
                S[i, j] = X[i + half, j] + 1.0
            for i, j in T.Parallel(half, cols):
                Y[i, j] = S[i + (half + 32) - 32, j]  # i + half, written as TileLang code may
            for i, j in T.Parallel(half, cols):
                Y[i + half, j] = S[i, j] * 3.0

    return main


def test_half_tiles_of_shared_memory(device):
    x = torch.randn(128, 64, device=device)
    want = torch.cat([x[:64] * 2.0, (x[64:] + 1.0) * 3.0])
    torch.testing.assert_close(swapped_halves(128, 64)(x), want)


@pytest.mark.parametrize("backend", ["gluon", "triton"])
@pytest.mark.parametrize("arch", [90, 80])
def test_half_tiles_compile(arch, backend):
    compiled = tritile.compile(swapped_halves.fn(128, 64), target=Target("cuda", arch), backend=backend)
    assert ".entry" in compiled.get_source("ptx")
    if backend == "gluon":
        source = compiled.get_kernel_source()
        assert "S.slice(64, 64, 0).store(" in source and "S.slice(64, 64, 0).load(" in source


# GPU pipeline replay, seed 20261127 (bench/results/pipeline_replay_h100.json): a second GEMM
# loop whose A tile is scaled row by row into a register operand, the rows split across two
# consumer warpgroups (the first with a producer warp asked for, the second by default)
PARTITION_ROWS = [
    "GemmChain(tiles=(128, 128, 32), threads=256, stages=(4, 1), m=256, n=128, k_sizes=(96, 32), use='operand', "
    "cast_fragment=True, switches=(('TRITILE_WARP_SPECIALIZE', '1'),))",
    "GemmChain(tiles=(128, 64, 32), threads=256, stages=(2, 3), m=256, n=384, k_sizes=(128, 32), use='operand', "
    "reuse_acc=True, scale=0.125, relu=True, cast_fragment=True, policy='FullRow')",
]


def _final(program: str):
    spec = eval(program, vars(PK))
    return spec, PK.lower(spec, H100)[-1][1]


@pytest.mark.parametrize("program", PARTITION_ROWS)
def test_a_partitions_rows_of_a_shared_tile_compile(program):
    from tritile.codegen.gluon import compile_kernel

    spec, final = _final(program)
    compiled = compile_kernel(final, H100)
    assert "A2_shared.slice((part * 64), 64, 0).load(" in compiled.source
    assert ".entry" in compiled.asm["ptx"]


@pytest.mark.parametrize("program", PARTITION_ROWS)
def test_a_partitions_rows_of_a_shared_tile_interpreted(program):
    spec, final = _final(program)
    args = PK.program_args(spec, 61461)
    execute(final, args, PK.program_dims(spec, args))
    (want, rtol, atol), = PK.program_expected(spec, args)
    torch.testing.assert_close(PK.program_outputs(spec, args)[0], want, rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("program", PARTITION_ROWS)
def test_a_partitions_rows_of_a_shared_tile_on_the_gpu(program):
    from tritile.codegen.gluon import compile_kernel

    spec, final = _final(program)
    args = PK.program_args(spec, 61461, "cuda")
    compile_kernel(final, H100).launch(args, PK.program_dims(spec, args))
    (want, rtol, atol), = PK.program_expected(spec, args)
    torch.testing.assert_close(PK.program_outputs(spec, args)[0], want, rtol=rtol, atol=atol)
