#!/usr/bin/env bash
# Second call: the non-causal dropout checks at the checks' rate (0.125; the first call's 0.1, which the kernel
# rounds to 26/256, failed only the keep-rate test against 0.9), the A/B with dropout, and the walk ceilings again.
set -uo pipefail
OUT=${OUT:-/tmp/noncausal}
export PYTHONPATH=$PWD:$PWD/scripts
quiet() { grep -v -i "warn\|create_block_mask"; }
timeout 200 python results/tuning/h200-2026-11-29-noncausal/check_and_peers.py --checks-only \
  --out "$OUT/checks_dropout.json" 2>&1 | quiet
timeout 200 python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes fwd,bwd,fwd_bwd --head-dims 64,128 \
  --seq-lens 1024,4096,16384 --masks full --dropout 0.1 --rounds 3 --out "$OUT/ab_full_dropout.json" 2>&1 | quiet
timeout 150 python scripts/bench_mask_walks.py --out "$OUT/walks.json" 2>&1 | quiet
