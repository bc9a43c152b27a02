"""GPU time of each kernel in one causal fwd+bwd: ours (flash_attention) and cuDNN's (SDPA), same inputs, one
process (torch.profiler, mean of 20 calls after warm-up). Shapes as `scripts/bench_attention.py`'s: 16K tokens a
call, H = 12 at D = 64 and 16 at D = 128, bf16, no dropout.

    PYTHONPATH=. python results/tuning/h200-2026-11-27-kernel-split/kernel_split.py --out split.json
"""

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashgpt.kernels import flash_attention

HEADS = {64: 12, 128: 16}


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def flash(q, k, v):
    return flash_attention(q, k, v, causal=True)


def split(fn, head_dim: int, seq_len: int, calls: int = 20) -> dict[str, float]:
    batch = 16384 // seq_len
    shape = (batch, HEADS[head_dim], seq_len, head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn_like(q)
    for _ in range(5):
        fn(q, k, v).backward(grad)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(q, k, v).backward(grad)
        torch.cuda.synchronize()
    return {e.key[:60]: e.device_time_total / calls / 1e3 for e in prof.key_averages() if e.device_time_total > 0}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    for head_dim in (64, 128):
        for seq_len in (4096, 16384):
            for name, fn in (("flash", flash), ("cudnn", cudnn)):
                kernels = split(fn, head_dim, seq_len)
                rows.append({"provider": name, "head_dim": head_dim, "seq_len": seq_len, "kernels_ms": kernels})
                print(f"D={head_dim} T={seq_len} {name}: total {sum(kernels.values()):.3f} ms | "
                      + " | ".join(f"{n} {ms:.3f}" for n, ms in sorted(kernels.items(), key=lambda x: -x[1])),
                      flush=True)  # fmt: skip
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
