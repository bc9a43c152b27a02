#!/usr/bin/env bash
# The persistent fused backward (a program an SM claiming key tiles from a counter; the next item K/V loaded
# while the last one's walk ends, dK/dV stored while the next one's starts) against 87a5431's kernels:
#   git apply persistent.diff (against 87a5431); mkdir -p .ab/baseline && git archive 87a5431 kernels | tar -x -C .ab/baseline
#   run carry=[".ab"]: bash results/tuning/h200-2026-11-29-persistent-bwd/run_gpu.sh
set -uo pipefail
OUT=${OUT:-/tmp/persistent-bwd}
export PYTHONPATH=$PWD:$PWD/scripts
quiet() { grep -v -i warn | grep -v create_block_mask; }
[ -n "${SKIP_MASK_CHECK:-}" ] || timeout 150 python scripts/bench_masks.py --check-only --providers flash --out "$OUT/check_masks.json" > "$OUT/check.log" 2>&1
rc=$?
quiet < "$OUT/check.log" | grep -v ": ok" | tail -5
echo "mask checks: rc $rc"
[ $rc -eq 0 ] || exit 1
for p in 0 0.1; do
  timeout 170 python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes bwd --head-dims 64 \
    --seq-lens 4096,16384,65536 --dropout $p --masks none,documents,window_1k,window_4k --rounds 3 \
    --out "$OUT/ab_dropout_$p.json" 2>&1 | quiet | tail -13
done
timeout 200 python scripts/bench_attention.py --check-only --out "$OUT/check_attention.json" > "$OUT/check_attention.log" 2>&1
echo "attention checks: rc $? (200 s limit: the run reaches the dense cases first)"
quiet < "$OUT/check_attention.log" | grep -c ": ok"
quiet < "$OUT/check_attention.log" | grep -v ": ok" | tail -5
