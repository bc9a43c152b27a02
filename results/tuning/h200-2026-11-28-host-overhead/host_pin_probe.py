"""Whether pinning the process steadies the host time of bench_attention's 1K fwd+bwd with dropout (D = 64, B = 16,
H = 12, causal, bf16), which varies 2.6x between processes (../h200-2026-11-28-masked-dq-warpgroup/README.md): with
--cores, the process and every thread it starts later (autograd's device thread) run only on those cores. One JSON
line: the fwd+bwd as bench_attention times it (do_bench median), the host time a call of the fwd+bwd, of the forward
with grad, and of the backward alone (its forward run and synchronised before), each the median of 200.

    for cores in "" 2 2,3; do for i in 1 2 3 4; do
        PYTHONPATH=$PWD python results/tuning/h200-2026-11-28-host-overhead/host_pin_probe.py --cores "$cores"
    done; done
"""

import argparse
import json
import os
import statistics
import time

import torch
import triton.testing

from flashgpt.kernels import flash_attention

SHAPE = (16, 12, 1024, 64)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cores", default="", help="comma-separated CPU ids to pin to; empty: no pinning")
    parser.add_argument("--dropout", type=float, default=0.1)
    args = parser.parse_args()
    if args.cores:
        os.sched_setaffinity(0, {int(c) for c in args.cores.split(",")})
    q, k, v = (torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad_out = torch.randn_like(q)

    def forward() -> torch.Tensor:
        return flash_attention(q, k, v, causal=True, dropout_p=args.dropout)

    def step() -> None:
        forward().backward(grad_out)

    step()
    fwd_bwd_ms = triton.testing.do_bench(step, warmup=25, rep=100, grad_to_none=[q, k, v], return_mode="median")
    host = {"fwd_bwd": [], "fwd": [], "bwd": []}
    for _ in range(200):
        for x in (q, k, v):
            x.grad = None
        start = time.perf_counter()
        step()
        host["fwd_bwd"].append(time.perf_counter() - start)
        torch.cuda.synchronize()
        start = time.perf_counter()
        o = forward()
        host["fwd"].append(time.perf_counter() - start)
        torch.cuda.synchronize()
        for x in (q, k, v):
            x.grad = None
        start = time.perf_counter()
        o.backward(grad_out)
        host["bwd"].append(time.perf_counter() - start)
        torch.cuda.synchronize()
    row = {
        "cores": args.cores or "all",
        "fwd_bwd_ms": round(fwd_bwd_ms, 4),
        **{f"host_{name}_ms": round(statistics.median(times) * 1e3, 4) for name, times in host.items()},
    }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
