#!/usr/bin/env bash
# Why the persistent fused backward's code runs 6-8% slower a step than 87a5431's, with one item per
# program (../h200-2026-11-29-persistent-bwd/: its steady loops are within 2-5 instructions of the baseline's, the
# same registers, no spill in a step): Nsight Compute on one dense 16K fwd+bwd of each build, fused kernel only.
#   (outside the repository, where git apply honours --include:)
#   rm -rf /tmp/pk && mkdir -p /tmp/pk && git archive 87a5431 kernels | tar -x -C /tmp/pk
#   (cd /tmp/pk && git apply --include='kernels/*' $REPO/results/tuning/h200-2026-11-29-persistent-bwd/persistent.diff \
#     && sed -i 's/min(grid\[0\] \* grid\[1\], sm_count(q.device))/grid[0] * grid[1]/' kernels/launch.py)
#   rm -rf .ab/one_item && mkdir -p .ab/one_item && cp -r /tmp/pk/kernels .ab/one_item/
#   run carry=[".ab"]: bash results/tuning/h200-2026-11-29-persistent-profile/run_gpu.sh
# Compare the two CSVs: issue-slot use and stall reasons of the math warpgroups (WarpStateStats), L1 and L2 hit
# rates and shared-memory carveout (MemoryWorkloadAnalysis, Occupancy), duration.
set -uo pipefail
OUT=${OUT:-/tmp/persistent-profile}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:$PWD/scripts:$PWD/results/tuning/h200-2026-11-27-ncu-masks
for build in baseline one_item; do
  rm -rf kernels && cp -r ".ab/$build/kernels" kernels  # base: 87a5431's kernels (HEAD's are the same)
  timeout 150 ncu --clock-control none --profile-from-start off -k regex:fused --section SpeedOfLight \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    -o "$OUT/$build" python results/tuning/h200-2026-11-27-ncu-masks/ncu_masks.py --seq-len 16384 --masks dense \
    > "$OUT/ncu_$build.log" 2>&1
  echo "$build: ncu rc $?"
  ncu --import "$OUT/$build.ncu-rep" --page details --csv > "$OUT/$build.csv" 2>/dev/null
done
python - "$OUT" <<'PY'
import csv, sys
rows = {}
for build in ("baseline", "one_item"):
    with open(f"{sys.argv[1]}/{build}.csv") as f:
        for r in csv.DictReader(f):
            rows.setdefault((r["Section Name"], r["Metric Name"], r["Metric Unit"]), {})[build] = r["Metric Value"]
for (section, name, unit), v in rows.items():
    if v.get("baseline") != v.get("one_item"):
        print(f"{section[:24]:24} {name[:48]:48} {unit[:10]:10} {v.get('baseline', ''):>14} {v.get('one_item', ''):>14}")
PY
