"""How the dK/dV pass's GPU time under local + global at 16K spreads over calls and processes, for each walk order
of `ab_long_walks.py`: per-call kernel times from torch.profiler, variants alternating in blocks of calls.

    PYTHONPATH=.:scripts python results/tuning/h200-2026-11-27-long-walks/spread.py --out spread.json
"""

import argparse
import json
import statistics
import sys

import torch
from ab_long_walks import VARIANTS, tiles
from bench_masks import HEADS, TOKENS_PER_CALL, build_case, flash_fn

from flashgpt.kernels import tile_schedule


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--mask", default="local_global")
    args = parser.parse_args()
    batch = max(1, TOKENS_PER_CALL // args.seq_len)
    case = build_case(args.mask, args.seq_len, batch, tiles.PROFILE)
    shape = (batch, HEADS, args.seq_len, 64)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in "qkv")
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    fns = {}
    for name, rule in VARIANTS.items():
        tile_schedule._long_walks_first = rule
        fns[name] = flash_fn(case, 0.0, args.seq_len, torch.bfloat16)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(3):
        for name, fn in fns.items():
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fn(q, k, v).backward(grad)
                torch.cuda.synchronize()
            times[name] += [e.device_time_total / 1e3 for e in prof.events() if e.name.startswith("flash_bwd_dkdv")]
    for name, ms in times.items():
        print(f"{args.mask} T={args.seq_len} {name:>12}: dK/dV min {min(ms):.3f} median {statistics.median(ms):.3f} "
              f"max {max(ms):.3f} ms over {len(ms)} calls", flush=True)  # fmt: skip
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "mask": args.mask, "seq_len": args.seq_len,
                   "dkdv_ms": times}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
