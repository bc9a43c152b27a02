#!/usr/bin/env bash
# Block masks at 16K without dropout: the split backward's Gluon passes instead of the fused backward with a dQ
# warpgroup (launch.gluon_config's split_up_to 8192 -> 16384 under a block mask). bench_mask_walks.py put the
# block masks' backward at 0.84-0.89 of its walk ceiling at 16K, documents' at 1.00.
#   mkdir -p .ab/baseline && git archive HEAD kernels | tar -x -C .ab/baseline
#   run carry=[".ab"]: bash results/tuning/h200-2026-11-29-block-split-16k/run_gpu.sh
set -uo pipefail
OUT=${OUT:-/tmp/block-split}
export PYTHONPATH=$PWD:$PWD/scripts
quiet() { grep -v -i "warn\|create_block_mask"; }
timeout 300 python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes bwd,fwd_bwd --head-dims 64 \
  --seq-lens 16384 --masks local_global,strided,butterfly --rounds 5 --out "$OUT/ab_block_split_16k.json" 2>&1 | quiet
