#!/usr/bin/env bash
# Ran 2026-11-29 on one H200 (README.md). What the per-element mask tests cost the masked Gluon passes (timing
# only: the ablated kernels compute something else). .ab/baseline holds HEAD's kernels; .ab/ablate_none
# (ablate_none.diff) drops every per-element test of the masked steps (the forward's `_softmax` and the backward's
# `hide_unseen`), .ab/ablate_causal (ablate_causal.diff) keeps only the causal one (no window or document test, no
# query-id gathers). Each is copied over kernels/ in turn and timed against the baseline.
set -uo pipefail
OUT=${OUT:-/tmp/mask-ablation}
export PYTHONPATH=$PWD:$PWD/scripts
quiet() { grep -v -i warn | grep -v create_block_mask; }
for v in none causal; do
  cp .ab/ablate_$v/kernels/*.py kernels/
  timeout 280 python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes fwd,bwd --head-dims 64 \
    --seq-lens 16384,65536 --dropout 0 --masks documents,window_1k,strided --rounds 2 \
    --out "$OUT/ab_ablate_$v.json" 2>&1 | quiet | tail -13
done
