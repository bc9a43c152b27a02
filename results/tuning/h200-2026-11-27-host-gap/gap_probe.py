"""Where the GPU waits in the benchmark's own loop: one `do_bench` iteration (clear L2, fwd, .backward) of flash and
cuDNN at D = 64, T = 1K, 16K tokens, traced with torch.profiler (CPU launches and GPU kernels), 40 iterations each.

Per iteration: GPU busy time (kernels after the L2 clear), the span from the end of the L2 clear to the end of the
last kernel (what the events measure, give or take), and each idle gap between consecutive kernels; on the host,
the time from the forward's launch call to the backward's first. Medians over the iterations.

    PYTHONPATH=. python results/tuning/h200-2026-11-27-host-gap/gap_probe.py --out gaps.json
"""

import argparse
import json
import os
import statistics
import tempfile

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashgpt.kernels import flash_attention

SHAPE = (16, 12, 1024, 64)


def providers():
    def flash(q, k, v, p):
        return flash_attention(q, k, v, causal=True, dropout_p=p)

    def cudnn(q, k, v, p):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)

    return {"flash": flash, "cudnn": cudnn}


def iteration_stats(trace: dict) -> dict:
    events = trace["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    launches = sorted(
        (e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and "aunch" in e.get("name", "")),
        key=lambda e: e["ts"],
    )
    iterations, current = [], None
    for kernel in kernels:
        if "Fill" in kernel["name"] or "fill" in kernel["name"]:
            current = {"clear": kernel, "kernels": []}
            iterations.append(current)
        elif current is not None:
            current["kernels"].append(kernel)
    rows = []
    for it in iterations[1:-1]:
        ks = it["kernels"]
        if not ks:
            continue
        clear_end = it["clear"]["ts"] + it["clear"]["dur"]
        busy = sum(k["dur"] for k in ks)
        span = ks[-1]["ts"] + ks[-1]["dur"] - clear_end
        gaps, previous_end = [], clear_end
        for k in ks:
            gaps.append(k["ts"] - previous_end)
            previous_end = k["ts"] + k["dur"]
        # host: launch calls made between this clear's launch and the next iteration's
        own = [ev for ev in launches if it["clear"]["ts"] - 2000 < ev["ts"] <= ks[-1]["ts"]]
        rows.append(
            {
                "busy": busy,
                "span": span,
                "gaps": gaps,
                "names": [k["name"][:40] for k in ks],
                "launch_ts": [ev["ts"] for ev in own],
                "launch_tid": [ev["tid"] for ev in own],
            }
        )
    n_kernels = statistics.mode(len(r["gaps"]) for r in rows)
    rows = [r for r in rows if len(r["gaps"]) == n_kernels]
    median = lambda xs: statistics.median(xs) if xs else float("nan")
    out = {
        "iterations": len(rows),
        "kernels": rows[0]["names"] if rows else [],
        "busy_us": median([r["busy"] for r in rows]),
        "span_us": median([r["span"] for r in rows]),
        "gaps_us": [median([r["gaps"][i] for r in rows]) for i in range(n_kernels)],
        "gaps_p90_us": [sorted(r["gaps"][i] for r in rows)[int(0.9 * len(rows))] for i in range(n_kernels)],
    }
    return out


def measure(fn, p: float, iters: int, single_thread: bool) -> dict:
    q, k, v = (torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn_like(q)
    cache = triton.runtime.driver.active.get_empty_cache_for_benchmark()

    def step():
        fn(q, k, v, p).backward(grad)

    def one():
        q.grad = k.grad = v.grad = None
        triton.runtime.driver.active.clear_cache(cache)
        step()

    with torch.autograd.set_multithreading_enabled(not single_thread):
        for _ in range(30):
            one()
        torch.cuda.synchronize()
        measured = triton.testing.do_bench(step, warmup=25, rep=100, grad_to_none=[q, k, v], return_mode="median")
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        ) as prof:
            for _ in range(iters):
                one()
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    stats = iteration_stats(trace)
    stats["do_bench_ms"] = measured
    return stats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--iters", type=int, default=40)
    args = parser.parse_args()
    results = {"affinity": sorted(os.sched_getaffinity(0)), "rows": []}
    for name, fn in providers().items():
        for p in (0.0, 0.1):
            for single in (False, True):
                row = {"provider": name, "dropout": p, "single_thread": single, **measure(fn, p, args.iters, single)}
                results["rows"].append(row)
                gaps = " ".join(f"{g:.0f}" for g in row["gaps_us"])
                print(
                    f"{name:6} p={p} 1thr={single!s:5} do_bench {row['do_bench_ms'] * 1e3:6.0f} us | busy "
                    f"{row['busy_us']:5.0f} span {row['span_us']:5.0f} | gaps {gaps} | {row['kernels']}",
                    flush=True,
                )
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
