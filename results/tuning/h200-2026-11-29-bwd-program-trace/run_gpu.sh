#!/usr/bin/env bash
# Per-program timestamps of the Gluon fused backward (trace.diff applied to kernels/ first):
#   git apply results/tuning/h200-2026-11-29-bwd-program-trace/trace.diff
#   run: bash results/tuning/h200-2026-11-29-bwd-program-trace/run_gpu.sh
set -uo pipefail
OUT=${OUT:-/tmp/bwd-program-trace}
export PYTHONPATH=$PWD:$PWD/scripts
timeout 400 python results/tuning/h200-2026-11-29-bwd-program-trace/trace_programs.py --out "$OUT/trace.json" 2>&1 \
  | grep -v -i warn | tail -80
