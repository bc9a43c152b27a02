#!/usr/bin/env bash
# The masked fused backward without dropout at D = 64 on one math warpgroup's 64 × 64 tiles (two programs an SM)
# instead of the paired 64 × 128 (one program an SM): one_warpgroup.diff.
set -uo pipefail
OUT=${OUT:-/tmp/masked-one-warpgroup}
export PYTHONPATH=$PWD:$PWD/scripts
quiet() { grep -v -i warn | grep -v create_block_mask; }
timeout 240 python scripts/bench_masks.py --check-only --providers flash --out "$OUT/check_masks.json" \
  > "$OUT/check.log" 2>&1
rc=$?
quiet < "$OUT/check.log" | tail -12
echo "check: rc $rc"
[ $rc -eq 0 ] || exit $rc
timeout 330 python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes bwd,fwd_bwd --head-dims 64 \
  --seq-lens 16384,65536 --dropout 0 --masks documents,window_1k,window_4k,local_global,strided,butterfly \
  --rounds 3 --out "$OUT/ab_one_warpgroup.json" 2>&1 | quiet | tail -26
