#!/usr/bin/env bash
# int32 document ids (tile_schedule.canonical_document_ids) against the int64 ids the kernels compared before, same
# process; then the documents check on the GPU. Run from the repository root with the baseline at .ab/baseline:
#   mkdir -p .ab/baseline && git archive <before> kernels | tar -x -C .ab/baseline
set -uo pipefail
OUT=${OUT:-/tmp/int32-ids}
export PYTHONPATH=$PWD:$PWD/scripts
timeout 330 python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes fwd,bwd,fwd_bwd --head-dims 64 \
  --seq-lens 4096,16384,65536 --dropout 0,0.1 --masks documents --rounds 3 --out "$OUT/ab_int32_ids.json" 2>&1 \
  | grep -v -i warn | tail -24
timeout 200 python scripts/bench_masks.py --check-only --seq-lens 4096 --masks documents --providers flash \
  --out "$OUT/check_documents.json" 2>&1 | grep -v -i warn | tail -6
