"""The 1K backward with dropout that sometimes runs slow (../h200-2026-11-28-dq-warpgroup-all/README.md): in one
process, the fwd+bwd time as `scripts/bench_attention.py` takes it (do_bench median of fn(...).backward(grad_out),
warmup 25, rep 100), the host time of one such call (perf_counter around it, the GPU left running), and the device
time of its kernels (torch.profiler). A slow process whose kernels take what a fast one's do, and whose host time
per call is as long as its fwd+bwd, waits on the host; one whose kernels take longer does not.

    for i in 1 2 3 4 5 6 7 8; do
        PYTHONPATH=$PWD python results/tuning/h200-2026-11-28-masked-dq-warpgroup/short_dropout_host_probe.py \
            --out probe_$i.json
    done
"""

import argparse
import json
import statistics
import time

import torch
import triton.testing
from torch.profiler import ProfilerActivity, profile

from flashgpt.kernels import flash_attention

SHAPE = (16, 12, 1024, 64)  # bench_attention's 1K row at D = 64: 16K tokens a call, 12 heads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    q, k, v = (torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad_out = torch.randn_like(q)

    def step() -> None:
        flash_attention(q, k, v, causal=True, dropout_p=args.dropout).backward(grad_out)

    step()
    fwd_ms = triton.testing.do_bench(
        lambda: flash_attention(q, k, v, causal=True, dropout_p=args.dropout), warmup=25, rep=100,
        grad_to_none=[q, k, v], return_mode="median",
    )  # fmt: skip
    fwd_bwd_ms = triton.testing.do_bench(step, warmup=25, rep=100, grad_to_none=[q, k, v], return_mode="median")
    host_ms = []
    for _ in range(50):
        for x in (q, k, v):
            x.grad = None
        start = time.perf_counter()
        step()
        host_ms.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            step()
        torch.cuda.synchronize()
    kernels = {
        e.key[:60]: round(e.device_time_total / 20 / 1000, 4)
        for e in prof.key_averages()
        if e.device_type.name == "CUDA" and e.count
    }
    row = {
        "dropout": args.dropout,
        "fwd_ms": round(fwd_ms, 4),
        "fwd_bwd_ms": round(fwd_bwd_ms, 4),
        "bwd_ms": round(fwd_bwd_ms - fwd_ms, 4),
        "host_ms_median": round(statistics.median(host_ms), 4),
        "host_ms_p90": round(sorted(host_ms)[int(0.9 * len(host_ms))], 4),
        "kernel_ms": kernels,
        "kernel_sum_ms": round(sum(kernels.values()), 4),
    }
    print(json.dumps(row))
    with open(args.out, "w") as f:
        json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
