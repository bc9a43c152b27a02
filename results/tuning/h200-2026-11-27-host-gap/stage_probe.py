"""Host timestamps through one benchmark iteration of flash at D = 64, T = 1K (16K tokens): where the time between
the forward's launch and the backward's launches goes, on autograd's device thread and on the calling thread.

Each stage boundary appends time.perf_counter_ns() to a list; medians over the iterations, in µs from the
iteration's start (the L2 clear's launch). No profiler. With --mask, a bench_masks mask at T = 4K (B = 4), built
once (`flash_mask`) as that benchmark does.

    PYTHONPATH=. python results/tuning/h200-2026-11-27-host-gap/stage_probe.py [--single-thread] [--mask local_global]
"""

import argparse
import statistics
import time

import torch
import triton

from flashgpt.kernels import attention_op, fast_launch, flash_attention, launch_plans

SHAPE = (16, 12, 1024, 64)
marks: list[tuple[str, int]] = []


def mark(name: str) -> None:
    marks.append((name, time.perf_counter_ns()))


def wrap(owner, name: str, label: str) -> None:
    if not hasattr(owner, name):  # a helper of another version of the code
        return
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        mark(f"{label} in")
        out = original(*args, **kwargs)
        mark(f"{label} out")
        return out

    setattr(owner, name, staticmethod(wrapped) if isinstance(owner.__dict__.get(name), staticmethod) else wrapped)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--single-thread", action="store_true")
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--detail", action="store_true", help="also time each helper of the eager path")
    parser.add_argument("--mask", default=None, help="a scripts/bench_masks.py mask, at T = 4K")
    args = parser.parse_args()
    wrap(attention_op._EagerFlashAttention, "forward", "Function.forward")
    wrap(attention_op._EagerFlashAttention, "backward", "Function.backward")
    wrap(attention_op, "_attention_backward", "_attention_backward")  # before this change
    wrap(attention_op, "_backward_launches", "_backward_launches")
    wrap(launch_plans.LaunchPlan, "__call__", "plan")
    if args.detail:  # every helper the eager path calls, as attention_op looks them up
        for name in (
            "_check_inputs",
            "_check_options",
            "_check_masks",
            "_draw_rng_state",
            "_params",
            "_call_options",
            "_kernel_masks",
            "hopper_launch_config",
            "backward_schedule_for",
        ):
            wrap(attention_op, name, name)
        wrap(launch_plans, "signature", "signature")
        wrap(launch_plans, "int_widths", "int_widths")
        wrap(launch_plans, "plans_for", "plans_for")
    wrap(fast_launch.BoundLaunch, "__call__", "launch")
    shape, attend = SHAPE, lambda q, k, v: flash_attention(q, k, v, causal=True, dropout_p=args.dropout)
    if args.mask:
        import bench_masks  # scripts/ on the path

        shape = (4, bench_masks.HEADS, 4096, bench_masks.HEAD_DIM)
        profile = bench_masks.Profile("cuda", torch.bfloat16, 128, 1024, 256)
        case = bench_masks.build_case(args.mask, 4096, 4, profile)
        attend = bench_masks.flash_fn(case, args.dropout, 4096, torch.bfloat16)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn_like(q)
    cache = triton.runtime.driver.active.get_empty_cache_for_benchmark()
    runs = []
    with torch.autograd.set_multithreading_enabled(not args.single_thread):
        for i in range(args.iters + 30):
            q.grad = k.grad = v.grad = None
            marks.clear()
            triton.runtime.driver.active.clear_cache(cache)
            mark("start")
            out = attend(q, k, v)
            mark("flash_attention returned")
            out.backward(grad)
            mark("backward returned")
            if i >= 30:
                runs.append(list(marks))
        torch.cuda.synchronize()  # none per iteration: do_bench lets the host run ahead
    names = [name for name, _ in runs[0]]
    # Repeated names (launch in/out) get an index.
    seen: dict[str, int] = {}
    labels = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        labels.append(f"{name} #{seen[name]}" if names.count(name) > 1 else name)
    print(
        f"dropout {args.dropout}, single thread {args.single_thread}: µs from start, median (p10, p90) of {len(runs)}"
    )
    previous = 0.0
    for j, label in enumerate(labels):
        times = sorted((run[j][1] - run[0][1]) / 1e3 for run in runs)
        med = statistics.median(times)
        print(
            f"{label:32} {med:7.1f}  (+{med - previous:6.1f})   p10 {times[len(times) // 10]:7.1f}  "
            f"p90 {times[9 * len(times) // 10]:7.1f}"
        )
        previous = med


if __name__ == "__main__":
    main()
