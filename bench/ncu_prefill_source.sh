#!/usr/bin/env bash
# Per-SASS-instruction profile of one prefill kernel (device): executed instructions and warp-stall
# samples per instruction, plus the kernel's stall reasons and pipe use, as CSVs under $OUT.
# Usage: bash bench/ncu_prefill_source.sh [path] [format] [shape]   (defaults: wg8w nvfp4 4/2/128;
# bench/ncu_prefill.py's launch: T 2048 at 32768 keys, the second of two launches)
# Read it with: python3 bench/ncu_source_profile.py $OUT/<tag>_sass.csv --values <scores>
set -u
P=${1:-wg8w}; F=${2:-nvfp4}; S=${3:-4/2/128}
TAG=ncu_${P}_${F}_${S//\//-}
R=$(mktemp -d)/$TAG
timeout 300 ncu --clock-control none --kernel-name-base function -k regex:'attn_mma_fa|attn_ws' -s 1 -c 1 \
  --section SourceCounters --section WarpStateStats --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section SpeedOfLight --section LaunchStats --section Occupancy \
  -o "$R" python3 bench/ncu_prefill.py "$F" --path "$P" --shape "$S" > "$OUT/${TAG}_run.log" 2>&1
tail -n 5 "$OUT/${TAG}_run.log"
ncu -i "$R.ncu-rep" --page source --csv --print-source sass > "$OUT/${TAG}_sass.csv" 2> "$OUT/${TAG}_sass.err"
ncu -i "$R.ncu-rep" --page details --csv > "$OUT/${TAG}_details.csv" 2>&1
wc -l "$OUT/${TAG}_sass.csv" "$OUT/${TAG}_details.csv"
grep -E "Duration|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|Shared Memory|Registers Per" "$OUT/${TAG}_details.csv" | cut -c1-200 | head -20
