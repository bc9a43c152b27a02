#!/usr/bin/env bash
# One device call: the persistent dQ pass applied, checked, then timed against HEAD's kernels in one process.
#   run: bash results/tuning/sass-2026-11-28-persistent-dq/run_gpu.sh   (writes under $OUT)
set -uo pipefail
export PYTHONPATH=$PWD:$PWD/scripts
OUT=${OUT:-/tmp/persistent-dq}
mkdir -p "$OUT" .ab
rm -rf .ab/baseline && mkdir -p .ab/baseline && git archive HEAD kernels | tar -x -C .ab/baseline
git apply results/tuning/sass-2026-11-28-persistent-dq/persistent_dq.diff || exit 1
python results/tuning/h200-2026-11-28-dq-row-loads/check_dlse.py > "$OUT/check_dlse.log" 2>&1
echo "check_dlse: $?"
python scripts/bench_attention.py --check-only --head-dims 64,128 --out "$OUT/check_dense.json" > "$OUT/check_dense.log" 2>&1
echo "check dense: $?"
python scripts/bench_masks.py --check-only --out "$OUT/check_masks.json" > "$OUT/check_masks.log" 2>&1
echo "check masks: $?"
python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes bwd --head-dims 64,128 --seq-lens 4096,16384 \
    --masks none,window_1k,documents,strided --rounds 3 --out "$OUT/ab_persistent_dq.json" 2>&1 | tail -40
git apply -R results/tuning/sass-2026-11-28-persistent-dq/persistent_dq.diff
