"""GPU busy time (the sum of kernel durations, torch.profiler) against do_bench time for one fwd+bwd, per
bench_masks mask at one T, ours and FlexAttention's: where do_bench exceeds the busy time, the host bounds the call.

    PYTHONPATH=.:scripts python results/tuning/h200-2026-11-26-launch-plans/gpu_busy.py 4096 $OUT/gpu_busy_4k.json
"""

import json
import sys
from collections.abc import Callable

import bench_masks
import torch
import triton.testing


def fwd_bwd(attend: Callable, q, k, v, grad_out) -> Callable[[], None]:
    def step() -> None:
        attend(q, k, v).backward(grad_out)
        q.grad = k.grad = v.grad = None

    return step


def main() -> None:
    seq_len = int(sys.argv[1])
    batch = 16384 // seq_len
    profile = bench_masks.Profile("cuda", torch.bfloat16, 128, 1024, 256)
    rows = []
    for name in bench_masks.MASKS:
        case = bench_masks.build_case(name, seq_len, batch, profile)
        for provider in ("flash", "flex"):
            if provider == "flash":
                attend = bench_masks.flash_fn(case, 0.0, seq_len, torch.bfloat16)
            else:
                attend = bench_masks.flex_fn(case, seq_len, batch)
            shape = (batch, bench_masks.HEADS, seq_len, bench_masks.HEAD_DIM)
            q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
            step = fwd_bwd(attend, q, k, v, torch.randn_like(q))
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            calls = 20
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    step()
                torch.cuda.synchronize()
            kernels: dict[str, float] = {}
            for event in prof.events():
                if event.device_type == torch.autograd.DeviceType.CUDA:
                    kernels[event.name] = kernels.get(event.name, 0.0) + event.device_time / calls
            row = {
                "mask": name,
                "provider": provider,
                "T": seq_len,
                "gpu_busy_ms": sum(kernels.values()) / 1000,
                "do_bench_ms": triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median"),
                "kernels": {k[:60]: round(v, 1) for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:6]},
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(sys.argv[2], "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
