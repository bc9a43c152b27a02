#!/usr/bin/env bash
# The queries' document ids staged in the backward's ring by its producer (`query_ring`) against each masked step
# gathering them from global memory (the baseline at .ab/baseline: `git archive 09df52a kernels`), same process,
# after the documents check. From the repository root.
set -uo pipefail
OUT=${OUT:-/tmp/query-ids-ring}
export PYTHONPATH=$PWD:$PWD/scripts
quiet() { grep -v -i warn | grep -v create_block_mask; }
timeout 130 python scripts/bench_masks.py --check-only --masks documents --providers flash \
  --out "$OUT/check_documents.json" > "$OUT/check.log" 2>&1
rc=$?
quiet < "$OUT/check.log" | tail -6
echo "check: rc $rc"
[ $rc -eq 0 ] || exit $rc
timeout 200 python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes bwd,fwd_bwd --head-dims 64 \
  --seq-lens 4096,16384,65536 --dropout 0,0.1 --masks documents --rounds 3 --out "$OUT/ab_query_ids_ring.json" 2>&1 \
  | quiet | tail -14
