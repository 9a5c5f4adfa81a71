"""Every kernel of the TileLang-style suites compiles to PTX for sm_90 and sm_80 (no GPU needed).

The kernel test modules each export `COMPILE_CASES` ({case id: zero-argument builder returning
the suite's `JITKernel`}); here each case's frontend IR is recompiled as a `JITKernel` for the
target - the pass list is planned for it - and lowered through Gluon/Triton to PTX.  The GPU
runs of the same kernels are the suites' own `device == "cuda"` cases.

`BACKEND_GAPS` lists the cases the Gluon backend cannot compile yet (for both targets), with the
error it gives: they are strict xfails, so a fixed gap fails here until its entry is removed.  The
`device == "cuda"` runs of these kernels fail with the same CompileError.
"""
import importlib

import pytest

from tritile.errors import CompileError
from tritile.runtime.kernel import JITKernel
from tritile.runtime.target import Target

SUITES = ["test_kernels_gemm", "test_kernels_reduce", "test_kernels_atomic", "test_kernels_elementwise",
          "test_kernels_attention", "test_kernels_pipeline", "test_kernels_examples", "test_pipeline_seeds",
          "test_kernels_padded_tiles", "test_kernels_gqa_bwd", "test_kernels_fragment_rows",
          "test_kernels_fragment_ranges", "test_ops_attention", "test_ops_gemm_epilogue", "test_ops_split_k"]
TARGETS = {"sm90": Target("cuda", 90), "sm80": Target("cuda", 80)}

# {case id: the backend's error} for the kernels the Gluon backend cannot compile yet (none today).
BACKEND_GAPS = {}
# cases the hardware of an older target cannot run at all: the minimum architecture
MIN_ARCH = {"kernels_examples::gemm_fp8-cuda_config": 89,  # e4m3 arithmetic: sm_89+ (Triton: "fp8e4nv not supported")
            # the H100 tiles without a split: three stages of 128-key K and V tiles, 213 KB of shared memory
            "kernels_examples::flash_decoding-fused-unsplit": 90}


def compile_cases():
    for suite in SUITES:
        module = importlib.import_module(suite)
        for name, build in module.COMPILE_CASES.items():
            for target_id, target in TARGETS.items():
                case_id = f"{suite.removeprefix('test_')}::{name}"
                if target.arch < MIN_ARCH.get(case_id, 0):
                    continue
                gap = BACKEND_GAPS.get(case_id)
                marks = [pytest.mark.xfail(strict=True, raises=CompileError, reason=gap)] if gap else []
                yield pytest.param(build, target, id=f"{case_id}-{target_id}", marks=marks)


@pytest.mark.parametrize("build, target", list(compile_cases()))
def test_kernel_compiles_to_ptx(build, target):
    frontend_ir = build().stages[0][1]  # ("tile", the PrimFunc before any pass)
    ptx = JITKernel(frontend_ir, target=target).get_source("ptx")
    assert f".target sm_{target.arch}" in ptx
    assert ".entry" in ptx


def test_backend_gaps_name_existing_cases():
    case_ids = {f"{suite.removeprefix('test_')}::{name}" for suite in SUITES
                for name in importlib.import_module(suite).COMPILE_CASES}
    assert not set(BACKEND_GAPS) - case_ids, "stale BACKEND_GAPS entries"
