"""Same-process A/B of the masked Gluon passes' grid order: each variant replaces `launch.heads_fastest` (grids of
(B·H, tiles) instead of (tiles, B·H), `gluon_common.tile_and_head`), on the same inputs, rounds alternating,
medians of `do_bench`; the GPU time of each kernel from torch.profiler. Shapes as `scripts/bench_masks.py`'s (D = 64,
H = 12, B = 16K / T, bf16, causal, no dropout).

    PYTHONPATH=.:scripts python results/tuning/h200-2026-11-27-grid-masks/ab_grid_masks.py --out ab_grid.json
"""

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

import torch
from bench_masks import HEADS, TOKENS_PER_CALL, build_case, flash_fn

from flashgpt.attention_reference import rel_err
from flashgpt.kernels import attention_op, launch, launch_plans

_spec = importlib.util.spec_from_file_location(
    "ab_mask_tiles", Path(__file__).parents[1] / "h200-2026-11-27-mask-tiles" / "ab_mask_tiles.py"
)
tiles = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiles)

VARIANTS = {
    "tiles-major": lambda kernel_pass, masks: False,
    "documents": lambda kernel_pass, masks: masks.document_ids is not None,
    "documents+blocks": lambda kernel_pass, masks: masks.document_ids is not None or masks.block_mask is not None,
    "documents+blocks dK/dV": lambda kernel_pass, masks: (
        masks.document_ids is not None or (masks.block_mask is not None and kernel_pass == "bwd_dkdv_hopper")
    ),
}
PLAN = [(16384, ["documents", "local_global", "strided", "butterfly"]), (65536, ["local_global", "strided"])]


def use(name: str) -> None:
    launch.heads_fastest = VARIANTS[name]
    launch_plans._WITHOUT_TENSOR_MASKS.clear()
    attention_op._BACKWARD_SCHEDULES.clear()


def run_case(seq_len: int, mask: str, rounds: int) -> dict:
    batch = max(1, TOKENS_PER_CALL // seq_len)
    case = build_case(mask, seq_len, batch, tiles.PROFILE)
    gen = torch.Generator(device="cuda").manual_seed(seq_len)
    shape = (batch, HEADS, seq_len, 64)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_() for _ in "qkv")
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    rows, fns, want = {}, {}, None
    for name in VARIANTS:
        use(name)
        fns[name] = flash_fn(case, 0.0, seq_len, torch.bfloat16)
        got = tiles.outputs(fns[name], q, k, v, grad)
        want = want or got
        rows[name] = {"vs_first": {n: rel_err(got[n], want[n]) for n in got}, "fwd": [], "fwd_bwd": [],
                      "kernels": tiles.kernel_ms(fns[name], q, k, v, grad)}  # fmt: skip
    for _ in range(rounds):
        for name in VARIANTS:
            use(name)
            fwd, both = tiles.measure(fns[name], q, k, v, grad)
            rows[name]["fwd"].append(fwd)
            rows[name]["fwd_bwd"].append(both)
    base = statistics.median(rows["tiles-major"]["fwd_bwd"])
    for name, row in rows.items():
        row["fwd_bwd_ms"] = statistics.median(row["fwd_bwd"])
        row["speedup"] = base / row["fwd_bwd_ms"]
        kernels = " ".join(f"{n.removeprefix('flash_')[:12]}={ms:.3f}" for n, ms in row["kernels"].items())
        print(f"T={seq_len:>6} {mask:>12} {name:>24}: fwd+bwd {row['fwd_bwd_ms']:.3f} ms ({row['speedup']:.3f}x) | "
              f"{kernels} | vs first {max(row['vs_first'].values()):.1e}", flush=True)  # fmt: skip
    use("documents")
    return {"seq_len": seq_len, "mask": mask, "variants": rows}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results = []
    for seq_len, masks in PLAN:
        for mask in masks:
            results.append(run_case(seq_len, mask, args.rounds))
            torch.cuda.empty_cache()
            with open(args.out, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
