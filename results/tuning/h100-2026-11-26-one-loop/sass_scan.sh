# Registers, spills (stack bytes) and ptxas warnings of every pass at its tuned H100 configuration, sm_90a, compiled
# on a CPU machine: bash results/tuning/h100-2026-11-26-one-loop/sass_scan.sh > sass_scan.txt
# Cell: pass:r<registers>/s<stack bytes: spills>/w<ptxas warnings>.
cd "$(dirname "$0")/../../.."  # the repository root
for d in 64 128; do for t in 1024 4096 16384; do for p in 0 0.1; do for m in none window documents blocks; do
  out=$(PYTHONPATH=. python scripts/kernel_sass.py --head-dim $d --seq-len $t --dropout $p --mask $m \
    --passes fwd,bwd_dq,bwd_dkdv,bwd_fused 2>&1 | tail -4 | awk '{printf "%s:r%s/s%s/w%s ", $1, $2, $3, $18}')
  echo "D$d T$t p$p $m  $out"
done; done; done; done
