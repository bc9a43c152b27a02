#!/usr/bin/env bash
# This folder's device calls, each one call, from the repository root; results under $OUT. Copies of
# kernels/ (with this folder's diffs applied) go to .ab/: build them here first with `run_gpu.sh copies`, then
# call the device with carry [".ab"].
#   bash results/tuning/h200-2026-11-28-fused-reduce/run_gpu.sh pair    # the two-warpgroup fused backward at
#       D = 64 (f2late: each warpgroup sends its own dQ; f2split: the pair sums dQ, each sends one half of D;
#       f2owner: the first warpgroup computes and sends the whole sum): the summing ones checked against the
#       reference, then HEAD's backward timed against all three, 4K-16K, and f2owner with the sides swapped
#       (about 2 minutes)
#   bash results/tuning/h200-2026-11-28-fused-reduce/run_gpu.sh alt     # f2alt (f2owner with the owner
#       alternating between the warpgroups step by step) checked, then timed against HEAD both ways (about 3 minutes)
#   bash results/tuning/h200-2026-11-28-fused-reduce/run_gpu.sh masks   # the same bound as ab_noreduce.json for
#       masked calls with dropout, which take the fused backward: HEAD against no reduce-add, 16K (about 3 minutes)
# POWER=--power (ab_kernels.py's sustained clock, power and energy per call, A, B, B, A) is worth adding to the
# A/Bs: its sustained time per call read an A/A within 0.4% where do_bench's medians read 1.6-3%
# (../h200-2026-11-28-power/). The runs recorded here were taken without it.
set -uo pipefail
POWER=(${POWER:-})
OUT=${OUT:-/tmp/fused-reduce}
mkdir -p "$OUT"
here=$PWD/results/tuning/h200-2026-11-28-fused-reduce
copy() {  # NAME: a copy of the tree's kernel package with NAME.diff applied, in .ab/NAME. The GPU machine has
  # neither git nor patch: build the copies here (`run_gpu.sh copies`) and carry .ab/ with the call.
  if [ -f ".ab/$1/applied" ]; then return 0; fi
  rm -rf ".ab/$1" && mkdir -p ".ab/$1" && cp -r flashgpt kernels scripts model pyproject.toml ".ab/$1/" \
    && git apply --directory=".ab/$1" "$here/$1.diff" && touch ".ab/$1/applied" \
    || { echo "cannot build .ab/$1 from $1.diff" >&2; return 1; }
}
# A new handshake between warpgroups may hang rather than fail: each step has a time limit.
case "${1:?copies | pair | masks}" in
  copies) for t in f2late f2split f2owner f2alt noreduce; do copy $t || exit 1; done ;;
  pair)
    copy f2late && copy f2split && copy f2owner || exit 1
    # The copies' table sends every dense D = 64 call without dropout to the two-warpgroup fused backward.
    for t in f2split f2owner; do
      PYTHONPATH=$PWD/.ab/$t:$PWD/.ab/$t/scripts timeout 120 python "$here/check_paired.py" 2>&1 \
        | grep -v -i warn > "$OUT/check_$t.log"
      echo "check $t: rc ${PIPESTATUS[0]}"; tail -3 "$OUT/check_$t.log"
    done
    ab=(--passes bwd,fwd_bwd --head-dims 64 --seq-lens 4096,8192,16384 --dropout 0 --rounds 3 "${POWER[@]}")
    for t in f2split f2owner f2late; do
      PYTHONPATH=$PWD:$PWD/scripts timeout 120 python scripts/ab_kernels.py --baseline ".ab/$t/kernels" "${ab[@]}" \
        --out "$OUT/ab_head_vs_$t.json" 2>&1 | grep -v -i warn | tail -7
    done
    # ab_kernels.py read 4% in favour of its baseline side at 4K in an A/A: f2owner once more as the tree.
    PYTHONPATH=$PWD/.ab/f2owner:$PWD/.ab/f2owner/scripts timeout 120 python .ab/f2owner/scripts/ab_kernels.py \
      --baseline "$PWD/kernels" "${ab[@]}" --out "$OUT/ab_f2owner_vs_head.json" 2>&1 | grep -v -i warn | tail -7
    ;;
  alt)
    copy f2alt || exit 1
    PYTHONPATH=$PWD/.ab/f2alt:$PWD/.ab/f2alt/scripts timeout 120 python "$here/check_paired.py" 2>&1 \
      | grep -v -i warn > "$OUT/check_f2alt.log"
    echo "check f2alt: rc ${PIPESTATUS[0]}"; tail -3 "$OUT/check_f2alt.log"
    ab=(--passes bwd,fwd_bwd --head-dims 64 --seq-lens 4096,8192,16384 --dropout 0 --rounds 3 "${POWER[@]}")
    PYTHONPATH=$PWD:$PWD/scripts timeout 120 python scripts/ab_kernels.py --baseline .ab/f2alt/kernels "${ab[@]}" \
      --out "$OUT/ab_head_vs_f2alt.json" 2>&1 | grep -v -i warn | tail -7
    PYTHONPATH=$PWD/.ab/f2alt:$PWD/.ab/f2alt/scripts timeout 120 python .ab/f2alt/scripts/ab_kernels.py \
      --baseline "$PWD/kernels" "${ab[@]}" --out "$OUT/ab_f2alt_vs_head.json" 2>&1 | grep -v -i warn | tail -7
    ;;
  masks)
    copy noreduce || exit 1
    PYTHONPATH=$PWD:$PWD/scripts timeout 170 python scripts/ab_kernels.py --baseline .ab/noreduce/kernels \
      --passes bwd --head-dims 64 --seq-lens 16384 --dropout 0.1 --masks documents,window_1k,strided --rounds 3 \
      --out "$OUT/ab_head_vs_noreduce_masks.json" 2>&1 | grep -v -i warn | tail -5
    ;;
  *) echo "unknown part $1" >&2; exit 2 ;;
esac
