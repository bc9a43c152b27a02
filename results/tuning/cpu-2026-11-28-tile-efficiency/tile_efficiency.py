"""How much of the tile area a masked pass computes is pairs the mask keeps: for bench_masks.py's masks at 4K and
16K (B = 16K / T, causal, block_size 128; window 1K at its GPU width), visible pairs / (tiles holding a visible pair
× tile area), for the Gluon passes' tiles under masks (64 × 64; 64 × 128 for the dQ pass under block masks and
windows). A kernel that ran every computed tile at its dense rate would reach this fraction of the dense kernel's
effective rate (whose own fraction is 0.97-0.99), so it bounds bench_masks.py's x_dense from above. CPU only.

    PYTHONPATH=.:scripts python results/tuning/cpu-2026-11-28-tile-efficiency/tile_efficiency.py
"""

import torch
from bench_masks import Profile, build_case

from flashgpt.attention_masks import dense_mask

PROFILE = Profile("cpu", torch.bfloat16, block_size=128, check_seq_len=4096, dropout_check_seq_len=1024)
MASKS = ("dense", "window_1k", "documents", "local_global", "strided", "butterfly")


def visible_fraction(visible: torch.Tensor, row_tile: int, col_tile: int) -> float:
    """Visible pairs over the area of the (row_tile × col_tile) tiles that hold at least one."""
    b, h, t, _ = visible.shape
    counts = visible.view(b, h, t // row_tile, row_tile, t // col_tile, col_tile).sum(dim=(3, 5), dtype=torch.int32)
    return int(visible.sum()) / (int((counts > 0).sum()) * row_tile * col_tile)


def main() -> None:
    torch.manual_seed(0)
    print("| T | mask | pair density | 64 x 64 | 64 x 128 |")
    print("|---|---|---|---|---|")
    for seq_len in (4096, 16384):
        for name in MASKS:
            case = build_case(name, seq_len, max(1, 16384 // seq_len), PROFILE)
            if name == "window_1k":  # the CPU profile narrows windows with T; the GPU runs them at 1024
                case.flash_kwargs["window_size"] = 1024
            visible = dense_mask(seq_len, seq_len, causal=True, device="cpu", **case.flash_kwargs)
            density = int(visible.sum()) / (visible.shape[0] * visible.shape[1] * seq_len * (seq_len + 1) // 2)
            fractions = [visible_fraction(visible, 64, cols) for cols in (64, 128)]
            print(f"| {seq_len} | {name} | {density:.3f} | {fractions[0]:.3f} | {fractions[1]:.3f} |")


if __name__ == "__main__":
    main()
