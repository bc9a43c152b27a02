"""Where a Triton launch's host time goes on other threads: one trivial kernel launched in loops, timed inside the
loop, on the calling thread, on a long-lived Python thread, and inside an autograd backward (autograd's CUDA device
thread, and the calling thread with set_multithreading_enabled(False)); beside it a torch op (torch.empty) and
the whole fwd + grad of a Function whose backward makes one launch.

    PYTHONPATH=. python results/tuning/h100-2026-11-27-host-blocks/thread_launch.py
"""

import queue
import statistics
import threading
import time

import torch
import triton
import triton.language as tl

from flashgpt.kernels.fast_launch import FastLauncher

LOOP = 200


@triton.jit
def add_one(X, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(X + offs, tl.load(X + offs) + 1)


X = torch.zeros(128, device="cuda")
FAST = FastLauncher(add_one)


def triton_launch() -> None:
    add_one[(1,)](X, 128)


def fast_launch() -> None:
    FAST((1,), X, N=128)


def torch_op() -> None:
    torch.empty(128, device="cuda")


STEPS = {"triton launch": triton_launch, "direct launch": fast_launch, "torch.empty": torch_op}


def loop_us(step) -> float:
    """µs per call of a loop of LOOP calls (the GPU trails: the launches only queue)."""
    start = time.perf_counter()
    for _ in range(LOOP):
        step()
    return (time.perf_counter() - start) / LOOP * 1e6


BACKWARD_TIMES: dict[str, list[float]] = {}  # µs per call of each step's loops, timed inside a backward


class LoopInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        for name, step in STEPS.items():
            BACKWARD_TIMES.setdefault(name, []).append(loop_us(step))
        return grad


class OneLaunch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        fast_launch()
        return grad


def median_of(runs: int, measure) -> float:
    return statistics.median(measure() for _ in range(runs))


def main() -> None:
    for step in STEPS.values():  # compiled, allocator warm
        for _ in range(20):
            step()
    torch.cuda.synchronize()
    rows = {name: {} for name in STEPS}
    for name, step in STEPS.items():
        rows[name]["calling thread"] = median_of(11, lambda step=step: loop_us(step))
    jobs: queue.Queue = queue.Queue()
    results: queue.Queue = queue.Queue()

    def worker() -> None:
        while (job := jobs.get()) is not None:
            results.put(median_of(11, lambda job=job: loop_us(job)))

    thread = threading.Thread(target=worker)
    thread.start()
    for name, step in STEPS.items():
        jobs.put(step)
        rows[name]["long-lived thread"] = results.get()
    jobs.put(None)
    thread.join()
    x = torch.zeros(8, device="cuda", requires_grad=True)
    for label, threaded in (("inside backward, device thread", True), ("inside backward, calling thread", False)):
        BACKWARD_TIMES.clear()
        with torch.autograd.set_multithreading_enabled(threaded):
            for _ in range(11):
                torch.autograd.grad(LoopInBackward.apply(x).sum(), x)
        for name in STEPS:
            rows[name][label] = statistics.median(BACKWARD_TIMES[name])
    print(f"µs per call, loops of {LOOP}, medians of 11 loops ({torch.cuda.get_device_name()})")
    columns = list(next(iter(rows.values())))
    print(f"{'':16s}" + "".join(f"{c:>34s}" for c in columns))
    for name, row in rows.items():
        print(f"{name:16s}" + "".join(f"{row[c]:34.1f}" for c in columns))
    for label, threaded in (("device thread", True), ("calling thread", False)):
        with torch.autograd.set_multithreading_enabled(threaded):

            def one() -> None:
                torch.autograd.grad(OneLaunch.apply(x).sum(), x)

            for _ in range(20):
                one()
            print(f"fwd + grad of a Function whose backward launches once, {label}: "
                  f"{median_of(11, lambda: loop_us(one)):.1f} µs")  # fmt: skip


if __name__ == "__main__":
    main()
