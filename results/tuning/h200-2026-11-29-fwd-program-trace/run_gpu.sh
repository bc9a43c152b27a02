#!/usr/bin/env bash
# Ran 2026-11-29 on one H200 (README.md). Per-program timestamps of the Gluon forward (trace.diff applied to
# kernels/ first: git apply results/tuning/h200-2026-11-29-fwd-program-trace/trace.diff).
set -uo pipefail
OUT=${OUT:-/tmp/fwd-program-trace}
export PYTHONPATH=$PWD:$PWD/scripts
timeout 300 python results/tuning/h200-2026-11-29-fwd-program-trace/trace_forward.py --out "$OUT/trace.json" 2>&1 \
  | grep -v -i warn | tail -80
