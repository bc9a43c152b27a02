"""Kernel time of each pass against the tiles it visits: dense causal at T = 512..16K (B·T = 16K, so the number of
programs stays 3072) and sliding windows of 256..4K at T = 16K (and 1K at 64K); D = 64, 12 heads, bf16, 64×64 tiles.

    PYTHONPATH=. OUT=<dir> python results/tuning/h100-2026-11-26-one-loop/fixed_cost.py   # writes fixed_cost.json
"""

import json
import math
import os
from pathlib import Path

import torch
import triton

from flashgpt.kernels import flash_mask
from flashgpt.kernels.launch import (
    AttentionParams,
    launch_dkdv,
    launch_dq,
    launch_forward,
    launch_preprocess,
    tuned_config,
)

HEADS, HEAD_DIM, TILE = 12, 64, 64
PRODUCTS = {"fwd": 1.0, "dq": 1.5, "dkdv": 2.0}  # matrix products per tile pair, in units of the forward's two


def bench(seq_len: int, batch: int, window: int | None, rows: list) -> None:
    q, k, v, do = (torch.randn(batch, HEADS, seq_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    params = AttentionParams(True, 0.0, 1 / math.sqrt(HEAD_DIM), seed=1, offset=0)
    o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
    lse = torch.empty(batch, HEADS, seq_len, device="cuda", dtype=torch.float32)
    delta = torch.empty_like(lse)
    masks = None
    if window:
        masks = flash_mask(seq_len, seq_len, head_dim=HEAD_DIM, dtype=torch.bfloat16, window_size=window)
    launch_forward(q, k, v, o, lse, params, tuned_config("fwd", q, params), masks)
    launch_preprocess(o, do, delta)
    cfg = {name: tuned_config(name, q, params) for name in ("fwd", "bwd_dq", "bwd_dkdv")}
    runs = {
        "fwd": lambda: launch_forward(q, k, v, o, lse, params, cfg["fwd"], masks),
        "dq": lambda: launch_dq(q, k, v, do, lse, delta, dq, params, cfg["bwd_dq"], masks),
        "dkdv": lambda: launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, cfg["bwd_dkdv"], masks),
    }
    n = seq_len // TILE
    per_row = [min(i + 1, (window or seq_len) // TILE + 1) for i in range(n)]  # tiles a row of tiles visits
    pairs = batch * HEADS * sum(min(i + 1, window or seq_len) for i in range(seq_len))
    tiles, programs = batch * HEADS * sum(per_row), batch * HEADS * n
    for name, run in runs.items():
        ms = triton.testing.do_bench(run, warmup=20, rep=80, return_mode="median")
        tflops = 4 * pairs * HEAD_DIM * PRODUCTS[name] / ms / 1e9
        rows.append(dict(pass_=name, T=seq_len, B=batch, window=window, ms=ms, programs=programs, tiles=tiles,
                         tflops=tflops))  # fmt: skip
        print(f"{name:5s} T={seq_len:6d} B={batch:3d} win={window} ms={ms:8.4f} programs={programs:6d} "
              f"tiles={tiles:9.0f} tiles/prog={tiles / programs:7.1f} TFLOP/s={tflops:6.1f}", flush=True)  # fmt: skip


def main() -> None:
    rows: list = []
    for seq_len in (512, 1024, 2048, 4096, 8192, 16384):
        bench(seq_len, max(1, 16384 // seq_len), None, rows)
    for window in (256, 512, 1024, 2048, 4096):
        bench(16384, 1, window, rows)
    bench(65536, 1, 1024, rows)
    Path(os.environ.get("OUT", "."), "fixed_cost.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
