#!/usr/bin/env bash
# Is the kernels' sm_90a machine code unchanged by a refactor? Compiles every Triton and Gluon pass for the cases below
# (D, mask, dropout; T = 16K) at REV into a dump, then the working tree against it (scripts/kernel_sass.py; no GPU).
#   bash results/tuning/sass-2026-11-28-grouped-arguments/same_code.sh REV
set -euo pipefail
rev=${1:?a revision to compare the working tree with}
root=$(git rev-parse --show-toplevel)
base=$(mktemp -d)
git -C "$root" worktree add -q "$base/tree" "$rev"
trap 'git -C "$root" worktree remove --force "$base/tree"; rm -rf "$base"' EXIT
cases=("64 none 0" "64 none 0.1" "128 none 0" "128 none 0.1" "64 window 0" "64 window 0.1" "64 documents 0"
       "64 documents 0.1" "64 blocks 0" "64 blocks 0.1" "128 window 0" "128 documents 0" "128 documents 0.1"
       "128 blocks 0" "128 blocks 0.1")
passes=(fwd bwd_dq bwd_dkdv bwd_fused fwd_hopper bwd_dq_hopper bwd_dkdv_hopper bwd_fused_hopper)
for c in "${cases[@]}"; do
  read -r d mask dropout <<< "$c"
  for p in "${passes[@]}"; do
    dump="$base/d$d-$mask-$dropout"
    args=(--head-dim "$d" --seq-len 16384 --mask "$mask" --dropout "$dropout" --passes "$p")
    out=$(cd "$base/tree" && PYTHONPATH=. python scripts/kernel_sass.py "${args[@]}" --dump "$dump" 2>&1 | tail -1 || true)
    [[ $out == *"no $p pass"* ]] && continue  # the table lists no such pass for the case
    same=$(cd "$root" && PYTHONPATH=. python scripts/kernel_sass.py "${args[@]}" --same-as "$dump" 2>&1 | tail -1 || true)
    echo "D=$d $mask dropout=$dropout $p: $same"
  done
done
