"""Where the host time of one eager flash_attention call goes, on a CUDA machine, at a shape too small for the GPU
to matter (B = 1, H = 2, T = 128, D = 64): the call split into its stages, timed one by one, the launcher's cache,
a cProfile of the whole fwd+bwd, and cuDNN's SDPA as the peer.

    PYTHONPATH=. python scripts/profile_host.py --out results/tuning/host-profile.txt
    PYTHONPATH=. python scripts/profile_host.py --mask documents   # with a FlashMask built once beforehand
    PYTHONPATH=. python scripts/profile_host.py --dropout 0.1      # flash and cuDNN calls with dropout

With --mask the flash calls take a prebuilt mask (`flash_mask`, as a model step hands one to every layer) at
T = 1024: four documents, or a random 30% block mask of 128-blocks.

Stages (µs per call, the loop's wall time before the final sync: the GPU only trails the host here):
forward without grad, forward with grad, fwd + autograd.grad (also with every launch taking the full path,
`launch_plans.ENABLED` off), the backward operator body alone, and each launch; then where autograd runs the
backward: an empty autograd.Function, one whose backward makes the two split-backward launches, and flash and
cuDNN, each on autograd's CUDA device thread (the default) and on the calling thread
(`torch.autograd.set_multithreading_enabled(False)`), and two launches on a fresh Python thread.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import threading
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashgpt.kernels import FlashMask, attention_op, flash_attention, flash_mask, launch, launch_plans

SHAPE = (1, 2, 128, 64)


def per_call_us(step: Callable[[], object], calls: int) -> float:
    for _ in range(50):  # warm: caches filled, the CPU clock up
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def inside_autograd(step: Callable[[], object], calls: int) -> str:
    """Where a real fwd + autograd.grad spends its host time: the forward's and backward's operator bodies timed in
    place (the backward runs on autograd's device thread), and the whole step with the kernel launches stubbed
    (the full path: stubbed launches leave nothing to replay)."""
    spent = {"_forward_launches": 0.0, "_backward_launches": 0.0}
    originals = {name: getattr(attention_op, name) for name in spent}

    def timed(name: str) -> Callable:
        def run(*args):
            start = time.perf_counter()
            result = originals[name](*args)
            spent[name] += time.perf_counter() - start
            return result

        return run

    for name in spent:
        setattr(attention_op, name, timed(name))
    try:
        total = per_call_us(step, calls)
    finally:
        for name, original in originals.items():
            setattr(attention_op, name, original)
    launch_fn = launch._launch
    launch._launch = lambda *args, **kwargs: None
    launch_plans.ENABLED = False  # nothing launched, nothing to replay
    try:
        stubbed = per_call_us(step, calls)
    finally:
        launch._launch = launch_fn
        launch_plans.ENABLED = True
    bodies = ", ".join(f"{name} {seconds / (calls + 50) * 1e6:.1f} us" for name, seconds in spent.items())
    return f"inside fwd + autograd.grad ({total:.1f} us): {bodies}; launches stubbed: {stubbed:.1f} us"


def prebuilt_mask(kind: str, shape: tuple[int, ...], dropout_p: float) -> FlashMask:
    """Four equal documents, or a random 30% block mask of 128-blocks, with their schedules built once (for calls
    with dropout_p, whose tiles they fit)."""
    seq_len, head_dim = shape[2], shape[3]
    if kind == "documents":
        masks = {"document_ids": (torch.arange(seq_len, device="cuda") * 4 // seq_len)[None]}
    else:
        blocks = seq_len // 128
        generator = torch.Generator().manual_seed(0)
        masks = {"block_mask": (torch.rand(1, blocks, blocks, generator=generator) < 0.3).cuda(), "block_size": 128}
    return flash_mask(seq_len, seq_len, head_dim=head_dim, dtype=torch.bfloat16, dropout_p=dropout_p, **masks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", default=None, help="also write the report to this file")
    parser.add_argument("--trace", default=None, help="write a Chrome trace of 10 flash and cuDNN fwd+bwd here")
    parser.add_argument("--mask", choices=("none", "documents", "blocks"), default="none")
    parser.add_argument("--dropout", type=float, default=0.0, help="dropout_p of the flash and cuDNN calls")
    args = parser.parse_args()
    shape = SHAPE if args.mask == "none" else (*SHAPE[:2], 1024, SHAPE[3])
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in "qkv")
    grad_out = torch.randn_like(q)
    masked = {"mask": prebuilt_mask(args.mask, shape, args.dropout)} if args.mask != "none" else {}
    if args.dropout:
        masked["dropout_p"] = args.dropout
    lines: list[str] = [
        f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, shape {shape}, mask {args.mask}, "
        f"dropout {args.dropout}"
    ]

    def flash_fwd_nograd() -> None:
        with torch.no_grad():
            flash_attention(q, k, v, **masked)

    def flash_fwd_grad() -> None:
        flash_attention(q, k, v, **masked)

    def flash_fwd_bwd() -> None:
        torch.autograd.grad(flash_attention(q, k, v, **masked), (q, k, v), grad_out)

    def cudnn_fwd_bwd() -> None:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=args.dropout)
            torch.autograd.grad(o, (q, k, v), grad_out)

    class Floor(torch.autograd.Function):
        """A Python autograd.Function that launches nothing: the floor of any such op's host time."""

        @staticmethod
        def forward(ctx, q, k, v):
            return torch.empty_like(q)

        @staticmethod
        def backward(ctx, do):
            return torch.empty_like(do), torch.empty_like(do), torch.empty_like(do)

    def floor_fwd_bwd() -> None:
        torch.autograd.grad(Floor.apply(q, k, v), (q, k, v), grad_out)

    with torch.no_grad():
        o, lse = flash_attention(q, k, v, return_lse=True)
    qd, kd, vd = q.detach(), k.detach(), v.detach()

    def backward_body() -> None:
        attention_op._backward_kernels(grad_out, qd, kd, vd, o, lse, None, None, True, 0.0, None)

    params = attention_op._params(True, 0.0, None, SHAPE[-1], None)
    cfg_dq = launch.tuned_config("bwd_dq", qd, params)
    cfg_dkdv = launch.tuned_config("bwd_dkdv", qd, params)
    delta = torch.empty_like(lse)
    dq, dk, dv = torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd)

    def dq_launch() -> None:
        launch.launch_dq(qd, kd, vd, grad_out, lse, delta, dq, params, cfg_dq, o=o)

    def dkdv_launch() -> None:
        launch.launch_dkdv(qd, kd, vd, grad_out, lse, delta, dk, dv, params, cfg_dkdv)

    def dq_key() -> None:
        launch._fast_launcher(launch.flash_bwd_dq_kernel).key(0, (qd, kd, vd) * 20, {"A": 1})

    def single_threaded(step: Callable[[], object]) -> Callable[[], None]:
        """step with autograd's backward run on the calling thread instead of its CUDA device thread."""

        def run() -> None:
            with torch.autograd.set_multithreading_enabled(False):
                step()

        return run

    def on_worker_thread(step: Callable[[], object]) -> Callable[[], None]:
        """step on a second Python thread (as autograd runs a backward), the caller waiting for it."""

        def run() -> None:
            thread = threading.Thread(target=step)
            thread.start()
            thread.join()

        return run

    class LaunchingBackward(torch.autograd.Function):
        """Floor's forward; a backward that makes the two split-backward launches with prepared arguments."""

        @staticmethod
        def forward(ctx, q, k, v):
            return torch.empty_like(q)

        @staticmethod
        def backward(ctx, do):
            dq_launch()
            dkdv_launch()
            return dq, dk, dv

    def launching_fwd_bwd() -> None:
        torch.autograd.grad(LaunchingBackward.apply(q, k, v), (q, k, v), grad_out)

    def nothing() -> None:
        pass

    def without_plans(step: Callable[[], object]) -> Callable[[], None]:
        """step with every launch taking the full path (`launch_plans.ENABLED` off)."""

        def run() -> None:
            launch_plans.ENABLED = False
            try:
                step()
            finally:
                launch_plans.ENABLED = True

        return run

    stages = {
        "flash fwd, no grad": flash_fwd_nograd,
        "flash fwd, grad": flash_fwd_grad,
        "flash fwd + autograd.grad": flash_fwd_bwd,
        "flash fwd + grad, no launch plans": without_plans(flash_fwd_bwd),
        "flash fwd, no grad, no launch plans": without_plans(flash_fwd_nograd),
        "flash backward body": backward_body,
        "launch_dq": dq_launch,
        "launch_dkdv": dkdv_launch,
        "FastLauncher key, 60 args": dq_key,
        "cudnn fwd + autograd.grad": cudnn_fwd_bwd,
        "empty Function + autograd.grad": floor_fwd_bwd,
        "Function launching dq, dkdv + grad": launching_fwd_bwd,
        "flash fwd + grad, one thread": single_threaded(flash_fwd_bwd),
        "cudnn fwd + grad, one thread": single_threaded(cudnn_fwd_bwd),
        "empty Function + grad, one thread": single_threaded(floor_fwd_bwd),
        "Function launching + grad, 1 thr": single_threaded(launching_fwd_bwd),
        "thread start + join": on_worker_thread(nothing),
        "launch_dq + dkdv on a thread": on_worker_thread(lambda: (dq_launch(), dkdv_launch())),
        "launch_dq + dkdv": lambda: (dq_launch(), dkdv_launch()),
    }
    for name, step in stages.items():
        lines.append(f"{name:>36}: {per_call_us(step, args.calls):7.1f} us")
    lines.append(inside_autograd(flash_fwd_bwd, args.calls))
    for kernel in (launch.flash_fwd_kernel, launch.flash_bwd_dq_kernel, launch.flash_bwd_dkdv_kernel):
        lines.append(f"launcher entries {kernel.fn.__name__}: {len(launch._fast_launcher(kernel)._entries)}")

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.calls):
        flash_fwd_bwd()
    profiler.disable()
    torch.cuda.synchronize()
    for order in ("tottime", "cumulative"):
        stream = io.StringIO()
        pstats.Stats(profiler, stream=stream).sort_stats(order).print_stats(30)
        lines.append(stream.getvalue())

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            flash_fwd_bwd()
    lines.append(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    if args.trace:
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        ) as prof:
            for _ in range(10):
                flash_fwd_bwd()
                cudnn_fwd_bwd()
            torch.cuda.synchronize()
        prof.export_chrome_trace(args.trace)
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    main()
