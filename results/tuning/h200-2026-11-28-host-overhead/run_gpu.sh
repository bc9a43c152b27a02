#!/usr/bin/env bash
# Not yet run. Whether pinning steadies the 1K host time (host_pin_probe.py): four processes each unpinned, on one
# core and on two (~2 min). From the repository root; JSON lines under $OUT.
#   bash results/tuning/h200-2026-11-28-host-overhead/run_gpu.sh
set -uo pipefail
OUT=${OUT:-/tmp/host-overhead}
mkdir -p "$OUT"
here=results/tuning/h200-2026-11-28-host-overhead
nproc
for cores in "" 2 2,3; do
  for i in 1 2 3 4; do
    PYTHONPATH=$PWD timeout 60 python "$here/host_pin_probe.py" --cores "$cores" 2>&1 | grep -v -i warn | tail -1 \
      | tee -a "$OUT/host_pin_probe.jsonl"
  done
done
