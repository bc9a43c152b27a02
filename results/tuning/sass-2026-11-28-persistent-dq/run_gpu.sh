#!/usr/bin/env bash
# The persistent forward and dQ passes (persistent.diff) checked, then timed against HEAD's kernels in one process.
# Two device calls, each under 10 minutes, each writing under $OUT, with HEAD's kernels as the baseline in .ab/
# (prepared here, carried with the call: mkdir -p .ab/baseline && git archive HEAD kernels | tar -x -C .ab/baseline):
#   bash results/tuning/sass-2026-11-28-persistent-dq/run_gpu.sh check
#   bash results/tuning/sass-2026-11-28-persistent-dq/run_gpu.sh ab
set -uo pipefail
export PYTHONPATH=$PWD:$PWD/scripts
OUT=${OUT:-/tmp/persistent}
HERE=results/tuning/sass-2026-11-28-persistent-dq
mkdir -p "$OUT"
[ -d .ab/baseline/kernels ] || { echo "carry .ab/baseline/kernels (HEAD's kernels) with the call"; exit 1; }
git apply "$HERE/persistent.diff" || exit 1
trap 'git apply -R "$HERE/persistent.diff"' EXIT
case "${1:?check | ab}" in
  check)
    python results/tuning/h200-2026-11-28-dq-row-loads/check_dlse.py > "$OUT/check_dlse.log" 2>&1
    echo "check_dlse: $?"
    python scripts/bench_attention.py --check-only --head-dims 64,128 --out "$OUT/check_dense.json" \
      > "$OUT/check_dense.log" 2>&1
    echo "check dense: $?"
    python scripts/bench_masks.py --check-only --out "$OUT/check_masks.json" > "$OUT/check_masks.log" 2>&1
    echo "check masks: $?"
    ;;
  ab)
    python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes fwd,bwd --head-dims 64,128 \
      --seq-lens 4096,16384 --masks none,window_1k,documents,strided --rounds 3 --out "$OUT/ab_persistent.json" \
      2>&1 | tail -60
    ;;
esac
