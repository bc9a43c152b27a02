#!/usr/bin/env bash
# FlashAttention-4's conditional rescaling in the Gluon forward's mask-free steps (lazy_rescale.diff):
# the accumulator, l and m are rescaled only once some row's max has grown past the reference max by more than 2^8,
# a warpgroup-wide decision (one cross-warp max a step). Static counts (kernel_sass.py --loops, D = 64, 16K):
#   dense mask-free step 408 -> 431 instructions, of which about 44 (32 FMUL of the rescale) sit in the skipped
#   block: about 387 on the common path, plus two warpgroup barriers a step (3 -> 5); documents' mask-free step
#   (64 x 64) 257 -> 285, about 245 on the common path. No spill, no ptxas warning (C7515 included).
#   git apply results/tuning/h200-2026-11-29-lazy-rescale/lazy_rescale.diff
#   mkdir -p .ab/baseline && git archive HEAD kernels | tar -x -C .ab/baseline
#   run carry=[".ab"]: bash results/tuning/h200-2026-11-29-lazy-rescale/run_gpu.sh
# Keep it only where it wins (the forward alone, and fwd+bwd), checks first.
set -uo pipefail
OUT=${OUT:-/tmp/lazy-rescale}
export PYTHONPATH=$PWD:$PWD/scripts
quiet() { grep -v -i warn | grep -v create_block_mask; }
timeout 300 python scripts/bench_masks.py --check-only --providers flash --out "$OUT/check_masks.json" > "$OUT/check.log" 2>&1
rc=$?
quiet < "$OUT/check.log" | grep -v ": ok" | tail -3
echo "mask checks: rc $rc"
[ $rc -eq 0 ] || exit 1
for p in 0 0.1; do
  timeout 150 python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes fwd --head-dims 64,128 \
    --seq-lens 4096,16384 --dropout $p --masks none,documents,window_1k --rounds 3 \
    --out "$OUT/ab_fwd_dropout_$p.json" 2>&1 | quiet | tail -13
done
