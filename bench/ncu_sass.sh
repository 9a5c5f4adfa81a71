#!/bin/sh
# Per-SASS-instruction warp-stall samples of one bench/profile_gaps.py case, for finding where
# a kernel's cycles go (which barrier, which wait):
#   bench/ncu_sass.sh causal "$OUT"   ->  $OUT/causal.ncu-rep, $OUT/causal_sass.csv
# Summarise the CSV with bench/sass_stalls.py.  Clocks are left alone (--clock-control none).
# NCU_EXTRA adds ncu options: "--profile-from-start off" for the cases that profile one range
# (fp8, bwd, ...: bench/profile_gaps.py), with NCU_SKIP=0 (launches skipped, default 1).
set -e
case="$1"; out="$2"
ncu --clock-control none --section SourceCounters --section WarpStateStats --section LaunchStats \
    -k regex:'main|matmul|cudnn|fmha|flash' --launch-skip "${NCU_SKIP:-1}" --launch-count 1 ${NCU_EXTRA:-} -f -o "$out/$case" \
    python3 bench/profile_gaps.py "$case"
ncu -i "$out/$case.ncu-rep" --page source --csv --print-source sass > "$out/${case}_sass.csv"
ncu -i "$out/$case.ncu-rep" > "$out/${case}_summary.txt"
