"""One fwd+bwd of our kernel per mask of `scripts/bench_masks.py` (dense causal first) between
cudaProfilerStart/Stop, for Nsight Compute: where the masked passes lose rate against the dense ones.

    ncu --clock-control none --profile-from-start off --set full -o masks \
        python results/tuning/h200-2026-11-27-ncu-masks/ncu_masks.py --seq-len 16384
    ncu --import masks.ncu-rep --page details --csv > masks.csv

Each case runs three times first (compiles, launch plans), so only the steady-state kernels are profiled.
"""

import argparse
import functools

import torch
from bench_masks import HEADS, TOKENS_PER_CALL, Profile, build_case, flash_fn
from ncu_attention import profile_steady_state

PROFILE = Profile("cuda", torch.bfloat16, block_size=128, check_seq_len=4096, dropout_check_seq_len=1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--masks", default="dense,documents,local_global,window_1k")
    parser.add_argument("--dropout", type=float, default=0.0)
    args = parser.parse_args()
    batch = max(1, TOKENS_PER_CALL // args.seq_len)
    shape = (batch, HEADS, args.seq_len, 64)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    fns = {}
    for name in args.masks.split(","):
        attend = flash_fn(build_case(name, args.seq_len, batch, PROFILE), args.dropout, args.seq_len, q.dtype)
        fns[name] = functools.partial(attend, q, k, v)
    profile_steady_state(fns, (q, k, v), do, warmup=3)
    print(f"profiled {', '.join(fns)} at {shape}, dropout {args.dropout}")


if __name__ == "__main__":
    main()
