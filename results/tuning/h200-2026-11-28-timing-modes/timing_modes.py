"""One causal fwd+bwd, ours (flash_attention) against cuDNN (SDPA), timed four ways in one process, to tell the
kernels' GPU time from what the benchmark's timer adds (bench_attention.py's shapes: 16K tokens a call, H = 12 at
D = 64 and 16 at D = 128, bf16, no dropout):

- bench: triton.testing.do_bench(warmup=25, rep=100, grad_to_none) median, as scripts/bench_attention.py (L2
  flushed before every call);
- loop: 50 calls back to back between two events (L2 warm, the GPU never waits on the host if the host is faster);
- kernels_flushed: the sum of the GPU time of each kernel of a call (torch.profiler), L2 flushed before each call;
- kernels_warm: the same without the flush.

    PYTHONPATH=. python results/tuning/h200-2026-11-28-timing-modes/timing_modes.py --out timing.json
    PYTHONPATH=.:scripts python results/tuning/h200-2026-11-28-timing-modes/timing_modes.py --masks --out masks.json
"""

import argparse
import json

import torch
import torch.nn.functional as F
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashgpt.kernels import flash_attention

HEADS = {64: 12, 128: 16}
FLUSH_BYTES = 256 * 2**20


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def flash(q, k, v):
    return flash_attention(q, k, v, causal=True)


def kernel_ms(step, grads, flush: torch.Tensor | None, calls: int = 20) -> dict[str, float]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            if flush is not None:
                flush.zero_()
            for t in grads:
                t.grad = None
            step()
        torch.cuda.synchronize()
    return {e.key[:60]: e.device_time_total / calls / 1e3 for e in prof.key_averages() if e.device_time_total > 0}


def flush_ms(flush: torch.Tensor) -> float:
    """GPU time of one flush, to take out of kernels_flushed (the flush's fill kernel may be the call's own)."""
    return sum(kernel_ms(lambda: None, [], flush).values())


def loop_ms(step, grads, calls: int = 50) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    step()
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        for t in grads:
            t.grad = None
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def measure(fn, head_dim: int, seq_len: int, flush: torch.Tensor, heads: int | None = None) -> dict:
    shape = (16384 // seq_len, heads or HEADS[head_dim], seq_len, head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn_like(q)
    grads = [q, k, v]

    def step():
        fn(q, k, v).backward(grad)

    for _ in range(3):
        step()
    row = {
        "bench_ms": triton.testing.do_bench(step, warmup=25, rep=100, grad_to_none=grads, return_mode="median"),
        "loop_ms": loop_ms(step, grads),
    }
    flushed = kernel_ms(step, grads, flush)
    warm = kernel_ms(step, grads, None)
    row["kernels_flushed_ms"] = sum(flushed.values()) - flush_ms(flush)
    row["kernels_warm_ms"] = sum(warm.values())
    row["kernels_flushed"] = flushed
    row["kernels_warm"] = warm
    return row


def masked(flush: torch.Tensor, rnd: int) -> list[dict]:
    """bench_masks.py's cases through our kernel: effective rate against dense causal, per way of timing."""
    import bench_masks

    profile = bench_masks.Profile("cuda", torch.bfloat16, 128, 4096, 1024)
    rows = []
    for seq_len in (4096, 16384):
        batch = max(1, 16384 // seq_len)
        dense_ms = None
        for name in ("dense", "window_1k", "documents", "strided"):
            case = bench_masks.build_case(name, seq_len, batch, profile)
            fn = bench_masks.flash_fn(case, 0.0, seq_len, torch.bfloat16)
            row = measure(fn, 64, seq_len, flush, heads=bench_masks.HEADS)
            modes = ("bench_ms", "loop_ms", "kernels_flushed_ms", "kernels_warm_ms")
            if name == "dense":
                dense_ms = {m: row[m] for m in modes}
            x_dense = {m: dense_ms[m] * case.density / row[m] for m in modes}
            rows.append({"round": rnd, "mask": name, "seq_len": seq_len, "density": case.density,
                         "x_dense": x_dense, **row})  # fmt: skip
            print(f"round {rnd} mask {name} T={seq_len} density {case.density:.3f}: x dense  "
                  + "  ".join(f"{m.removesuffix('_ms')} {r:.3f}" for m, r in x_dense.items())
                  + "  | ms " + "/".join(f"{row[m]:.3f}" for m in modes), flush=True)  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--masks", action="store_true", help="bench_masks.py's cases instead of the kernel table")
    args = parser.parse_args()
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    if args.masks:
        rows = [row for rnd in range(args.rounds) for row in masked(flush, rnd)]
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
        return
    rows = []
    for rnd in range(args.rounds):
        for head_dim in (64, 128):
            for seq_len in (2048, 4096, 16384):
                pair = {}
                for name, fn in (("flash", flash), ("cudnn", cudnn)):
                    pair[name] = measure(fn, head_dim, seq_len, flush)
                    rows.append({"round": rnd, "provider": name, "head_dim": head_dim, "seq_len": seq_len,
                                 **pair[name]})  # fmt: skip
                ratio = {m: pair["cudnn"][m] / pair["flash"][m]
                         for m in ("bench_ms", "loop_ms", "kernels_flushed_ms", "kernels_warm_ms")}  # fmt: skip
                print(f"round {rnd} D={head_dim} T={seq_len}: flash speed / cuDNN's  "
                      + "  ".join(f"{m.removesuffix('_ms')} {r:.3f}" for m, r in ratio.items())
                      + f"  | flash ms {pair['flash']['bench_ms']:.3f}/{pair['flash']['loop_ms']:.3f}/"
                      f"{pair['flash']['kernels_flushed_ms']:.3f}/{pair['flash']['kernels_warm_ms']:.3f}"
                      f"  cudnn ms {pair['cudnn']['bench_ms']:.3f}/{pair['cudnn']['loop_ms']:.3f}/"
                      f"{pair['cudnn']['kernels_flushed_ms']:.3f}/{pair['cudnn']['kernels_warm_ms']:.3f}",
                      flush=True)  # fmt: skip
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
