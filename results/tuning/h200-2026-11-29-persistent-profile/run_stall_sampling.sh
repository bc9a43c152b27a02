#!/usr/bin/env bash
# Where the fused backward's warps stall, instruction by instruction (Nsight Compute's PC sampling, the
# SourceCounters section): the baseline against the persistent build with one item per program (dense, 16K: 6-8%
# slower a step at the same instruction counts), and the baseline under documents (16K: short walks).
#   setup as in run_sections.sh (.ab/baseline, .ab/one_item); run carry=[".ab"]
set -uo pipefail
OUT=${OUT:-/tmp/stall-sampling}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:$PWD/scripts:$PWD/results/tuning/h200-2026-11-27-ncu-masks
ncu --version | tail -1
for run in baseline:dense one_item:dense baseline:documents; do
  build=${run%%:*}; mask=${run##*:}; name=${build}_$mask
  rm -rf kernels && cp -r ".ab/$build/kernels" kernels
  timeout 200 ncu --clock-control none --profile-from-start off -k regex:fused --section WarpStateStats \
    --section SourceCounters --section SpeedOfLight -o "/tmp/$name" \
    python results/tuning/h200-2026-11-27-ncu-masks/ncu_masks.py --seq-len 16384 --masks "$mask" > "/tmp/ncu_$name.log" 2>&1
  echo "$name: ncu rc $?"
  ncu --import "/tmp/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/$name.csv" 2> "/tmp/$name.err" \
    || ncu --import "/tmp/$name.ncu-rep" --page source --csv > "$OUT/$name.csv" 2>> "/tmp/$name.err"
  ncu --import "/tmp/$name.ncu-rep" --page raw --csv > "/tmp/${name}_raw.csv" 2>/dev/null
  head -c 600 "$OUT/$name.csv"; echo; tail -2 "/tmp/$name.err"
done
python - "$OUT" <<'PY'
# stall-reason totals (raw page) side by side
import csv, sys
tot = {}
for name in ("baseline_dense", "one_item_dense", "baseline_documents"):
    rows = list(csv.reader(open(f"/tmp/{name}_raw.csv")))
    if len(rows) < 3:
        continue
    for k, v in zip(rows[0], rows[2]):
        if "pcsamp_warps_issue_stalled" in k or k.endswith("pcsamp_sample_count"):
            tot.setdefault(k, {})[name] = v
with open(f"{sys.argv[1]}/stall_totals.tsv", "w") as f:
    for k, v in tot.items():
        line = f"{k}\t" + "\t".join(v.get(n, "") for n in ("baseline_dense", "one_item_dense", "baseline_documents"))
        print(line); f.write(line + "\n")
PY
ls -la "$OUT"
