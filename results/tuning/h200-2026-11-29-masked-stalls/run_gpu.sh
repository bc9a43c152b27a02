#!/usr/bin/env bash
# The device calls of 2026-11-29's first session (README.md beside this script says what they found), with
# D=results/tuning/h200-2026-11-29-masked-stalls:
#   bash $D/run_gpu.sh check    # issue 15's last criterion: bench_attention's GPU check, which repeats
#                               # deterministic=True calls (bit-identical dq, dk, dv) (~4 min)
#   bash $D/run_gpu.sh stalls   # issue 16: Nsight Compute with source counters and warp-state sampling on one
#                               # fwd+bwd, dense and documents, T = 16K (~30 s): what a masked call pays that a
#                               # dense one does not
#   bash $D/run_gpu.sh masks    # the mask tables at 16K and 64K (~4 min, plus FlexAttention's first compile at
#                               # each length; the session ran them flash-only and 16K with every provider instead)
# Run from the repository root; results under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/masked-stalls}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:$PWD/scripts
quiet() { grep -v -i warn | grep -v create_block_mask; }
case "${1:?check | stalls | masks}" in
  check)
    timeout 400 python scripts/bench_attention.py --check-only --out "$OUT/check.json" 2>&1 | quiet \
      | grep -v "^check .*: ok" | tail -8
    echo "bench_attention --check-only: rc ${PIPESTATUS[0]}"
    grep -c '"repeat_equal": true' "$OUT/check.json" ;;
  stalls)
    timeout 450 ncu --clock-control none --profile-from-start off --import-source yes \
      --section SpeedOfLight --section WarpStateStats --section SourceCounters --section Occupancy \
      -o "$OUT/stalls16k" python results/tuning/h200-2026-11-27-ncu-masks/ncu_masks.py --seq-len 16384 \
      --masks dense,documents > "$OUT/ncu.log" 2>&1
    echo "ncu: rc $?"
    tail -3 "$OUT/ncu.log"
    ncu --import "$OUT/stalls16k.ncu-rep" --page details --csv > "$OUT/stalls16k_details.csv"
    ncu --import "$OUT/stalls16k.ncu-rep" --page source --csv --print-source sass > "$OUT/stalls16k_sass.csv" 2>&1
    ls -la "$OUT" ;;
  masks)
    for t in 16384 65536; do
      timeout 280 python scripts/bench_masks.py --seq-lens $t --no-check --out "$OUT/bench_masks_$t.json" 2>&1 \
        | quiet | tail -10
    done ;;
  *) echo "unknown part $1" >&2; exit 2 ;;
esac
