"""Where the host time of one eager fwd + autograd.grad goes (B = 1, H = 2, T = 128, D = 64, bf16): timestamps
around the forward, at the backward body's start and end, and around each replayed launch; with autograd's backward
on its CUDA device thread (the default) and on the calling thread (set_multithreading_enabled(False)); replayed
launches given tensors (Triton's launcher then calls data_ptr() and cuPointerGetAttribute per tensor) or
addresses; an empty autograd.Function ("floor") for the cost of autograd alone. Medians of 300 calls, µs.

    PYTHONPATH=.:scripts python results/tuning/h200-2026-11-26-launch-plans/handoff.py
"""

import statistics
import time
from collections.abc import Callable

import torch

from flashgpt.kernels import attention_op, flash_attention, launch_plans
from flashgpt.kernels.fast_launch import BoundLaunch

STAMPS: dict[str, float] = {}
LAUNCH_SECONDS: list[float] = []


def stamped_backward(body: Callable) -> Callable:
    def run(*args):
        STAMPS["bwd_in"] = time.perf_counter()
        result = body(*args)
        STAMPS["bwd_out"] = time.perf_counter()
        return result

    return run


def timed_launch(launch: Callable) -> Callable:
    def run(self, values, stream) -> None:
        start = time.perf_counter()
        launch(self, values, stream)
        LAUNCH_SECONDS.append(time.perf_counter() - start)

    return run


class Floor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        return torch.empty_like(q)

    @staticmethod
    @stamped_backward
    def backward(ctx, do):
        return torch.empty_like(do), torch.empty_like(do), torch.empty_like(do)


def measure(op: Callable, q, k, v, grad_out, calling_thread: bool, calls: int = 300) -> str:
    rows = []
    for i in range(calls + 50):
        LAUNCH_SECONDS.clear()
        t0 = time.perf_counter()
        o = op(q, k, v)
        t1 = time.perf_counter()
        with torch.autograd.set_multithreading_enabled(not calling_thread):
            torch.autograd.grad(o, (q, k, v), grad_out)
        t2 = time.perf_counter()
        if i >= 50:
            bwd_in, bwd_out = STAMPS["bwd_in"], STAMPS["bwd_out"]
            rows.append((t1 - t0, bwd_in - t1, bwd_out - bwd_in, sum(LAUNCH_SECONDS), t2 - bwd_out, t2 - t0))
        if i % 50 == 0:
            torch.cuda.synchronize()
    fwd, to_bwd, body, launches, back, total = (statistics.median(c) * 1e6 for c in zip(*rows, strict=True))
    return (
        f"fwd {fwd:6.1f} | to bwd {to_bwd:6.1f} | bwd body {body:6.1f} (launches {launches:5.1f}) | "
        f"back {back:6.1f} | total {total:6.1f} us"
    )


def main() -> None:
    attention_op._attention_backward = stamped_backward(attention_op._attention_backward)
    BoundLaunch.__call__ = timed_launch(BoundLaunch.__call__)
    q, k, v = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad_out = torch.randn_like(q)
    pointer = launch_plans.pointer
    for _ in range(2):
        for mode in ("tensors", "addresses"):
            launch_plans.pointer = (lambda t: t) if mode == "tensors" else pointer
            for calling_thread in (False, True):
                where = "calling thread" if calling_thread else "device thread "
                print(f"{mode:9} flash {where}: {measure(flash_attention, q, k, v, grad_out, calling_thread)}")
    for calling_thread in (False, True):
        where = "calling thread" if calling_thread else "device thread "
        print(f"floor {where}: {measure(Floor.apply, q, k, v, grad_out, calling_thread)}")


if __name__ == "__main__":
    main()
