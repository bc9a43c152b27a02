#!/usr/bin/env bash
# The next step of this folder in one device call (about 4 minutes), from the repository root: the two-warpgroup
# fused backward at D = 64 (f2late: each warpgroup sends its own dQ; f2split: the pair sums dQ and each sends one
# half of D) built as copies of kernels/ in .ab/, checked against the reference, then timed against HEAD's
# backward in one process. Results under $OUT.
#   bash results/tuning/h200-2026-11-28-fused-reduce/run_gpu.sh   (under 9 minutes: each step has a time limit)
set -uo pipefail
OUT=${OUT:-/tmp/fused-reduce}
mkdir -p "$OUT"
here=$PWD/results/tuning/h200-2026-11-28-fused-reduce
for t in f2late f2split; do
  rm -rf ".ab/$t" && mkdir -p ".ab/$t" && cp -r flashgpt kernels scripts model pyproject.toml ".ab/$t/"
  (cd ".ab/$t" && { git apply "$here/$t.diff" 2> /dev/null || patch -s -p1 < "$here/$t.diff"; }) || exit 1
done
# The copies' table sends every dense D = 64 call without dropout to the two-warpgroup fused backward.
# A new handshake between warpgroups may hang rather than fail: each step has a time limit.
PYTHONPATH=$PWD/.ab/f2split:$PWD/.ab/f2split/scripts timeout 240 python .ab/f2split/scripts/bench_attention.py --check-only \
  --head-dims 64 --out "$OUT/check_f2split.json" 2>&1 | grep -v -i warn | tail -15
for t in f2split f2late; do
  PYTHONPATH=$PWD:$PWD/scripts timeout 150 python scripts/ab_kernels.py --baseline ".ab/$t/kernels" --passes bwd,fwd_bwd \
    --head-dims 64 --seq-lens 2048,4096,8192,16384 --dropout 0 --rounds 3 --out "$OUT/ab_head_vs_$t.json" 2>&1 \
    | grep -v -i warn | tail -9
done
