"""One fused backward pass (dK/dV with dQ's reduce-add) for Nsight Compute: D = 64, causal, bf16, 16K tokens a call.

    ncu --clock-control none --kernel-name regex:dkdv --launch-skip 2 --launch-count 1 --section SourceCounters \
        --section WarpStateStats --section Occupancy --section LaunchStats --section SpeedOfLight \
        -o fused python results/tuning/h100-2026-11-26-fused-overlap/ncu_fused.py 16384 0
    ncu --import fused.ncu-rep --page source --csv --print-source sass | gzip > fused_src.csv.gz
"""

import math
import sys

import torch

from flashgpt.kernels.launch import AttentionParams, launch_dkdv, launch_forward, launch_preprocess, tuned_config

T, p = int(sys.argv[1]), float(sys.argv[2])
B, H, D = max(1, 16384 // T), 12, 64
q, k, v, do = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
params = AttentionParams(True, p, 1 / math.sqrt(D), seed=1, offset=0)
o, dk, dv = (torch.empty_like(q) for _ in range(3))
lse = torch.empty(B, H, T, device="cuda", dtype=torch.float32)
delta = torch.empty_like(lse)
dq_acc = torch.zeros(q.shape, device="cuda", dtype=torch.float32)
launch_forward(q, k, v, o, lse, params, tuned_config("fwd", q, params))
launch_preprocess(o, do, delta)
for _ in range(3):
    cfg = tuned_config("bwd_fused", q, params)
    launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, cfg, dq_acc=dq_acc, dq_reduce="tma")
torch.cuda.synchronize()
