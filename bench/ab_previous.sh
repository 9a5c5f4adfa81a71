#!/bin/sh
# Attention under the default schedule from this tree and from an earlier commit's tree, one
# process each, alternating: an A/B of a code-generation change.  Prepare the earlier tree with
#   rm -rf build/prev && mkdir -p build/prev && git archive REV tritile examples bench tests | tar -x -C build/prev
# and carry build/prev to the GPU machine.  Output: $OUT/ab_{new,prev}_N.json
set -e
for round in 1 2; do
  for tree in prev new; do
    dir=.; [ "$tree" = prev ] && dir=build/prev
    (cd "$dir" && PYTHONPATH=$PWD VARIANTS=persistent CASES="${CASES:-attn}" ROUNDS=1 OUT= \
       python3 bench/schedule_variants.py | grep "^| attn\|^| gemm" | sed "s/^/$tree $round /")
  done
done
