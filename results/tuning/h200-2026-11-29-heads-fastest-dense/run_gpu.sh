#!/usr/bin/env bash
# Ran 2026-11-29 on one H200 (README.md: not kept). Dense causal calls launching their Gluon passes' grids
# heads-fastest (every head's longest walks first), as documents already do. .ab/baseline: HEAD's kernels;
# .ab/fwd_only (fwd_only.diff): the forward alone; .ab/all_passes (all_passes.diff): the forward, dQ, dK/dV and
# fused backward passes.
set -uo pipefail
OUT=${OUT:-/tmp/heads-fastest-dense}
export PYTHONPATH=$PWD:$PWD/scripts
quiet() { grep -v -i warn; }
cp .ab/fwd_only/kernels/*.py kernels/
timeout 250 python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes fwd --head-dims 64,128 \
  --seq-lens 4096,8192,16384,65536 --dropout 0,0.1 --rounds 3 --out "$OUT/ab_fwd_only.json" 2>&1 | quiet | tail -17
cp .ab/all_passes/kernels/*.py kernels/
timeout 300 python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes bwd --head-dims 64,128 \
  --seq-lens 4096,8192,16384,65536 --dropout 0,0.1 --rounds 3 --out "$OUT/ab_all_passes.json" 2>&1 | quiet | tail -17
