#!/usr/bin/env bash
# The window + dropout case at HEAD and at a65503f (shipped in .ab/old: git archive a65503f flashgpt kernels scripts
# pyproject.toml | tar -x -C .ab/old), each in its own process; JSON lines to $OUT/profiles.jsonl.
set -uo pipefail
OUT=${OUT:-/tmp/window-dropout}
mkdir -p "$OUT"
here=results/tuning/h200-2026-11-28-window-dropout
for case in "window_1k 0.1 16384" "window_1k 0.0 16384" "window_4k 0.1 16384" "documents 0.1 16384"; do
  set -- $case
  for tree in head old; do
    root=$PWD; [ $tree = old ] && root=$PWD/.ab/old
    PYTHONPATH=$root:$root/scripts python $here/profile_case.py --mask $1 --dropout $2 --seq-len $3 --label $tree \
      2>/dev/null | tail -1 | tee -a "$OUT/profiles.jsonl"
  done
done
