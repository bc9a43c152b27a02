"""One masked fwd+bwd of `scripts/bench_masks.py` (D = 64, H = 12, 16K tokens a call, bf16), timed as the benchmark
times it and profiled kernel by kernel, with whichever `flashgpt` the path gives: run it with the checkout's, then
with an older tree's, to see which kernels a call launches and what each costs.

    PYTHONPATH=.:scripts python results/tuning/h200-2026-11-28-window-dropout/profile_case.py --mask window_1k \
        --dropout 0.1 --seq-len 16384
"""

import argparse
import json

import bench_masks
import torch
import triton.testing
from bench_masks import HEADS, TOKENS_PER_CALL, Profile, build_case, flash_fn

import flashgpt

PROFILE = Profile("cuda", torch.bfloat16, block_size=128, check_seq_len=4096, dropout_check_seq_len=1024)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mask", default="window_1k")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    seq_len, batch = args.seq_len, max(1, TOKENS_PER_CALL // args.seq_len)
    case = build_case(args.mask, seq_len, batch, PROFILE)
    shape = (batch, HEADS, seq_len, bench_masks.HEAD_DIM)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_() for _ in range(3)
    )
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    fn = flash_fn(case, args.dropout, seq_len, torch.bfloat16)

    def fwd_bwd() -> None:
        fn(q, k, v).backward(grad)

    ms = triton.testing.do_bench(fwd_bwd, warmup=25, rep=100, grad_to_none=[q, k, v], return_mode="median")
    calls = 10
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fwd_bwd()
        torch.cuda.synchronize()
    kernels = {
        e.key: round(e.device_time_total / calls / 1e3, 4) for e in prof.key_averages() if e.device_time_total > 0
    }
    print(
        json.dumps(
            {
                "label": args.label,
                "flashgpt": flashgpt.__file__,
                "mask": args.mask,
                "dropout": args.dropout,
                "seq_len": seq_len,
                "fwd_bwd_ms": round(ms, 4),
                "kernels_ms": kernels,
            }
        )
    )


if __name__ == "__main__":
    main()
