"""Compile the Gluon forward's variants for sm_90a on a CPU machine: registers, spills, shared memory, ptxas warnings.

    PYTHONPATH=. python results/tuning/h200-2026-11-27-gluon-fwd/compile_fwd.py --head-dim 64 \
        --configs "64,128,4,2,maxnreg=128;128,128,4,2;192,128,4,2"
"""

import argparse
import math

import torch
from triton.runtime import driver

from scripts.kernel_sass import _HopperWithoutGpu, inspect


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--configs", required=True)
    args = parser.parse_args()
    driver.set_active(_HopperWithoutGpu())
    from flashgpt.kernels import launch
    from flashgpt.kernels.tuning import LaunchConfig

    compiled = {}
    launch._launch = lambda kernel, grid, *a, **c: compiled.__setitem__("k", kernel.warmup(*a, grid=grid, **c))
    shape = (1, 1, args.seq_len, args.head_dim)
    q, k, v, o = (torch.empty(shape, dtype=torch.bfloat16) for _ in range(4))
    lse = torch.empty(shape[:3])
    params = launch.AttentionParams(True, 0.0, 1 / math.sqrt(args.head_dim))
    for text in args.configs.split(";"):
        launch.launch_forward_hopper(q, k, v, o, lse, params, LaunchConfig.parse(text))
        info, _ = inspect(compiled["k"].asm["cubin"], compiled["k"].asm["ptx"])
        keys = ("reg", "stack", "HGMMA", "MUFU", "warn")
        print(
            f"D={args.head_dim} {text:28s}",
            {k: info[k] for k in keys},
            "shared",
            compiled["k"].metadata.shared,
            info["warnings"][:2],
        )


if __name__ == "__main__":
    main()
