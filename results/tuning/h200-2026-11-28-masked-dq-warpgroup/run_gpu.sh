#!/usr/bin/env bash
# Ran 2026-11-28 (README.md, out/). The fused backward's dQ warpgroup for the masked calls that did not have it
# (issue 16), built as diffs against the tree of 2026-11-28 (after the dQ warpgroup under windows and documents),
# compiled here for sm_90a
# (`scripts/kernel_sass.py --passes bwd_fused_hopper --head-dim 64 --seq-len 16384 --mask M [--dropout 0.1]`):
#   blocks_dq_warpgroup.diff: under block masks without dropout, 64 x 128 tiles past 4K (208 / 72 registers,
#       no spill); the dQ warpgroup walks the kept-tile list as the math warpgroups do (`kept_query_runs`).
#   masked_dropout_dq_warpgroup.diff: that, and masked calls with dropout from 4K on 32 x 128 tiles, dQ transposed
#       (window and documents no spill; block masks 16 bytes); on 64 x 128 they spilled 16-112 bytes at 208
#       registers, and 500+ at 216 / 56.
# Run from the repository root; results under $OUT; the GPU machine has no git, so `copies` builds the variants
# here and the calls carry them (carry [".ab"]).
#   bash results/tuning/h200-2026-11-28-masked-dq-warpgroup/run_gpu.sh copies
#   bash .../run_gpu.sh check      # check_masks.py and bench_masks.py --check-only through the second variant (it
#       holds the first), then the tree's bench_attention.py --check-only (~7 min)
#   bash .../run_gpu.sh blocks     # A/B, block masks without dropout, both orientations (~5 min)
#   bash .../run_gpu.sh dropout a  # A/B, every mask with dropout 0.1, the variant as A (~5 min); `dropout b`: as B
#   bash .../run_gpu.sh probe      # the 1K dropout intermittent: 8 processes of short_dropout_host_probe.py (~2 min)
#   bash .../run_gpu.sh masks      # the tree's masks against FlexAttention at 4K, 16K (checked) and 64K, for the
#       README (~6 min; after a variant is kept, in the tree)
set -uo pipefail
OUT=${OUT:-/tmp/masked-dq-warpgroup}
mkdir -p "$OUT"
here=$PWD/results/tuning/h200-2026-11-28-masked-dq-warpgroup
quiet() { grep -v -i warn; }
variant() {  # name, diff: the tree with the diff applied, in .ab/name
  rm -rf ".ab/$1" && mkdir -p ".ab/$1" && cp -r flashgpt kernels scripts model pyproject.toml ".ab/$1/" \
    && git apply --directory=".ab/$1" "$here/$2"
}
ab() {  # variant, orientation (a: the variant as A), masks, dropout, out
  if [ "$2" = a ]; then
    PYTHONPATH=$PWD:$PWD/scripts timeout 330 python scripts/ab_kernels.py --baseline ".ab/$1/kernels" \
      --passes bwd,fwd_bwd --head-dims 64 --seq-lens 4096,16384,65536 --dropout "$4" --masks "$3" --rounds 3 \
      --power --out "$OUT/$5" 2>&1 | quiet | tail -19
  else
    PYTHONPATH=$PWD/.ab/$1:$PWD/.ab/$1/scripts timeout 330 python ".ab/$1/scripts/ab_kernels.py" \
      --baseline "$PWD/kernels" --passes bwd,fwd_bwd --head-dims 64 --seq-lens 4096,16384,65536 --dropout "$4" \
      --masks "$3" --rounds 3 --power --out "$OUT/$5" 2>&1 | quiet | tail -19
  fi
}
case "${1:?copies | check | blocks | dropout a|b | probe | masks}" in
  copies)
    rm -rf .ab && variant blocks blocks_dq_warpgroup.diff && variant maskdrop masked_dropout_dq_warpgroup.diff ;;
  check)
    PYTHONPATH=$PWD/.ab/maskdrop timeout 200 python results/tuning/h200-2026-11-27-gluon-blocks/check_masks.py \
      --out "$OUT/check_masks.json" 2>&1 | quiet | tail -6
    echo "check_masks: rc ${PIPESTATUS[0]}"
    PYTHONPATH=$PWD/.ab/maskdrop timeout 300 python .ab/maskdrop/scripts/bench_masks.py --check-only \
      --out "$OUT/check_bench_masks.json" 2>&1 | quiet | grep -v "^check .*: ok" | tail -6
    echo "bench_masks --check-only (4K, 16K; dropout at 1K): rc ${PIPESTATUS[0]}"
    PYTHONPATH=$PWD timeout 240 python scripts/bench_attention.py --check-only --out "$OUT/check_attention.json" 2>&1 \
      | quiet | grep -v "^check .*: ok" | tail -5
    echo "bench_attention --check-only (the tree; its ragged 4K dropout case is new): rc ${PIPESTATUS[0]}" ;;
  blocks)
    ab blocks a local_global,strided,butterfly 0 ab_blocks_as_a.json
    ab blocks b local_global,strided,butterfly 0 ab_blocks_as_b.json ;;
  dropout)
    ab maskdrop "${2:?a or b}" window_1k,window_4k,documents,local_global,strided,butterfly 0.1 \
      "ab_maskdrop_as_$2.json" ;;
  probe)
    for i in 1 2 3 4 5 6 7 8; do
      PYTHONPATH=$PWD timeout 60 python "$here/short_dropout_host_probe.py" --out "$OUT/probe_$i.json" 2>&1 \
        | quiet | tail -1
    done ;;
  masks)
    PYTHONPATH=$PWD timeout 330 python scripts/bench_masks.py --seq-lens 4096,16384 --out "$OUT/bench_masks.json" \
      2>&1 | quiet | tail -30
    PYTHONPATH=$PWD timeout 240 python scripts/bench_masks.py --seq-lens 65536 --no-check \
      --out "$OUT/bench_masks_64k.json" 2>&1 | quiet | tail -20 ;;
  *) echo "unknown part $1" >&2; exit 2 ;;
esac
