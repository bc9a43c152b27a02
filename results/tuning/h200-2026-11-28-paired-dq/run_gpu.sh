#!/usr/bin/env bash
# This folder's device calls, from the repository root; results under $OUT. The baseline is a copy of the
# kernels before the dQ warpgroup (94dadb2: the split backward at every dense D = 64 shape without dropout), built
# here (the GPU machine has no git) and carried with the call (carry [".ab"]). For the first variant (f2alt), apply
# f2alt_integrated.diff to 94dadb2's tree first.
#   bash results/tuning/h200-2026-11-28-paired-dq/run_gpu.sh copies
#   bash results/tuning/h200-2026-11-28-paired-dq/run_gpu.sh check   # the paired path's own check, then
#       bench_attention.py's whole GPU check, then the A/B with the tree as A (about 5 minutes)
#   bash results/tuning/h200-2026-11-28-paired-dq/run_gpu.sh timing  # the A/B the other way round, then flash
#       against cuDNN at D = 64 (about 4 minutes)
#   bash results/tuning/h200-2026-11-28-paired-dq/run_gpu.sh d128    # not yet run: the dQ warpgroup at D = 128
#       (d128_dq_warpgroup.diff, built into .ab/d128 by `copies`) checked, then A/B against the tree both ways
#       (about 5 minutes)
#   bash results/tuning/h200-2026-11-28-paired-dq/run_gpu.sh dropout # not yet run: the dQ warpgroup with dropout
#       at D = 64 from 4K (dropout_dq_warpgroup.diff, .ab/dropout) checked against the split backward on the same
#       keep-mask, then A/B against the tree's one-warpgroup fused backward (about 3 minutes)
#   bash results/tuning/h200-2026-11-28-paired-dq/run_gpu.sh masks   # not yet run: the dQ warpgroup under a
#       window and documents without dropout (masked_dq_warpgroup.diff, .ab/masked) checked by the Gluon mask check,
#       then A/B against the tree's split passes at 16K and 64K (about 4 minutes)
set -uo pipefail
OUT=${OUT:-/tmp/paired-dq}
mkdir -p "$OUT"
here=$PWD/results/tuning/h200-2026-11-28-paired-dq
base=94dadb2
ab=(--passes bwd,fwd_bwd --head-dims 64 --seq-lens 4096,8192,16384 --dropout 0 --rounds 3 --power)
quiet() { grep -v -i warn; }
case "${1:?copies | check | timing | both | d128 | masks | dropout}" in
  copies)
    rm -rf .ab/split && mkdir -p .ab/split \
      && git archive "$base" flashgpt kernels scripts model pyproject.toml | tar -x -C .ab/split
    rm -rf .ab/d128 && mkdir -p .ab/d128 && cp -r flashgpt kernels scripts model pyproject.toml .ab/d128/ \
      && git apply --directory=.ab/d128 "$here/d128_dq_warpgroup.diff"
    rm -rf .ab/masked && mkdir -p .ab/masked && cp -r flashgpt kernels scripts model pyproject.toml .ab/masked/ \
      && git apply --directory=.ab/masked "$here/masked_dq_warpgroup.diff"
    rm -rf .ab/dropout && mkdir -p .ab/dropout && cp -r flashgpt kernels scripts model pyproject.toml .ab/dropout/ \
      && git apply --directory=.ab/dropout "$here/dropout_dq_warpgroup.diff" ;;
  dropout)
    [ -d .ab/dropout/kernels ] || { echo "no .ab/dropout: run 'copies' here and carry .ab" >&2; exit 1; }
    PYTHONPATH=$PWD/.ab/dropout timeout 150 python "$here/check_paired_dq.py" --dropout 0.125 \
      --out "$OUT/check_paired_dq_dropout.json" 2>&1 | quiet
    rc=${PIPESTATUS[0]}; echo "check_paired_dq with dropout: rc $rc"; [ "$rc" = 0 ] || exit 1
    PYTHONPATH=$PWD:$PWD/scripts timeout 200 python scripts/ab_kernels.py --baseline .ab/dropout/kernels \
      --passes bwd,fwd_bwd --head-dims 64 --seq-lens 4096,8192,16384 --dropout 0.1 --rounds 3 --power \
      --out "$OUT/ab_fused_vs_dropout_dqwg.json" 2>&1 | quiet | tail -7
    ;;
  masks)
    [ -d .ab/masked/kernels ] || { echo "no .ab/masked: run 'copies' here and carry .ab" >&2; exit 1; }
    PYTHONPATH=$PWD/.ab/masked timeout 200 python results/tuning/h200-2026-11-27-gluon-blocks/check_masks.py \
      --out "$OUT/check_masks_masked.json" 2>&1 | quiet | tail -4
    rc=${PIPESTATUS[0]}; echo "check_masks: rc $rc"; [ "$rc" = 0 ] || exit 1
    PYTHONPATH=$PWD:$PWD/scripts timeout 300 python scripts/ab_kernels.py --baseline .ab/masked/kernels \
      --passes bwd,fwd_bwd --head-dims 64 --seq-lens 16384,65536 --dropout 0 --masks window_1k,window_4k,documents \
      --rounds 3 --power --out "$OUT/ab_split_vs_masked.json" 2>&1 | quiet | tail -13
    ;;
  d128)
    [ -d .ab/d128/kernels ] || { echo "no .ab/d128: run 'copies' here and carry .ab" >&2; exit 1; }
    PYTHONPATH=$PWD/.ab/d128 timeout 150 python "$here/check_paired_dq.py" --head-dim 128 \
      --out "$OUT/check_paired_dq_d128.json" 2>&1 | quiet
    rc=${PIPESTATUS[0]}; echo "check_paired_dq D = 128: rc $rc"; [ "$rc" = 0 ] || exit 1
    ab128=(--passes bwd,fwd_bwd --head-dims 128 --seq-lens 4096,8192,16384 --dropout 0 --rounds 3 --power)
    PYTHONPATH=$PWD:$PWD/scripts timeout 200 python scripts/ab_kernels.py --baseline .ab/d128/kernels "${ab128[@]}" \
      --out "$OUT/ab_d128_vs_split.json" 2>&1 | quiet | tail -7
    PYTHONPATH=$PWD/.ab/d128:$PWD/.ab/d128/scripts timeout 200 python .ab/d128/scripts/ab_kernels.py \
      --baseline "$PWD/kernels" "${ab128[@]}" --out "$OUT/ab_split_vs_d128.json" 2>&1 | quiet | tail -7
    ;;
  check)
    [ -d .ab/split/kernels ] || { echo "no .ab/split: run 'copies' here and carry .ab" >&2; exit 1; }
    PYTHONPATH=$PWD timeout 120 python "$here/check_paired_dq.py" --out "$OUT/check_paired_dq.json" 2>&1 | quiet
    rc=${PIPESTATUS[0]}; echo "check_paired_dq: rc $rc"; [ "$rc" = 0 ] || exit 1
    PYTHONPATH=$PWD timeout 300 python scripts/bench_attention.py --check-only --out "$OUT/check_all.json" 2>&1 \
      | quiet | grep -v "^check .*: ok" | tail -5
    echo "bench_attention --check-only: rc ${PIPESTATUS[0]}"
    PYTHONPATH=$PWD:$PWD/scripts timeout 200 python scripts/ab_kernels.py --baseline .ab/split/kernels "${ab[@]}" \
      --out "$OUT/ab_split_vs_paired.json" 2>&1 | quiet | tail -9
    ;;
  both) bash "$0" check && bash "$0" timing ;;
  timing)
    [ -d .ab/split/kernels ] || { echo "no .ab/split: run 'copies' here and carry .ab" >&2; exit 1; }
    PYTHONPATH=$PWD/.ab/split:$PWD/.ab/split/scripts timeout 200 python .ab/split/scripts/ab_kernels.py \
      --baseline "$PWD/kernels" "${ab[@]}" --out "$OUT/ab_paired_vs_split.json" 2>&1 | quiet | tail -9
    PYTHONPATH=$PWD timeout 200 python scripts/bench_attention.py --no-check --provider flash,sdpa_cudnn \
      --head-dims 64 --dropout 0 --seq-lens 4096,8192,16384 --host-calls 0 --out "$OUT/bench_d64.json" 2>&1 \
      | quiet | tail -14
    ;;
  *) echo "unknown part $1" >&2; exit 2 ;;
esac
