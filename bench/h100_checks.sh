#!/usr/bin/env bash
# A session's correctness checks on the GPU machine, in one call: the GPU test suite under each
# backend (Gluon, the default on Hopper; then TRITILE_BACKEND=triton) and TileLang's own programs
# through their runner (import tilelang -> tritile).  Results go to $OUT (default bench/results):
# h100_gpu_tests.txt, h100_gpu_tests_triton.txt, tilelang_examples_h100.txt.  Each suite is cut
# off after 5 minutes (a hung kernel must not take the call's whole device time).
#
# usage: TREE=<commit> bench/h100_checks.sh EXAMPLES_DIR [PROGRAM_LIST]
#   EXAMPLES_DIR: TileLang's programs and run.py (../shared/tilelang-examples, copied where the
#   machine can read it); PROGRAM_LIST a file name in it (programs.txt by default).  run.py gives
#   each program a PYTHONPATH of its own that starts with EXAMPLES_DIR: a package the examples
#   import and the machine lacks (einops, for example_gqa_decode) is unpacked there.
set -u
examples=$1
list=${2:-programs.txt}
out=${OUT:-bench/results}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
machine=$(python -c "import torch, triton; print(torch.cuda.get_device_name(), '(torch', torch.__version__ + ', triton', triton.__version__ + ')')")
header() {
    echo "# $1 on $machine, tree ${TREE:-unknown}, $(date -u +%F)"
}
header "python -m pytest -q -m gpu tests -n 15" > "$out/h100_gpu_tests.txt"
timeout 300 python -m pytest -q -m gpu tests -n 15 -p no:cacheprovider 2>&1 | grep -v "Warning\|warner\|^$" | tail -40 >> "$out/h100_gpu_tests.txt"
header "TRITILE_BACKEND=triton python -m pytest -q -m gpu tests -n 15" > "$out/h100_gpu_tests_triton.txt"
TRITILE_BACKEND=triton timeout 300 python -m pytest -q -m gpu tests -n 15 -p no:cacheprovider 2>&1 | grep -v "Warning\|warner\|^$" | tail -40 >> "$out/h100_gpu_tests_triton.txt"
header "run.py . EXAMPLES --list $list --jobs 8" > "$out/tilelang_examples_h100.txt"
python "$examples/run.py" . "$examples" --list "$list" --jobs 8 >> "$out/tilelang_examples_h100.txt" 2>&1
tail -n 3 "$out/h100_gpu_tests.txt" "$out/h100_gpu_tests_triton.txt" "$out/tilelang_examples_h100.txt"
