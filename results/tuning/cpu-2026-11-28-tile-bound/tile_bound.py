"""How close a masked call can come to the dense kernel's rate if every tile it visits costs what a dense tile costs:
for each of bench_masks.py's masks at T = 16K and 64K, the visible pairs over the pairs of the tiles it visits, for
the tiles the Gluon passes run under masks at D = 64 (the forward 64 x 64, the fused backward 64 x 128 without
dropout and 32 x 128 with it), divided by the same ratio for the dense causal call on the dense passes' tiles. That
is a ceiling on bench_masks' effective rate (x_dense) as far as tile granularity sets it; partial tiles (those the
mask cuts, which also pay the per-element mask) are counted apart. CPU only, a few minutes:

    PYTHONPATH=$PWD:$PWD/scripts python results/tuning/cpu-2026-11-28-tile-bound/tile_bound.py --out bound.json
"""

import argparse
import json
import math

import torch
from bench_masks import PATTERNS, TARGET_DENSITY, TOKENS_PER_CALL, causal_rows, mixed_documents

from flashgpt.model.sparsity import BlockSparseConfig, build_block_mask

BLOCK_SIZE = 128
MASKED_TILES = {"forward": (64, 64), "backward": (64, 128), "backward, dropout": (32, 128)}
DENSE_TILES = {"forward": (128, 128), "backward": (64, 128), "backward, dropout": (64, 128)}


def mask_kwargs(name: str, seq_len: int) -> dict:
    if name == "dense":
        return {}
    if name.startswith("window"):
        return {"window_size": {"window_1k": 1024, "window_4k": 4096}[name]}
    if name == "documents":
        return {"document_ids": mixed_documents(max(1, TOKENS_PER_CALL // seq_len), seq_len, "cpu")}
    layout = build_block_mask(BlockSparseConfig(name, density=TARGET_DENSITY), math.ceil(seq_len / BLOCK_SIZE))
    return {"block_mask": layout, "block_size": BLOCK_SIZE}


def tile_counts(seq_len: int, kwargs: dict, tiles: tuple[int, int], chunk: int = 1024) -> dict:
    """Visible pairs, and the tiles (rows x cols) with any visible pair and with some but not all, over the batch."""
    rows, cols = tiles
    visible = visited = partial = 0
    for r0 in range(0, seq_len, chunk):  # rows [r0, r1) of the causal problem
        r1 = min(seq_len, r0 + chunk)
        mask = causal_rows(kwargs, r0, r1, "cpu")[:, 0]  # (B or 1, r1 - r0, r1): one head's, all heads alike
        width = math.ceil(r1 / cols) * cols
        mask = torch.nn.functional.pad(mask, (0, width - r1))
        per_tile = mask.reshape(mask.shape[0], (r1 - r0) // rows, rows, width // cols, cols).sum(dim=(2, 4))
        visible += int(per_tile.sum())
        visited += int((per_tile > 0).sum())
        partial += int(((per_tile > 0) & (per_tile < rows * cols)).sum())
    return {"visible": visible, "visited": visited, "partial": partial}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-lens", default="16384,65536")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    report = []
    for seq_len in map(int, args.seq_lens.split(",")):
        dense = {p: tile_counts(seq_len, {}, t) for p, t in DENSE_TILES.items()}
        dense_use = {p: c["visible"] / (c["visited"] * math.prod(DENSE_TILES[p])) for p, c in dense.items()}
        for name in ("dense", "window_1k", "window_4k", "documents", *PATTERNS):
            kwargs = mask_kwargs(name, seq_len)
            row = {"seq_len": seq_len, "mask": name}
            for kernel_pass, tiles in MASKED_TILES.items():
                counts = tile_counts(seq_len, kwargs, tiles)
                use = counts["visible"] / (counts["visited"] * math.prod(tiles))
                row[kernel_pass] = {
                    "tiles": tiles,
                    "ceiling": round(use / dense_use[kernel_pass], 3),
                    "partial_share": round(counts["partial"] / counts["visited"], 3),
                    **counts,
                }
            report.append(row)
            cells = "  ".join(
                f"{p}: {row[p]['ceiling']:.2f} ({row[p]['partial_share']:.0%} partial)" for p in MASKED_TILES
            )
            print(f"T={seq_len:>6} {name:>12}  {cells}", flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
