"""What our dense kernel would take for the walks a mask leaves: the ceiling on a masked call's x_dense.

`bench_masks.py`'s x_dense compares a masked call's rate on the pairs it keeps with our dense causal kernel's at the
same T. But a mask cuts the work into short walks (a program's run of tiles along one query or key tile): at 16K,
documents of a few hundred to a few thousand tokens leave walks of that length, where dense causal at 16K walks up
to 16K. Each walk pays fixed costs (its program's start, its first tile, its last store) that a long walk spreads
thin, so even the dense kernel runs short walks slower. This prices every walk of a mask at what our dense kernel
takes, with no mask at all, per tile on walks that long:

    walk cost     non-causal dense attention at T = n · block_size (every program walks exactly n tiles), forward
                  and backward timed apart on the GPU with the host out of the picture, B = 16K / T; per tile
                  p(n) = time / (B · H · n²), interpolated in log n between the measured n = 1, 2, 4, ...
    ceiling       Σ over the mask's query walks n · p_fwd(n) + Σ over its key walks n · p_bwd(n), at block_size
                  granularity (a partly visible block counts whole): the time a masked kernel takes if it runs
                  every kept tile at the dense kernel's mask-free rate for walks that long
    x_ceiling     (visible pairs / ceiling) / (dense causal pairs / dense causal time), at the same T
    x_dense_gpu   the masked call's own ratio from GPU times (as bench_masks.py's), in the same process

x_dense_gpu / x_ceiling is how close a masked call comes to the dense kernel on the same walks; an x_dense target
above x_ceiling asks the masked kernel to run short walks faster than the dense kernel runs them.

    python scripts/bench_mask_walks.py --out $OUT                       # GPU: T = 4K, 16K, 64K, every mask
    python scripts/bench_mask_walks.py --seq-lens 16384 --masks documents,window_1k
    python scripts/bench_mask_walks.py --dropout 0.1 --out $OUT         # every call with dropout
"""

from __future__ import annotations

import argparse
import datetime
import functools
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from bench_masks import (
    HEAD_DIM,
    HEADS,
    MASKS,
    SEQ_LENS,
    TOKENS_PER_CALL,
    MaskCase,
    Profile,
    build_case,
    causal_rows,
    flash_fn,
    out_path,
)
from torch import Tensor

from flashgpt.command_line import command_line, csv_list, write_json
from flashgpt.gpu_timing import gpu_ms_per_call

BLOCK = 128
CALLS = 20
ROW_CHUNK = 4096


