#!/bin/sh
# Attention under the default schedule from this tree and from earlier (or patched) trees, one
# process each, alternating: an A/B of a code-generation change.  Prepare an earlier tree with
#   rm -rf build/prev && mkdir -p build/prev && git archive REV tritile examples bench tests | tar -x -C build/prev
# and carry it to the GPU machine.  TREES (default "build/prev .") lists the trees, ROUNDS
# (default 2) the rounds; CASES=gemm times the GEMMs instead.
set -e
for round in $(seq 1 "${ROUNDS:-2}"); do
  for dir in ${TREES:-build/prev .}; do
    (cd "$dir" && PYTHONPATH=$PWD VARIANTS=persistent CASES="${CASES:-attn}" ROUNDS=1 OUT= \
       python3 bench/schedule_variants.py | grep "^| attn\|^| gemm" | sed "s|^|$dir $round |")
  done
done
