"""Where the host time of one fwd+bwd goes at 1K with dropout (the call that runs host-bound in some processes:
../h200-2026-11-28-masked-dq-warpgroup/README.md): cProfile over 300 calls of bench_attention's 1K row, the GPU left
running, sorted by own time and by cumulative time; and the host time of each part alone (forward; backward given
the forward's output; a bare Triton launch) as perf_counter medians.

    PYTHONPATH=$PWD python results/tuning/h200-2026-11-28-host-overhead/host_profile.py --out $OUT/host_profile.txt
"""

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch

from flashgpt.kernels import flash_attention

SHAPE = (16, 12, 1024, 64)


def host_ms(fn, n: int = 200) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--dropout", type=float, default=0.1)
    args = parser.parse_args()
    q, k, v = (torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad_out = torch.randn_like(q)

    def step() -> None:
        for x in (q, k, v):
            x.grad = None
        flash_attention(q, k, v, causal=True, dropout_p=args.dropout).backward(grad_out)

    def forward() -> None:
        with torch.no_grad():
            flash_attention(q, k, v, causal=True, dropout_p=args.dropout)

    for _ in range(30):
        step()
    torch.cuda.synchronize()
    lines = [
        f"host ms a call (median of 200): fwd+bwd {host_ms(step):.4f}, forward alone (no grad) {host_ms(forward):.4f}",
        f"torch.randn_like (one tiny launch) {host_ms(lambda: torch.empty(1, device='cuda').zero_()):.4f}",
    ]
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(300):
        step()
    profiler.disable()
    torch.cuda.synchronize()
    for key in ("tottime", "cumulative"):
        stream = io.StringIO()
        pstats.Stats(profiler, stream=stream).sort_stats(key).print_stats(45)
        lines.append(stream.getvalue())
    text = "\n".join(lines)
    print(text[:6000])
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
