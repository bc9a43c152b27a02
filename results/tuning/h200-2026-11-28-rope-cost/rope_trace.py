"""The compiled step's generated code and a CUDA trace, learned against rope positions at T = 1K.

Builds both models as rope_variants.py does (GPT-2 124M, 32K tokens a step, attention=flash), keeps inductor's
generated code of the forward and backward graphs (`code_{variant}_{0,1}.py`), times two interleaved rounds, then
records four steps of each under torch.profiler as a Chrome trace (`trace_{variant}.json.gz`).

    PYTHONPATH=$PWD:$PWD/scripts OUT=... python results/tuning/h200-2026-11-28-rope-cost/rope_trace.py
"""

import argparse
import gzip
import os
import shutil

import rope_variants
import torch
from bench_train import measure
from torch._inductor.utils import run_and_get_code
from torch.profiler import ProfilerActivity, profile


def main():
    out = os.environ["OUT"]
    args = argparse.Namespace(model="gpt2", tokens_per_step=32768, compile_backend="inductor", warmup=3, steps=10)
    device = torch.device("cuda")
    built = {}
    for name in ("learned", "rope"):
        built[name] = rope_variants.build(args, name, 1024, device)
        _, codes = run_and_get_code(lambda: measure(*built[name], args, True))  # noqa: B023 (called at once)
        for i, code in enumerate(codes):
            with open(f"{out}/code_{name}_{i}.py", "w") as f:
                f.write(code)
    for _ in range(2):
        for name, (step, next_batch) in built.items():
            print(name, measure(step, next_batch, args, True)["step_ms"], flush=True)
    for name, (step, next_batch) in built.items():
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(4):
                step(next_batch)
            torch.cuda.synchronize()
        path = f"{out}/trace_{name}.json"
        prof.export_chrome_trace(path)
        with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
            shutil.copyfileobj(f, g)
        os.remove(path)


if __name__ == "__main__":
    main()
