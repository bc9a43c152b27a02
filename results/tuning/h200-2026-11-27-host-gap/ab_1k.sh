#!/usr/bin/env bash
# Alternating runs of scripts/bench_attention.py (flash and cuDNN, D = 64, dropout 0 and 0.1, T = 1K unless given),
# each tree in its own process: bash ab_1k.sh OLD_TREE NEW_TREE OUT_DIR [ROUNDS [SEQ_LENS]]. Prints each run's table
# rows; JSON in OUT_DIR.
set -euo pipefail
old=$(realpath "$1") new=$(realpath "$2") out=$(realpath "$3") rounds=${4:-3} seq_lens=${5:-1024}
mkdir -p "$out"
for i in $(seq 1 "$rounds"); do
    for side in old new; do
        tree=$old
        [ "$side" = new ] && tree=$new
        (cd "$tree" && PYTHONPATH="$tree" python scripts/bench_attention.py --provider flash,sdpa_cudnn --head-dims 64 \
            --seq-lens "$seq_lens" --dropout 0,0.1 --no-check --host-calls 0 --out "$out/${side}_$i.json") 2>/dev/null |
            grep -E "^\| (flash|sdpa)" | sed "s/^/$side $i: /"
    done
done
