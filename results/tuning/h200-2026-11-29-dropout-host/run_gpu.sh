#!/usr/bin/env bash
# Ran 2026-11-29 on one H200 (README.md). Issue 15's last cell: head dim 64, 1K, dropout 0.1, host-bound. Where an
# eager fwd+bwd with dropout spends its host time, against one without and against cuDNN's with dropout, in one
# device call:
#   bash results/tuning/h200-2026-11-29-dropout-host/run_gpu.sh
# The table run of 2026-11-28 read 0.43 ms of host a call with dropout, 0.25 ms without, on the same process; other
# processes read 0.30-0.64 ms (results/tuning/h200-2026-11-28-short-host/).
set -uo pipefail
OUT=${OUT:-/tmp/dropout-host}
export PYTHONPATH=$PWD:$PWD/scripts
for p in 0 0.1; do
  timeout 200 python scripts/profile_host.py --dropout $p --out "$OUT/host_profile_dropout_$p.txt" 2>&1 | tail -30
done
