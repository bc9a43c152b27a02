cd "$(dirname "$0")/../../.."  # the repository root
for d in 64 128; do for t in 1024 4096 16384; do for p in 0 0.1; do for m in none window documents blocks; do
  out=$(PYTHONPATH=. python scripts/kernel_sass.py --head-dim $d --seq-len $t --dropout $p --mask $m --passes fwd,bwd_dq,bwd_dkdv,bwd_fused 2>&1 | tail -4 | awk '{printf "%s:r%s/l%s/w%s ", $1, $2, $3, $17}')
  echo "D$d T$t p$p $m  $out"
done; done; done; done
