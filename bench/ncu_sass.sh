#!/bin/sh
# Per-SASS-instruction warp-stall samples of one bench/profile_gaps.py case, for finding where
# a kernel's cycles go (which barrier, which wait):
#   bench/ncu_sass.sh causal "$OUT"   ->  $OUT/causal.ncu-rep, $OUT/causal_sass.csv
# Summarise the CSV with bench/sass_stalls.py.  Clocks are left alone (--clock-control none).
set -e
case="$1"; out="$2"
ncu --clock-control none --section SourceCounters --section WarpStateStats --section LaunchStats \
    -k regex:'main|matmul|cudnn|fmha|flash' --launch-skip 1 --launch-count 1 -f -o "$out/$case" \
    python3 bench/profile_gaps.py "$case"
ncu -i "$out/$case.ncu-rep" --page source --csv --print-source sass > "$out/${case}_sass.csv"
ncu -i "$out/$case.ncu-rep" > "$out/${case}_summary.txt"
