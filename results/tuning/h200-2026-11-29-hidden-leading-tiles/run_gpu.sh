#!/usr/bin/env bash
# The paired fused backward's second math warpgroup skips the walk's leading query tiles its keys are hidden from
# (hidden_leading_tiles.diff): checks, then an A/B against .ab/baseline (HEAD's kernels). Ran 2026-11-29 on one
# H200 (README.md: kept at D = 64), the attention check then under a 200 s limit.
set -uo pipefail
OUT=${OUT:-/tmp/hidden-leading-tiles}
export PYTHONPATH=$PWD:$PWD/scripts
quiet() { grep -v -i warn | grep -v create_block_mask; }
timeout 420 python scripts/bench_attention.py --check-only --out "$OUT/check_attention.json" > "$OUT/check_attention.log" 2>&1
rc1=$?
timeout 150 python scripts/bench_masks.py --check-only --providers flash --out "$OUT/check_masks.json" \
  > "$OUT/check_masks.log" 2>&1
rc2=$?
quiet < "$OUT/check_attention.log" | tail -3
quiet < "$OUT/check_masks.log" | tail -2
echo "checks: rc $rc1 $rc2"
[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] || exit 1
timeout 200 python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes bwd --head-dims 64 \
  --seq-lens 16384,65536 --dropout 0 --masks none,documents,window_1k,window_4k --rounds 3 \
  --out "$OUT/ab_masks.json" 2>&1 | quiet | tail -9
timeout 150 python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes bwd --head-dims 64,128 \
  --seq-lens 4096,8192,16384 --dropout 0 --rounds 3 --out "$OUT/ab_dense.json" 2>&1 | quiet | tail -7
