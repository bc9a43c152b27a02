#!/usr/bin/env bash
# This folder's device calls, from the repository root; results under $OUT. The tree has the dQ warpgroup at
# D = 128, with dropout at D = 64 and under a window or documents (the three diffs of ../h200-2026-11-28-paired-dq/,
# each measured there against the tree before it, with the variant as A). The baseline here is that tree before
# them (1729b25), built here (the GPU machine has no git) and carried with the call (carry [".ab"]).
#   bash results/tuning/h200-2026-11-28-dq-warpgroup-all/run_gpu.sh copies
#   bash results/tuning/h200-2026-11-28-dq-warpgroup-all/run_gpu.sh check   # the dQ warpgroup's own checks (D = 64,
#       D = 128, dropout), the Gluon mask check, bench_attention.py's GPU check (about 5 minutes)
#   bash results/tuning/h200-2026-11-28-dq-warpgroup-all/run_gpu.sh ab      # the A/Bs with the tree as B: dropout at
#       D = 64, then a window and documents at 4K, 16K and 64K (about 5 minutes)
#   bash results/tuning/h200-2026-11-28-dq-warpgroup-all/run_gpu.sh bench   # flash against cuDNN and FA2, the
#       README's tables (about 4 minutes)
set -uo pipefail
OUT=${OUT:-/tmp/dq-warpgroup-all}
mkdir -p "$OUT"
prev=$PWD/results/tuning/h200-2026-11-28-paired-dq
base=1729b25
quiet() { grep -v -i warn; }
case "${1:?copies | check | ab | bench}" in
  copies)
    rm -rf .ab && mkdir -p .ab/head && git archive "$base" flashgpt kernels scripts model pyproject.toml | tar -x -C .ab/head ;;
  check)
    fail=0
    for args in "" "--head-dim 128" "--dropout 0.125"; do
      name=$(echo "check_paired_dq $args" | tr -d '-' | tr ' .' '__')
      PYTHONPATH=$PWD timeout 150 python "$prev/check_paired_dq.py" $args --out "$OUT/$name.json" 2>&1 | quiet | tail -3
      rc=${PIPESTATUS[0]}; echo "check_paired_dq $args: rc $rc"; [ "$rc" = 0 ] || fail=1
    done
    PYTHONPATH=$PWD timeout 200 python results/tuning/h200-2026-11-27-gluon-blocks/check_masks.py \
      --out "$OUT/check_masks.json" 2>&1 | quiet | grep -v "^ok" | tail -4
    rc=${PIPESTATUS[0]}; echo "check_masks: rc $rc"; [ "$rc" = 0 ] || fail=1
    PYTHONPATH=$PWD timeout 240 python scripts/bench_attention.py --check-only --out "$OUT/check_all.json" 2>&1 \
      | quiet | grep -v "^check .*: ok" | tail -5
    rc=${PIPESTATUS[0]}; echo "bench_attention --check-only: rc $rc"; [ "$rc" = 0 ] || fail=1
    exit $fail ;;
  ab)
    [ -d .ab/head/kernels ] || { echo "no .ab/head: run 'copies' here and carry .ab" >&2; exit 1; }
    PYTHONPATH=$PWD:$PWD/scripts timeout 200 python scripts/ab_kernels.py --baseline .ab/head/kernels \
      --passes bwd,fwd_bwd --head-dims 64 --seq-lens 4096,8192,16384 --dropout 0.1 --rounds 3 --power \
      --out "$OUT/ab_head_vs_dropout.json" 2>&1 | quiet | tail -7
    PYTHONPATH=$PWD:$PWD/scripts timeout 300 python scripts/ab_kernels.py --baseline .ab/head/kernels \
      --passes bwd,fwd_bwd --head-dims 64 --seq-lens 4096,16384,65536 --dropout 0 --masks window_1k,window_4k,documents \
      --rounds 3 --power --out "$OUT/ab_head_vs_masked.json" 2>&1 | quiet | tail -19 ;;
  bench)
    PYTHONPATH=$PWD timeout 560 python scripts/bench_attention.py --no-check --provider flash,sdpa_cudnn,sdpa_flash \
      --head-dims 64,128 --dropout 0,0.1 --out "$OUT/bench_all.json" 2>&1 | quiet | tail -40 ;;
  *) echo "unknown part $1" >&2; exit 2 ;;
esac
