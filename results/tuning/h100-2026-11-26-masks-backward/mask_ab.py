"""Masked fwd+bwd under backward variants in one process: the tuned split backward, the fused one, and other tiles.

    PYTHONPATH=.:scripts OUT=<dir> python results/tuning/h100-2026-11-26-masks-backward/mask_ab.py \
        T,... MASK,... VARIANT,...

Each variant patches `launch.config_for` (tiles per pass) and `attention_op.backward_schedule_for`; the masks,
shapes and timing are scripts/bench_masks.py's. Writes $OUT/mask_ab.json.
"""

import json
import os
import sys
from pathlib import Path

import bench_masks as bm  # a script: scripts/ is on PYTHONPATH, as pytest puts it
import torch

from flashgpt.kernels import attention_op, launch
from flashgpt.kernels.tuning import LaunchConfig

TUNED_CONFIG_FOR = launch.config_for
VARIANTS = {  # name: (tiles per pass, backward schedule)
    "split": ({}, "split"),
    "fused": ({}, "fused"),
    "split_dkdv128x64_dq64x128": ({"bwd_dkdv": "128,64,8,2,tma", "bwd_dq": "64,128,8,2,tma"}, "split"),
    "split_dkdv64x128": ({"bwd_dkdv": "64,128,8,2,tma"}, "split"),
    "fwd128x64": ({"fwd": "128,64,8,2,tma"}, "split"),
}


def use(name: str) -> None:
    overrides, schedule = VARIANTS[name]

    def config_for(kernel_pass: str, *args: object, **kwargs: object) -> LaunchConfig:
        if kernel_pass in overrides:
            return LaunchConfig.parse(overrides[kernel_pass])
        return TUNED_CONFIG_FOR(kernel_pass, *args, **kwargs)

    launch.config_for = config_for
    attention_op.backward_schedule_for = lambda *args, **kwargs: schedule


def main() -> None:
    seq_lens = [int(t) for t in sys.argv[1].split(",")]
    masks, variants = sys.argv[2].split(","), sys.argv[3].split(",")
    profile = bm.Profile("cuda", torch.bfloat16, 128, 4096, 1024)
    rows = []
    for seq_len in seq_lens:
        batch = max(1, bm.TOKENS_PER_CALL // seq_len)
        for mask in masks:
            case = bm.build_case(mask, seq_len, batch, profile)
            for rep in range(2):
                for variant in variants:
                    use(variant)
                    row = bm.Row(mask, variant, seq_len, batch, 0.0, case.density, case.visible_pairs)
                    bm.bench_row(row, lambda c=case, t=seq_len: bm.flash_fn(c, 0.0, t, torch.bfloat16), profile)
                    rows.append(row.__dict__ | {"rep": rep})
    Path(os.environ["OUT"], "mask_ab.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
