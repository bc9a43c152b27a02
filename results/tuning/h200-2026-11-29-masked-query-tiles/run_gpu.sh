#!/usr/bin/env bash
# Ran 2026-11-29 on one H200 (README.md has the result: not kept). The
# fused backward under masks without dropout at D = 64 on 32 × 128 tiles with the dQ
# warpgroup (as masked calls with dropout already run) instead of the dense table's 64 × 128: in the 16K profile
# (../h200-2026-11-29-masked-stalls/) a documents program walks ~21 query tiles of which ~4.6 are masked steps (the
# peeled diagonal, the rest of the diagonal, a document's end), each costing ~1.6x an unmasked one; 32-query tiles
# halve the area each edge costs. Compiles for sm_90a without spills or ptxas warnings (kernel_sass.py, documents /
# window / blocks at 16K).
#   git apply results/tuning/h200-2026-11-29-masked-query-tiles/query_tiles_32.diff
#   mkdir -p .ab/baseline && git archive HEAD kernels | tar -x -C .ab/baseline
#   run carry=[".ab"]: bash results/tuning/h200-2026-11-29-masked-query-tiles/run_gpu.sh
# Keep it only where it wins; tests/test_tuning.py's routing cases then need the new tiles.
set -uo pipefail
OUT=${OUT:-/tmp/masked-query-tiles}
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
  --rounds 3 --out "$OUT/ab_query_tiles_32.json" 2>&1 | quiet | tail -26
