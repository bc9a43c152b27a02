"""SM clock and power while one causal fwd+bwd runs back to back, ours against cuDNN's (bf16, 16K tokens a call,
bench_attention's shapes; D = 64 unless --head-dim): does the GPU slow its clock more for one of them?

Under Nsight Compute, which runs each kernel alone with idle time between, our split backward's two kernels took
2.15 ms at 16K against cuDNN's 2.27 (`attn16k.csv`): 1.06x faster. Back to back in the benchmark it reads
0.96-0.98x. Ours runs 7 matrix products per tile pair to cuDNN's 5; if the GPU is held at its power limit, the
extra products cost clock speed and not only issue slots.

    PYTHONPATH=$PWD python results/tuning/h200-2026-11-28-power/clocks.py --out $OUT/clocks.json

Each provider runs for `--seconds` in each of `--rounds` alternating windows; `nvidia-smi -lms 20` samples the SM
clock, power, temperature and active throttle reasons (a thread stamps each line as it arrives), and each window's
iterations are timed with CUDA events.
"""

import argparse
import json
import math
import statistics
import subprocess
import threading
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashgpt
from flashgpt.kernels import flash_attention

QUERY = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def sample(smi: subprocess.Popen, out: list) -> None:
    for line in smi.stdout:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 4 and fields[0].isdigit():
            out.append(dict(t=time.perf_counter(), sm_mhz=int(fields[0]), power_w=float(fields[1]),
                            temp_c=int(fields[2]), throttle=fields[3]))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--backward-only", action="store_true", help="time the backward of one saved forward")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    heads = 12 if args.head_dim <= 64 else 2048 // args.head_dim  # bench_attention's shapes
    shape = (16384 // args.seq_len, heads, args.seq_len, args.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    scale = 1 / math.sqrt(args.head_dim)

    def cudnn_forward():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    def step(forward):
        if not args.backward_only:
            return lambda: forward().backward(grad)
        out = forward()
        return lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)

    flash = step(lambda: flash_attention(q, k, v))
    cudnn = step(cudnn_forward)

    providers = {"flash": flash, "sdpa_cudnn": cudnn}
    for run in providers.values():  # compile, build caches
        run()
    torch.cuda.synchronize()
    device = str(torch.cuda.current_device())
    smi = subprocess.Popen(["nvidia-smi", "-i", device, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                            "-lms", "20"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    samples: list = []
    sampler = threading.Thread(target=sample, args=(smi, samples), daemon=True)
    sampler.start()
    time.sleep(1.0)
    windows = []
    for round_ in range(args.rounds):
        for name, run in providers.items():
            time.sleep(1.0)  # idle between windows: each starts from the same state
            start, events = time.perf_counter(), []
            while time.perf_counter() - start < args.seconds:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                run()
                end.record()
                events.append((begin, end))
                if len(events) % 20 == 0:
                    torch.cuda.synchronize()  # keep the host within a few calls of the GPU
            torch.cuda.synchronize()
            windows.append(dict(provider=name, round=round_, t0=start, t1=time.perf_counter(),
                                ms=[b.elapsed_time(e) for b, e in events]))  # fmt: skip
    smi.terminate()
    sampler.join(timeout=2)
    for w in windows:
        inside = [s for s in samples if w["t0"] + 0.5 <= s["t"] <= w["t1"]]  # past the first half second
        w["median_ms"] = statistics.median(w["ms"][len(w["ms"]) // 4 :])
        w["sm_mhz"] = statistics.median(s["sm_mhz"] for s in inside)
        w["power_w"] = statistics.median(s["power_w"] for s in inside)
        w["joules_per_call"] = w["power_w"] * w["median_ms"] / 1000
        w["temp_c"] = max(s["temp_c"] for s in inside)
        w["throttle_reasons"] = sorted({s["throttle"] for s in inside})
        print(f"{w['provider']:10s} round {w['round']}: {w['median_ms']:.3f} ms a call, SM {w['sm_mhz']:.0f} MHz, "
              f"{w['power_w']:.0f} W, {w['temp_c']} C, throttle reasons {w['throttle_reasons']}")  # fmt: skip
        del w["ms"]
    query = ["nvidia-smi", "-i", device, "--query-gpu=clocks.max.sm,power.limit", "--format=csv,noheader,nounits"]
    limits = subprocess.run(query, capture_output=True, text=True).stdout.strip()
    meta = dict(device=torch.cuda.get_device_name(), shape=shape, seconds=args.seconds, max_sm_mhz_power_limit_w=limits,
                backward_only=args.backward_only, flashgpt=flashgpt.__file__)  # fmt: skip
    print(meta)
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, windows=windows, samples=samples), f)


if __name__ == "__main__":
    main()
