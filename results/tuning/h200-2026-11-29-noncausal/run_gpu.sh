#!/usr/bin/env bash
# Non-causal attention through the causal table's entries (kernels/tuning.py `lookup_key`) against HEAD's untuned
# defaults: the checks and peers (check_and_peers.py), then the same-process A/B.
#   mkdir -p .ab/baseline && git archive HEAD kernels | tar -x -C .ab/baseline   (HEAD before the change)
#   run carry=[".ab"]: bash results/tuning/h200-2026-11-29-noncausal/run_gpu.sh
set -uo pipefail
OUT=${OUT:-/tmp/noncausal}
export PYTHONPATH=$PWD:$PWD/scripts
quiet() { grep -v -i warn; }
timeout 240 python results/tuning/h200-2026-11-29-noncausal/check_and_peers.py --out "$OUT/check_and_peers.json" 2>&1 | quiet
timeout 240 python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes fwd,bwd,fwd_bwd --head-dims 64,128 \
  --seq-lens 1024,4096,16384 --masks full --rounds 3 --out "$OUT/ab_full.json" 2>&1 | quiet
