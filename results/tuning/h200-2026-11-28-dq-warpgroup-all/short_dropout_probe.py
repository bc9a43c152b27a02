"""Why the D = 64 backward with dropout at 1K sometimes runs at 139 TFLOP/s instead of 237 (one process in three):
per process, the backward's wall time by do_bench, and the device time of its kernels by torch.profiler. Equal
kernel times with unequal wall times say the GPU waits for the host; unequal kernel times say a kernel changed.

    PYTHONPATH=$PWD python results/tuning/h200-2026-11-28-dq-warpgroup-all/short_dropout_probe.py --out probe.json
"""

import argparse
import json

import torch
import triton.testing
from torch.profiler import ProfilerActivity, profile

from flashgpt.kernels import flash_attention


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    q, k, v = (torch.randn(16, 12, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in "qkv")
    o = flash_attention(q, k, v, causal=True, dropout_p=0.1)
    g = torch.randn_like(o)

    def bwd() -> None:
        torch.autograd.grad(o, (q, k, v), g, retain_graph=True)

    ms = triton.testing.do_bench(bwd, warmup=50, rep=300)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            bwd()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.count:
            kernels[e.key[:60]] = round(e.device_time_total / 20 / 1000, 4)  # ms a backward
    row = {"bwd_ms": round(ms, 4), "kernel_ms": kernels, "kernel_sum_ms": round(sum(kernels.values()), 4)}
    print(json.dumps(row))
    with open(args.out, "w") as f:
        json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