def block_occupancy(case: MaskCase, seq_len: int, block: int, device: str) -> Tensor:
    """(B or 1, H or 1, T / block, T / block) bool: which block × block tiles of the causal T × T attention hold a
    visible pair under the case's masks (T a multiple of block)."""
    n = seq_len // block
    occupancy = None
    for r0 in range(0, seq_len, ROW_CHUNK):
        r1 = min(seq_len, r0 + ROW_CHUNK)
        rows = causal_rows(case.flash_kwargs, r0, r1, device)  # (B|1, H|1, r1 − r0, r1)
        tiles = rows.unflatten(-2, (-1, block)).unflatten(-1, (-1, block)).any(-1).any(-2)
        if occupancy is None:
            occupancy = torch.zeros(*tiles.shape[:2], n, n, dtype=torch.bool, device=device)
        occupancy[..., r0 // block : r1 // block, : r1 // block] = tiles
    return occupancy


def walk_lengths(occupancy: Tensor, batch: int, heads: int) -> tuple[Tensor, Tensor]:
    """The lengths (in tiles) of every query walk (a query block's kept key blocks) and every key walk, over all
    (b, h): occupancy broadcast over a batch or heads it does not have. Walks of length 0 are left out."""
    copies = (batch // occupancy.shape[0]) * (heads // occupancy.shape[1])
    query = occupancy.sum(-1).flatten().cpu().repeat(copies)
    key = occupancy.sum(-2).flatten().cpu().repeat(copies)
    return query[query > 0], key[key > 0]


def per_tile_cost(lengths: Tensor, measured: dict[int, float]) -> Tensor:
    """ms a tile on walks of each length, from the measured {n: ms a tile}, linear in (log n, log ms) between the
    measured n and flat past either end."""
    ns = sorted(measured)
    log_n = torch.tensor([math.log(n) for n in ns], dtype=torch.float64)
    log_ms = torch.tensor([math.log(measured[n]) for n in ns], dtype=torch.float64)
    x = lengths.double().log().clamp(log_n[0], log_n[-1])
    right = torch.searchsorted(log_n, x).clamp(1, len(ns) - 1)
    left = right - 1
    t = (x - log_n[left]) / (log_n[right] - log_n[left])
    return (log_ms[left] + t * (log_ms[right] - log_ms[left])).exp()


def ceiling_ms(walks: Tensor, cost: dict[int, float]) -> float:
    """Σ n · p(n) over walks of n tiles: the forward's over the query walks, the backward's over the key walks."""
    return float((walks.double() * per_tile_cost(walks, cost)).sum())


def _gpu_ms(fn, seq_len: int, batch: int) -> tuple[float, float]:
    """(fwd, fwd+bwd) GPU ms of one call of fn on fresh bf16 inputs (B, H, T, D)."""
    shape = (batch, HEADS, seq_len, HEAD_DIM)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad_out = torch.randn_like(q)

    def fwd_bwd() -> None:
        fn(q, k, v).backward(grad_out)
        q.grad = k.grad = v.grad = None

    fwd_bwd()  # compilation and launch plans stay out of the timing
    fwd, both = gpu_ms_per_call(lambda: fn(q, k, v), CALLS), gpu_ms_per_call(fwd_bwd, CALLS)
    if fwd is None or both is None:
        raise RuntimeError(f"the GPU time of T={seq_len} could not be isolated from the host's")
    return fwd, both


def walk_costs(max_seq_len: int, dropout: float) -> dict[str, dict[int, float]]:
    """{"fwd"|"bwd": {n: ms a tile}} of non-causal dense attention at T = n · BLOCK, n = 1, 2, 4, ... up to
    max_seq_len / BLOCK, B = 16K / T."""
    from flashgpt.kernels import flash_attention

    costs: dict[str, dict[int, float]] = {"fwd": {}, "bwd": {}}
    n = 1
    while n * BLOCK <= max_seq_len:
        seq_len = n * BLOCK
        batch = max(1, TOKENS_PER_CALL // seq_len)
        attend = functools.partial(flash_attention, causal=False, dropout_p=dropout)
        fwd, both = _gpu_ms(attend, seq_len, batch)
        tiles = batch * HEADS * n * n
        costs["fwd"][n], costs["bwd"][n] = fwd / tiles, (both - fwd) / tiles
        print(f"non-causal T={seq_len:>6}: fwd {fwd:.3f} ms, bwd {both - fwd:.3f} ms ({batch} x {HEADS} heads)")
        n *= 2
    return costs


def bench_seq_len(seq_len: int, masks: Sequence[str], costs: dict, dropout: float, profile: Profile) -> list[dict]:
    batch = max(1, TOKENS_PER_CALL // seq_len)
    dense = build_case("dense", seq_len, batch, profile)
    _, dense_ms = _gpu_ms(flash_fn(dense, dropout, seq_len, torch.bfloat16), seq_len, batch)
    dense_rate = dense.visible_pairs / dense_ms
    rows = []
    for name in masks:
        case = dense if name == "dense" else build_case(name, seq_len, batch, profile)
        fwd_ms, masked_ms = _gpu_ms(flash_fn(case, dropout, seq_len, torch.bfloat16), seq_len, batch)
        query_walks, key_walks = walk_lengths(block_occupancy(case, seq_len, BLOCK, "cuda"), batch, HEADS)
        ceiling_fwd, ceiling_bwd = ceiling_ms(query_walks, costs["fwd"]), ceiling_ms(key_walks, costs["bwd"])
        ceiling = ceiling_fwd + ceiling_bwd
        row = {
            "seq_len": seq_len,
            "mask": name,
            "dropout": dropout,
            "density": case.density,
            "gpu_ms": masked_ms,
            "fwd_gpu_ms": fwd_ms,
            "ceiling_ms": ceiling,
            "ceiling_fwd_ms": ceiling_fwd,
            "mean_key_walk": float(key_walks.double().mean()),
            "x_dense_gpu": case.visible_pairs / masked_ms / dense_rate,
            "x_ceiling": case.visible_pairs / ceiling / dense_rate,
        }
        # How close each pass comes to its own ceiling (the backward's time: fwd+bwd − fwd).
        row["of_ceiling"] = row["x_dense_gpu"] / row["x_ceiling"]
        row["of_ceiling_fwd"] = ceiling_fwd / fwd_ms
        row["of_ceiling_bwd"] = ceiling_bwd / (masked_ms - fwd_ms)
        rows.append(row)
        print(
            f"T={seq_len:>6} {name:>12}: {masked_ms:.3f} ms (ceiling {ceiling:.3f} ms, mean key walk "
            f"{row['mean_key_walk']:.1f} tiles), x_dense_gpu {row['x_dense_gpu']:.2f}, x_ceiling "
            f"{row['x_ceiling']:.2f} (fwd {row['of_ceiling_fwd']:.2f}, bwd {row['of_ceiling_bwd']:.2f} of theirs)",
            flush=True,
        )
    return rows


def markdown_table(rows: Sequence[dict]) -> str:
    header = ["T", "mask", "density", "mean key walk (tiles)", "GPU ms", "ceiling ms", "x dense (GPU)", "x ceiling",
              "of ceiling (fwd / bwd)"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [str(r["seq_len"]), r["mask"], f"{r['density']:.3f}", f"{r['mean_key_walk']:.1f}",
                 f"{r['gpu_ms']:.3f}", f"{r['ceiling_ms']:.3f}", f"{r['x_dense_gpu']:.2f}", f"{r['x_ceiling']:.2f}",
                 f"{r['of_ceiling']:.2f} ({r['of_ceiling_fwd']:.2f} / {r['of_ceiling_bwd']:.2f})"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", type=csv_list(int), default=list(SEQ_LENS), help="comma-separated")
    parser.add_argument("--masks", type=csv_list(str), default=list(MASKS), help=f"from {','.join(MASKS)}")
    parser.add_argument("--dropout", type=float, default=0.0, help="for the masked calls, dense ones and walks alike")
    parser.add_argument("--out", type=Path, help="JSON path or folder (default results/bench_masks)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_mask_walks.py times kernels on a CUDA GPU; none is visible")
    if unknown := sorted(set(args.masks) - set(MASKS)):
        raise SystemExit(f"unknown masks {unknown}; choose from {', '.join(MASKS)}")
    if bad := [t for t in args.seq_lens if t % BLOCK]:
        raise SystemExit(f"--seq-lens must be multiples of {BLOCK}: {bad}")
    import triton

    profile = Profile("cuda", torch.bfloat16, block_size=BLOCK, check_seq_len=4096, dropout_check_seq_len=1024)
    device = torch.cuda.get_device_name(0)
    date = datetime.date.today().isoformat()
    costs = walk_costs(max(args.seq_lens), args.dropout)
    rows = [row for t in args.seq_lens for row in bench_seq_len(t, args.masks, costs, args.dropout, profile)]
    report = {
        "device": device,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": date,
        "command": command_line("bench_mask_walks.py", argv),
        "shape": {"heads": HEADS, "head_dim": HEAD_DIM, "tokens_per_call": TOKENS_PER_CALL, "dtype": "bfloat16"},
        "block": BLOCK,
        "walk_cost_ms_per_tile": {k: {str(n): ms for n, ms in v.items()} for k, v in costs.items()},
        "rows": rows,
    }
    path = out_path(args.out, device, date)
    if args.out is None or args.out.is_dir():
        path = path.with_name(path.stem + ("-walks-dropout.json" if args.dropout else "-walks.json"))
    write_json(path, report)
    print("\n" + markdown_table(rows) + f"\n\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
