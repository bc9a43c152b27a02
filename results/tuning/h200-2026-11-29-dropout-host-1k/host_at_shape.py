"""Host time of one eager fwd+bwd at issue 15's open cell (B = 16, H = 12, T = 1K, D = 64, causal, bf16), with and
without dropout, flash and cuDNN, with the GPU held by a sleep kernel so that no call ever waits for it: the loop
times the host alone. Also the stages of a flash call (its forward and backward launch bodies), whether every
signature got a launch plan, and the CUDA runtime calls a step makes (torch.profiler), to find a synchronisation.

    PYTHONPATH=. python results/tuning/h200-2026-11-29-dropout-host-1k/host_at_shape.py
"""

import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashgpt.kernels import attention_op, flash_attention, launch_plans

SHAPE = (16, 12, 1024, 64)
CALLS = 40


def held_host_us(step, calls: int = CALLS) -> float:
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    torch.cuda._sleep(2**31)  # ~1 s of GPU time: every launch below queues behind it
    start = time.perf_counter()
    for _ in range(calls):
        step()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def wall_us(step, calls: int = 200) -> float:
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    q, k, v = (torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in "qkv")
    grad_out = torch.randn_like(q)
    print(torch.cuda.get_device_name(), torch.__version__, SHAPE)
    for p in (0.0, 0.1):

        def flash_fwd_bwd(p=p):
            q.grad = k.grad = v.grad = None
            flash_attention(q, k, v, dropout_p=p).backward(grad_out)

        def flash_fwd(p=p):
            with torch.no_grad():
                flash_attention(q, k, v, dropout_p=p)

        def cudnn_fwd_bwd(p=p):
            q.grad = k.grad = v.grad = None
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p).backward(grad_out)

        def one_thread(step):
            def run():
                with torch.autograd.set_multithreading_enabled(False):
                    step()

            return run

        for name, step in (
            ("flash fwd", flash_fwd),
            ("flash fwd+bwd", flash_fwd_bwd),
            ("flash fwd+bwd, 1 thread", one_thread(flash_fwd_bwd)),
            ("cudnn fwd+bwd", cudnn_fwd_bwd),
            ("cudnn fwd+bwd, 1 thread", one_thread(cudnn_fwd_bwd)),
        ):
            print(
                f"dropout {p}  {name:>26}: host {held_host_us(step):7.1f} us (GPU held)   "
                f"wall {wall_us(step):7.1f} us (back to back)"
            )
        # the launch bodies on their own, GPU held, single-threaded backward so the timer sees both
        spent = {"_forward_launches": 0.0, "_backward_launches": 0.0}
        originals = {name: getattr(attention_op, name) for name in spent}

        def timed(name, originals=originals, spent=spent):
            def run(*args):
                start = time.perf_counter()
                result = originals[name](*args)
                spent[name] += time.perf_counter() - start
                return result

            return run

        for name in spent:
            setattr(attention_op, name, timed(name))
        total = held_host_us(one_thread(flash_fwd_bwd))
        for name, original in originals.items():
            setattr(attention_op, name, original)
        print(
            f"dropout {p}  stages (1 thread, {total:.1f} us): "
            + ", ".join(f"{n} {s / (CALLS + 5) * 1e6:.1f} us" for n, s in spent.items())
        )
        table = launch_plans._WITHOUT_TENSOR_MASKS
        kinds = [
            type(entry).__name__
            if isinstance(entry, launch_plans.LaunchPlan)
            else ("SEEN_ONCE" if entry is launch_plans._SEEN_ONCE else "NOT_PLANNABLE")
            for entry in table.values()
        ]
        print(f"dropout {p}  plans: {len(table)} signatures: {kinds}")
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        ) as prof:
            for _ in range(10):
                flash_fwd_bwd()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22))


if __name__ == "__main__":
    main()
