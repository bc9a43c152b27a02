#!/usr/bin/env bash
# The fused rotary gradient on the GPU, in one device call (about 6 minutes), from the repository root, with the
# wheels of ../shared/tools/gpu-wheels.sh carried in .whl/: its check, then rope's own backward against autograd's
# (`autograd`) and an A/A control, in rounds that rotate their order. Results under $OUT.
#   bash results/tuning/h200-2026-11-28-rope-cost/run_gpu.sh
set -uo pipefail
OUT=${OUT:-/tmp/rope}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD:$PWD/scripts
python scripts/check_rotary.py 2>&1 | tee "$OUT/check_rotary.log" || exit 1
python results/tuning/h200-2026-11-28-rope-cost/rope_variants.py --variants learned,learned_again,rope,autograd \
  --rounds 6 --seq-lens 1024 --out "$OUT/rope_fused.json" 2>&1 | grep -v -i warn > "$OUT/rope_fused.log"
head -8 "$OUT/rope_fused.log"
