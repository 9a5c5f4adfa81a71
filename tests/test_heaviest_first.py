"""heaviest_first (lowering/heaviest_first.py): blocks whose pipelined loops run longest are
launched first.  Causal attention's row block bx reads bx + 1 key tiles, so its row axis is
reversed; kernels whose trip counts do not grow along an axis keep their order."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from tritile.interpreter import execute
from tritile.ir.printer import format_func
from tritile.lowering import run_passes
from tritile.runtime.kernel import JITKernel
from tritile.runtime.target import Target

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_warp_specialization import attention_ir, gemm_ir  # noqa: E402

H100 = Target("cuda", 90)


def test_causal_attention_launches_its_last_row_blocks_first():
    final = run_passes(attention_ir(True), H100)[-1][1]
    assert final.kernel.reversed_axes == (0,)
    assert "# heaviest blocks first: grid axes [0] launched in reverse" in format_func(final)
    source = JITKernel(attention_ir(True), target=H100).get_source("gluon")
    assert "bx = gl.num_programs(0) - 1 - gl.program_id(0)" in source
    assert "by = gl.program_id(1)" in source


def test_uniform_trip_counts_keep_the_launch_order():
    for func in (attention_ir(False), gemm_ir()):
        assert run_passes(func, H100)[-1][1].kernel.reversed_axes == ()


def test_values_do_not_depend_on_the_order():
    from examples.flash_attention import ref_program

    stages = dict(run_passes(attention_ir(True), H100))
    q, k, v = (torch.randn(1, 2, 512, 128, dtype=torch.float16) for _ in range(3))
    out = torch.empty_like(q)
    execute(stages["heaviest_first"], [q, k, v, out], {})
    torch.testing.assert_close(out.float(), ref_program(q, k, v, True).float(), rtol=1e-2, atol=1e-2)
