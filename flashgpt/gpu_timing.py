"""Two clocks for one benchmark step, each with the other out of the picture: the CPU time to issue the step and the
GPU time to run it. Where the first nears the second, a timed call measures the host rather than its kernels: the
GPU waits between launches. Used by the kernel and mask benchmarks (scripts/bench_attention.py, bench_masks.py)."""

import time
from collections.abc import Callable

import torch

SLEEP_CYCLES = 2**26  # ~34 ms at an H100's or H200's clock: longer than the host needs to queue 20 steps
SLEEP_DOUBLINGS = 4


def host_ms_per_call(step: Callable[[], object], calls: int, warmup: int = 3) -> float:
    """Milliseconds of CPU time to issue one `step`, timed over `calls` steps back to back. On CUDA the loop never
    waits for the GPU: a few steps stay far below its launch queue (~1000 launches), so only the host is timed."""
    cuda = torch.cuda.is_available()
    for _ in range(warmup if cuda else min(warmup, 1)):  # compilation, caches; once in Triton's slow interpreter
        step()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    elapsed = time.perf_counter() - start  # before the sync: the GPU only ever trails by a few microseconds
    if cuda:
        torch.cuda.synchronize()
    return elapsed / calls * 1e3


def gpu_ms_per_call(step: Callable[[], object], calls: int = 20) -> float | None:
    """Milliseconds of GPU time to run one `step` (CUDA only), idle gaps between its launches excluded: a sleep
    kernel holds the stream while the host queues `calls` steps, so the events around them time the kernels alone.
    The sleep doubles until it outlasts the queuing; None where it never does (a step that waits for the GPU)."""
    cycles = SLEEP_CYCLES
    for _ in range(SLEEP_DOUBLINGS):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)
        start.record()
        for _ in range(calls):
            step()
        queued_in_time = not start.query()  # the sleep still ran when the last step was queued
        end.record()
        torch.cuda.synchronize()
        if queued_in_time:
            return start.elapsed_time(end) / calls
        cycles *= 2
    return None
