#!/usr/bin/env bash
# The next steps of this folder, each one device call, from the repository root; results under $OUT. Copies of
# kernels/ (with this folder's diffs applied) go to .ab/.
#   bash results/tuning/h200-2026-11-28-fused-reduce/run_gpu.sh pair    # the two-warpgroup fused backward at
#       D = 64 (f2late: each warpgroup sends its own dQ; f2split: the pair sums dQ, each sends one half of D;
#       f2owner: the first warpgroup computes and sends the whole sum): the summing ones checked against the
#       reference, then HEAD's backward timed against all three, 4K-16K (under 9 minutes)
#   bash results/tuning/h200-2026-11-28-fused-reduce/run_gpu.sh masks   # the same bound as ab_noreduce.json for
#       masked calls with dropout, which take the fused backward: HEAD against no reduce-add, 16K (about 3 minutes)
set -uo pipefail
OUT=${OUT:-/tmp/fused-reduce}
mkdir -p "$OUT"
here=$PWD/results/tuning/h200-2026-11-28-fused-reduce
copy() {  # NAME: a copy of the tree's kernel package with NAME.diff applied, in .ab/NAME
  rm -rf ".ab/$1" && mkdir -p ".ab/$1" && cp -r flashgpt kernels scripts model pyproject.toml ".ab/$1/"
  (cd ".ab/$1" && { git apply "$here/$1.diff" 2> /dev/null || patch -s -p1 < "$here/$1.diff"; })
}
# A new handshake between warpgroups may hang rather than fail: each step has a time limit.
case "${1:?pair | masks}" in
  pair)
    copy f2late && copy f2split && copy f2owner || exit 1
    # The copies' table sends every dense D = 64 call without dropout to the two-warpgroup fused backward.
    for t in f2split f2owner; do
      PYTHONPATH=$PWD/.ab/$t:$PWD/.ab/$t/scripts timeout 120 python "$here/check_paired.py" 2>&1 \
        | grep -v -i warn > "$OUT/check_$t.log"
      echo "check $t: rc ${PIPESTATUS[0]}"; tail -3 "$OUT/check_$t.log"
    done
    for t in f2split f2owner f2late; do
      PYTHONPATH=$PWD:$PWD/scripts timeout 100 python scripts/ab_kernels.py --baseline ".ab/$t/kernels" \
        --passes bwd,fwd_bwd --head-dims 64 --seq-lens 4096,8192,16384 --dropout 0 --rounds 2 \
        --out "$OUT/ab_head_vs_$t.json" 2>&1 | grep -v -i warn | tail -7
    done
    ;;
  masks)
    copy noreduce || exit 1
    PYTHONPATH=$PWD:$PWD/scripts timeout 170 python scripts/ab_kernels.py --baseline .ab/noreduce/kernels \
      --passes bwd --head-dims 64 --seq-lens 16384 --dropout 0.1 --masks documents,window_1k,strided --rounds 3 \
      --out "$OUT/ab_head_vs_noreduce_masks.json" 2>&1 | grep -v -i warn | tail -5
    ;;
  *) echo "unknown part $1" >&2; exit 2 ;;
esac
