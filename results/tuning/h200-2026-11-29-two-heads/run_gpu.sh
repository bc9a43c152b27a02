#!/usr/bin/env bash
# The fused backward taking its key tile in two heads per program (`launch.fused_heads_per_program`) against one
# head per program (the baseline at .ab/baseline: `git archive 09df52a kernels | tar -x -C .ab/baseline`), same
# process, after the GPU checks of the paths it changes (the A/B runs only if they pass). From the repository root.
set -uo pipefail
OUT=${OUT:-/tmp/two-heads}
export PYTHONPATH=$PWD:$PWD/scripts
quiet() { grep -v -i warn | grep -v create_block_mask; }
timeout 130 python scripts/bench_masks.py --check-only --masks documents,window_1k --providers flash \
  --out "$OUT/check_masks.json" > "$OUT/check.log" 2>&1
rc=$?
quiet < "$OUT/check.log" | tail -8
echo "check: rc $rc"
[ $rc -eq 0 ] || exit $rc
timeout 300 python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes bwd,fwd_bwd --head-dims 64 \
  --seq-lens 4096,16384,65536 --dropout 0 --masks none,documents,window_4k --rounds 3 \
  --out "$OUT/ab_two_heads.json" 2>&1 | quiet | tail -20
