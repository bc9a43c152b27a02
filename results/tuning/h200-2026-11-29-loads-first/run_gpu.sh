#!/usr/bin/env bash
# Ran 2026-11-29 on one H200 (README.md: not kept). Every Gluon pass issues its resident
# tiles' loads (the forward's Q, the dQ pass's Q and dO, the dK/dV and fused passes' K and V) before it reads its
# mask's schedule, rather than after (loads_first.diff).
#   mkdir -p .ab/baseline && git archive HEAD kernels | tar -x -C .ab/baseline   (HEAD without the change)
#   run carry=[".ab"]: bash results/tuning/h200-2026-11-29-loads-first/run_gpu.sh
set -uo pipefail
OUT=${OUT:-/tmp/loads-first}
export PYTHONPATH=$PWD:$PWD/scripts
quiet() { grep -v -i warn | grep -v create_block_mask; }
timeout 240 python scripts/bench_masks.py --check-only --providers flash --out "$OUT/check_masks.json" \
  > "$OUT/check.log" 2>&1
rc=$?
quiet < "$OUT/check.log" | tail -4
echo "check: rc $rc"
[ $rc -eq 0 ] || exit $rc
timeout 420 python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes fwd,bwd --head-dims 64 \
  --seq-lens 4096,16384,65536 --dropout 0 --masks none,documents,window_1k,local_global,strided,butterfly \
  --rounds 3 --out "$OUT/ab_loads_first.json" 2>&1 | quiet | tail -37
