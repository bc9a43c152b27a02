"""Same-process A/B of the Gluon dK/dV pass's walk order under block masks: each variant builds its masks with
its own `tile_schedule._long_walks_first` ("tiles-major": no walk counts as long, so every head's key tiles go out
in order, head after head, as before; "long-first": the kept rule), so both run the same kernel and differ only
in the order their programs start. Same inputs, rounds alternating, medians of `do_bench`; the GPU time of each
kernel from torch.profiler. Shapes as `scripts/bench_masks.py`'s (D = 64, H = 12, B = 16K / T, bf16, causal, no
dropout).

    PYTHONPATH=.:scripts python results/tuning/h200-2026-11-27-long-walks/ab_long_walks.py --out ab.json
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
from flashgpt.kernels import tile_schedule

_spec = importlib.util.spec_from_file_location(
    "ab_mask_tiles", Path(__file__).parents[1] / "h200-2026-11-27-mask-tiles" / "ab_mask_tiles.py"
)
tiles = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiles)

KEPT_RULE = tile_schedule._long_walks_first


def tiles_major(counts: torch.Tensor) -> torch.Tensor:
    n_tiles = counts.shape[1]
    return torch.arange(-1, n_tiles, device=counts.device, dtype=torch.int32).clamp(min=0)  # n_long = 0, in order


VARIANTS = {"tiles-major": tiles_major, "long-first": KEPT_RULE}
PLAN = [(4096, ["local_global", "strided", "butterfly"]), (16384, ["local_global", "strided", "butterfly"]),
        (65536, ["local_global", "strided"])]  # fmt: skip


def run_case(seq_len: int, mask: str, rounds: int) -> dict:
    batch = max(1, TOKENS_PER_CALL // seq_len)
    case = build_case(mask, seq_len, batch, tiles.PROFILE)
    gen = torch.Generator(device="cuda").manual_seed(seq_len)
    shape = (batch, HEADS, seq_len, 64)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_() for _ in "qkv")
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    rows, fns, want = {}, {}, None
    for name, rule in VARIANTS.items():
        tile_schedule._long_walks_first = rule  # read when the variant's masks are built, here
        fns[name] = flash_fn(case, 0.0, seq_len, torch.bfloat16)
        tile_schedule._long_walks_first = KEPT_RULE
        got = tiles.outputs(fns[name], q, k, v, grad)
        want = want or got
        rows[name] = {"vs_first": {n: rel_err(got[n], want[n]) for n in got}, "fwd": [], "fwd_bwd": [],
                      "kernels": tiles.kernel_ms(fns[name], q, k, v, grad)}  # fmt: skip
    for _ in range(rounds):
        for name in VARIANTS:
            fwd, both = tiles.measure(fns[name], q, k, v, grad)
            rows[name]["fwd"].append(fwd)
            rows[name]["fwd_bwd"].append(both)
    base = statistics.median(rows["tiles-major"]["fwd_bwd"])
    for name, row in rows.items():
        row["fwd_bwd_ms"] = statistics.median(row["fwd_bwd"])
        row["speedup"] = base / row["fwd_bwd_ms"]
        kernels = " ".join(f"{n.removeprefix('flash_')[:12]}={ms:.3f}" for n, ms in row["kernels"].items())
        print(f"T={seq_len:>6} {mask:>12} {name:>12}: fwd+bwd {row['fwd_bwd_ms']:.3f} ms ({row['speedup']:.3f}x) | "
              f"{kernels} | vs first {max(row['vs_first'].values()):.1e}", flush=True)  # fmt: skip
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
