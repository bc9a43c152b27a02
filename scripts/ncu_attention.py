"""One causal fwd+bwd of each attention provider between cudaProfilerStart/Stop, for Nsight Compute:

    ncu --clock-control none --profile-from-start off --set full -o attn python scripts/ncu_attention.py
    ncu --import attn.ncu-rep --page details --csv > attn.csv

Each provider runs twice first (compiles, autotuning, caches), so only the steady-state kernels are profiled.
Providers: flash (the default backward for the shape), flash_deterministic (the split 7-product backward) and cuDNN.
"""

import argparse
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashgpt.kernels import flash_attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dropout", type=float, default=0.0)
    args = parser.parse_args()
    batch, heads = max(1, 16384 // args.seq_len), 12 if args.head_dim <= 64 else 2048 // args.head_dim
    shape = (batch, heads, args.seq_len, args.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    scale = 1 / math.sqrt(args.head_dim)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=args.dropout, scale=scale)

    providers = {
        "flash": lambda: flash_attention(q, k, v, dropout_p=args.dropout, deterministic=False),
        "flash_deterministic": lambda: flash_attention(q, k, v, dropout_p=args.dropout, deterministic=True),
        "sdpa_cudnn": cudnn,
    }
    profile_steady_state(providers, (q, k, v), do)
    print(f"profiled {', '.join(providers)} at {shape}, dropout {args.dropout}")


def profile_steady_state(
    providers: dict[str, Callable[[], torch.Tensor]],
    inputs: tuple[torch.Tensor, ...],
    grad: torch.Tensor,
    warmup: int = 2,
) -> None:
    """One fwd + autograd.grad of each provider between cudaProfilerStart/Stop, each in an NVTX range of its name,
    after `warmup` unprofiled calls of each (compiles, autotuning, launch plans)."""
    for fn in providers.values():
        for _ in range(warmup):
            torch.autograd.grad(fn(), inputs, grad)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, fn in providers.items():
        torch.cuda.nvtx.range_push(name)
        torch.autograd.grad(fn(), inputs, grad)
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
