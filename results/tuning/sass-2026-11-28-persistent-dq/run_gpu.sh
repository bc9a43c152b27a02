#!/usr/bin/env bash
# A persistent patch of kernels/ checked, then timed against HEAD's kernels in one process. Each part is one device
# call under 10 minutes, writing under $OUT, with HEAD's kernels as the baseline in .ab/ (prepared here, carried
# with the call: mkdir -p .ab/baseline && git archive HEAD kernels | tar -x -C .ab/baseline):
#   bash results/tuning/sass-2026-11-28-persistent-dq/run_gpu.sh check [PATCH]   # PATCH: persistent.diff (default)
#   bash results/tuning/sass-2026-11-28-persistent-dq/run_gpu.sh ab [PATCH]      #   or persistent_headmajor.diff
set -uo pipefail
export PYTHONPATH=$PWD:$PWD/scripts
OUT=${OUT:-/tmp/persistent}
HERE=results/tuning/sass-2026-11-28-persistent-dq
PATCH=$HERE/${2:-persistent.diff}
NAME=$(basename "$PATCH" .diff)
mkdir -p "$OUT"
[ -d .ab/baseline/kernels ] || { echo "carry .ab/baseline/kernels (HEAD's kernels) with the call"; exit 1; }
git apply "$PATCH" || exit 1
trap 'git apply -R "$PATCH"' EXIT
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
    for d in 64 128; do
      python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes fwd,bwd --head-dims $d \
        --seq-lens 4096,16384 --masks none,documents,window_1k,strided --rounds 2 --out "$OUT/ab_${NAME}_d$d.json" \
        2>&1 | grep -v -i warn | tail -20
    done
    ;;
esac
