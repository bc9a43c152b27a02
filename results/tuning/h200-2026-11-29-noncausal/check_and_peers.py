"""Non-causal attention through the tuned (causal) table's passes: the GPU checks of `bench_attention.py` for
non-causal shapes, then fwd+bwd against cuDNN and FlashAttention-2 (SDPA, is_causal=False) in one process.

    PYTHONPATH=$PWD:$PWD/scripts python results/tuning/h200-2026-11-29-noncausal/check_and_peers.py --out $OUT
"""

import argparse
import json
from pathlib import Path

import bench_attention as ba
import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashgpt.kernels import flash_attention

CHECKS = [
    ba.CheckCase(4, 12, 1024, 64, causal=False),
    ba.CheckCase(2, 16, 1024, 128, causal=False, packed=True),
    ba.CheckCase(2, 12, 1000, 64, causal=False),  # ragged
    ba.CheckCase(2, 12, 3000, 64, causal=False, samples=3),
    ba.CheckCase(4, 12, 4096, 64, causal=False, packed=True, samples=3),
    ba.CheckCase(2, 16, 4096, 128, causal=False, samples=2),
    ba.CheckCase(1, 12, 16384, 64, causal=False, samples=2),
    ba.CheckCase(1, 16, 16384, 128, causal=False, samples=2),
    ba.CheckCase(2, 12, 4096, 64, causal=False, samples=3, queries=3000),  # Tq < Tk
]
DROPOUT_CHECKS = [ba.CheckCase(1, 2, 1024, 128, causal=False), ba.CheckCase(2, 4, 2048, 64, causal=False)]


def time_fwd_bwd(fn, q, k, v, do) -> float:
    def step():
        fn(q, k, v).backward(do)

    step()
    return triton.testing.do_bench(step, warmup=25, rep=100, grad_to_none=[q, k, v])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--checks-only", action="store_true")
    args = parser.parse_args()
    profile = ba.gpu_profile(quick=False, head_dims=(64, 128))
    report = {"device": torch.cuda.get_device_name(0), "checks": [], "timings": []}
    for case in CHECKS:
        result = ba.check_case(case, profile)
        report["checks"].append(result)
        print(f"check {case}: {'ok' if result['passed'] else 'FAILED'} {result['rel_err']}", flush=True)
    for case in DROPOUT_CHECKS:  # at the checks' rate, which the kernel's 8-bit decisions represent exactly
        for name, check in (("mask", ba.check_dropout_mask), ("seeds", ba.check_dropout_seeds)):
            arg = 1234 if name == "mask" else profile.dropout_seeds
            result = check(case, profile, ba.CHECK_DROPOUT_P, arg)
            report["checks"].append({"case": str(case), "check": f"dropout {name}", **result})
            print(f"dropout {name} {case}: {'ok' if result['passed'] else 'FAILED'} {result}", flush=True)
    for drop in (0.0, ba.CHECK_DROPOUT_P):  # deterministic=True: bit-identical gradients from call to call
        result = ba.check_deterministic_repeats(ba.CheckCase(2, 12, 4096, 64, causal=False), profile, drop)
        report["checks"].append({"check": f"deterministic, dropout {drop}", **result})
        print(f"deterministic, dropout {drop}: {'ok' if result['passed'] else 'FAILED'}", flush=True)
    providers = {
        "flash": lambda q, k, v: flash_attention(q, k, v, causal=False),
        "sdpa_cudnn": (SDPBackend.CUDNN_ATTENTION, lambda q, k, v: F.scaled_dot_product_attention(q, k, v)),
        "sdpa_flash2": (SDPBackend.FLASH_ATTENTION, lambda q, k, v: F.scaled_dot_product_attention(q, k, v)),
    }
    for head_dim in () if args.checks_only else (64, 128):
        heads = 12 if head_dim == 64 else 16
        for seq_len in (1024, 2048, 4096, 8192, 16384):
            batch = max(1, 16384 // seq_len)
            q, k, v = (torch.randn(batch, heads, seq_len, head_dim, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))  # fmt: skip
            do = torch.randn_like(q)
            flops = 3.5 * 4 * batch * heads * seq_len**2 * head_dim
            row = {"head_dim": head_dim, "seq_len": seq_len}
            for name, fn in providers.items():
                if isinstance(fn, tuple):
                    backend, call = fn
                    with sdpa_kernel(backend):
                        ms = time_fwd_bwd(call, q, k, v, do)
                else:
                    ms = time_fwd_bwd(fn, q, k, v, do)
                row[name] = {"ms": ms, "tflops": flops / ms * 1e-9}
            row["flash_over_cudnn"] = row["sdpa_cudnn"]["ms"] / row["flash"]["ms"]
            row["flash_over_fa2"] = row["sdpa_flash2"]["ms"] / row["flash"]["ms"]
            report["timings"].append(row)
            print(f"D={head_dim} T={seq_len:>5}: " + "  ".join(f"{n} {row[n]['tflops']:.0f}" for n in providers)
                  + f"  flash/cuDNN {row['flash_over_cudnn']:.2f}x flash/FA2 {row['flash_over_fa2']:.2f}x",
                  flush=True)  # fmt: skip
    report["passed"] = all(c["passed"] for c in report["checks"])
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print("all checks passed" if report["passed"] else "SOME CHECKS FAILED")


if __name__ == "__main__":
    main()
