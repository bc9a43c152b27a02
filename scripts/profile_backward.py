"""The backward's kernels at one shape: registers, spills and shared memory of each compiled kernel, and its time.

For profiling rather than tuning (`tune_attention.py` tunes): every variant runs on the same inputs in one process,
so the timings compare, and a profiler can pick one kernel out by name, e.g.

    python scripts/profile_backward.py --seq-len 4096 --head-dim 64
    ncu --clock-control none --kernel-name regex:dkdv --launch-skip 30 --launch-count 1 --section WarpStateStats \
        python scripts/profile_backward.py --seq-len 4096 --variants fused-tma

Variants: "split" (the deterministic dQ and dK/dV kernels at the tuned configurations, or with the dK/dV kernel at
each of --dkdv-configs), "fused-tma" and "fused-atomic" (the fused backward summing dQ through bulk tensor
reduce-adds or element-wise atomics, at the tuned bwd_fused configuration or at each of --fused-configs), and
"cudnn" (PyTorch's cuDNN attention backward on the same inputs: the peer). A configuration is written
BLOCK_M,BLOCK_N,WARPS,STAGES[,tma][,maxnreg=N]; several are separated by semicolons.
"""

import argparse
import math

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashgpt.kernels.launch import (
    AttentionParams,
    launch_dkdv,
    launch_dq,
    launch_dq_convert,
    launch_forward,
    launch_preprocess,
    tuned_config,
)
from flashgpt.kernels.tuning import LaunchConfig


def compiled_kernels() -> dict[str, dict]:
    """Registers, spills and shared memory of every kernel compiled so far in this process, by name."""
    from flashgpt.kernels import flash_bwd

    out = {}
    for name in ("flash_bwd_dkdv_kernel", "flash_bwd_dq_kernel"):
        kernel = getattr(flash_bwd, name)
        for device_cache in kernel.device_caches.values():
            for key, compiled in device_cache[0].items():
                meta = compiled.metadata
                out[f"{name}[{hash(str(key)) % 10**6}]"] = {
                    "regs": getattr(compiled, "n_regs", None),
                    "spills": getattr(compiled, "n_spills", None),
                    "shared_kib": getattr(meta, "shared", 0) / 1024,
                    "warps": getattr(meta, "num_warps", None),
                }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--variants", default="split,fused-tma,fused-atomic,cudnn")
    parser.add_argument("--fused-configs", default=None, help="configurations for the fused variants (default: tuned)")
    parser.add_argument("--dkdv-configs", default=None, help="configurations for split's dK/dV kernel (default: tuned)")
    args = parser.parse_args()

    seq_len, head_dim = args.seq_len, args.head_dim
    batch, heads = max(1, 16384 // seq_len), 12 if head_dim <= 64 else 2048 // head_dim
    q, k, v, do = (torch.randn(batch, heads, seq_len, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    params = AttentionParams(True, args.dropout, 1 / math.sqrt(head_dim), seed=1234, offset=0)
    o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
    lse = torch.empty(batch, heads, seq_len, device="cuda", dtype=torch.float32)
    delta = torch.empty_like(lse)
    dq_acc = torch.empty(q.shape, device="cuda", dtype=torch.float32)
    launch_forward(q, k, v, o, lse, params, tuned_config("fwd", q, params))

    def configs(text: str | None, kernel_pass: str) -> list[LaunchConfig]:
        return [LaunchConfig.parse(c) for c in text.split(";")] if text else [tuned_config(kernel_pass, q, params)]

    def split(dkdv_cfg: LaunchConfig):
        def run() -> None:
            launch_dq(q, k, v, do, lse, delta, dq, params, tuned_config("bwd_dq", q, params), o=o)
            launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, dkdv_cfg)

        return run

    def fused(reduce: str, cfg: LaunchConfig):
        def run() -> None:
            launch_preprocess(o, do, delta, None, dq_acc)
            launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, cfg, dq_acc=dq_acc, dq_reduce=reduce)
            launch_dq_convert(dq_acc, dq, params.softmax_scale)

        return run

    def cudnn():
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, dropout_p=args.dropout)
        return lambda: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)

    variants = {}
    for name in args.variants.split(","):
        if name == "split":
            variants.update({f"split dkdv {c}": split(c) for c in configs(args.dkdv_configs, "bwd_dkdv")})
        elif name in ("fused-tma", "fused-atomic"):
            reduce = name.removeprefix("fused-")
            variants.update({f"{name} {c}": fused(reduce, c) for c in configs(args.fused_configs, "bwd_fused")})
        elif name == "cudnn":
            variants["cudnn"] = cudnn()
        else:
            parser.error(f"unknown variant {name}")
    fwd_flops = 4 * batch * heads * seq_len**2 * head_dim * 0.5
    print(f"T={seq_len} D={head_dim} dropout={args.dropout} B={batch} H={heads}")
    for name, run in variants.items():
        ms = triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median")
        print(f"{ms:7.3f} ms {2.5 * fwd_flops / ms / 1e9:5.0f} TFLOP/s  {name}", flush=True)
    for name, info in compiled_kernels().items():
        print(name, info)


if __name__ == "__main__":
    main()
