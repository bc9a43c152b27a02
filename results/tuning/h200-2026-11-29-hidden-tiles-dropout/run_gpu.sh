#!/usr/bin/env bash
# The hidden-tile skip of ../h200-2026-11-29-hidden-leading-tiles/ with dropout too (with_dropout.diff), run as:
#   git apply with_dropout.diff; mkdir -p .ab/baseline && git archive HEAD kernels | tar -x -C .ab/baseline
#   run carry=[".ab"]: bash results/tuning/h200-2026-11-29-hidden-tiles-dropout/run_gpu.sh
# Keep it only where it wins; tests/test_kernel_codegen.py's KNOWN_SPILLS then need the new cases.
set -uo pipefail
OUT=${OUT:-/tmp/hidden-tiles-dropout}
export PYTHONPATH=$PWD:$PWD/scripts
quiet() { grep -v -i warn | grep -v create_block_mask; }
timeout 420 python scripts/bench_attention.py --check-only --out "$OUT/check_attention.json" > "$OUT/check.log" 2>&1
rc1=$?
timeout 150 python scripts/bench_masks.py --check-only --providers flash --out "$OUT/check_masks.json" >> "$OUT/check.log" 2>&1
rc2=$?
quiet < "$OUT/check.log" | tail -3
echo "checks: rc $rc1 $rc2"
[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] || exit 1
timeout 200 python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes bwd --head-dims 64 \
  --seq-lens 4096,16384,65536 --dropout 0.1 --masks none,documents,window_1k,window_4k --rounds 3 \
  --out "$OUT/ab_dropout.json" 2>&1 | quiet | tail -13
