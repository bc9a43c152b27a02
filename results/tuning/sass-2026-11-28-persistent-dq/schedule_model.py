"""A CPU model of how the Gluon dQ pass's programs fill an H200 under `scripts/bench_masks.py`'s documents mask:
today's grid (one program per query tile, the hardware starting the next program wherever one ends) against a
persistent grid whose programs each take a fixed share of the tiles. It also counts the tile area each pass computes
against the pairs the mask keeps. Nothing here is measured: per-program costs are assumptions, in units of one
64 × 64 tile step, stated with each table.

    python results/tuning/sass-2026-11-28-persistent-dq/schedule_model.py > schedule_model.log
"""

import heapq
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
from bench_masks import mixed_documents

SLOTS = 132 * 2  # SMs x programs an SM holds (maxnreg 128)
HEADS = 12


def query_walks(doc: torch.Tensor, block_m: int, block_n: int) -> list[int]:
    """Key tiles each query tile walks under causal + documents (forward and dQ passes)."""
    walks = []
    for t in range(len(doc) // block_m):
        first, last = t * block_m, (t + 1) * block_m - 1
        lo = int((doc == doc[first]).nonzero()[0])  # the first key of the first row's document
        walks.append(math.ceil((last + 1) / block_n) - lo // block_n)
    return walks


def key_walks(doc: torch.Tensor, block_m: int, block_n: int) -> list[int]:
    """Query tiles each key tile walks under causal + documents (dK/dV pass)."""
    walks = []
    for t in range(len(doc) // block_n):
        first, last = t * block_n, (t + 1) * block_n - 1
        end = int((doc == doc[last]).nonzero()[-1]) + 1  # the end of the last key's document
        walks.append(math.ceil(end / block_m) - first // block_m)
    return walks


def greedy(costs: list[float]) -> float:
    """Makespan when each program starts in launch order on the first free slot (today's grid)."""
    slots = [0.0] * SLOTS
    for cost in costs:
        heapq.heappush(slots, heapq.heappop(slots) + cost)
    return max(slots)


def dealt(costs: list[float], zigzag: bool) -> float:
    """Makespan of a persistent grid of SLOTS programs, item i going to program i mod SLOTS (zigzag: rounds dealt
    forward, then backward)."""
    loads = [0.0] * SLOTS
    for i, cost in enumerate(costs):
        r, k = divmod(i, SLOTS)
        loads[SLOTS - 1 - k if zigzag and r % 2 else k] += cost
    return max(loads)


def launch_order(walks: list[int]) -> list[int]:
    """Today's dQ launch order under documents: heads fastest, query tiles from the last."""
    return [walks[t] for t in reversed(range(len(walks))) for _ in range(HEADS)]


def main() -> None:
    print("## Tile area computed / pairs the documents mask keeps (dense causal dQ, 64 x 128: 1.01-1.03)\n")
    for seq_len in (4096, 16384):
        for seed in range(3):
            doc = mixed_documents(1, seq_len, "cpu", seed)[0]
            kept = int(((doc[:, None] == doc[None, :]) & torch.ones(seq_len, seq_len, dtype=torch.bool).tril()).sum())
            cells = []
            passes = (
                ("fwd/dQ 64x64", 64, 64, query_walks),
                ("fwd/dQ 64x128", 64, 128, query_walks),
                ("fwd 192x128", 192, 128, query_walks),
                ("dK/dV 64x64", 64, 64, key_walks),
            )
            for name, m, n, walks in passes:
                cells.append(f"{name} {sum(walks(doc, m, n)) * m * n / kept:.2f}")
            density = kept / (seq_len * (seq_len + 1) / 2)
            print(f"T={seq_len} seed {seed} (density {density:.2f}): " + ", ".join(cells))

    print("\n## dQ pass, dense causal (64 x 128 tiles, B = 16K / T, H = 12, 264 program slots). Today's grid")
    print("launches each head's tiles from the last (longest first), head after head; the persistent one deals")
    print("items heads fastest, tiles from the last (longest first across all heads). Costs as below.\n")
    for seq_len in (1024, 4096, 16384):
        heads, n_tiles = max(1, 16384 // seq_len) * HEADS, seq_len // 64
        walks = [(t * 64 + 64 + 127) // 128 for t in reversed(range(n_tiles))]
        today = [2.0 + w for _ in range(heads) for w in walks]
        persistent = [0.5 + w for w in walks for _ in range(heads)]
        head_after_head = [0.5 + w for _ in range(heads) for w in walks]
        print(
            f"T={seq_len}: today {greedy(today):.0f} (ideal {sum(today) / SLOTS:.0f}) | persistent, heads fastest "
            f"dealt {dealt(persistent, False):.0f}, zigzag {dealt(persistent, True):.0f}; head after head zigzag "
            f"{dealt(head_after_head, True):.0f} (ideal {sum(persistent) / SLOTS:.0f})"
        )

    print("\n## dQ pass under documents (64 x 64 tiles, B = 16K / T, H = 12, 264 program slots)")
    print("today: each program costs 2 + its walk (setup, fill, drain, store not hidden);")
    print("persistent: 0.5 + its walk (the next item's loads run during this one's walk)\n")
    for seq_len in (4096, 16384):
        for seed in range(3):
            docs = mixed_documents(max(1, 16384 // seq_len), seq_len, "cpu", seed)
            walks = [w for row in docs for w in launch_order(query_walks(row, 64, 64))]
            today = [2.0 + w for w in walks]
            persistent = [0.5 + w for w in walks]
            longest_first = sorted(persistent, reverse=True)
            print(
                f"T={seq_len} seed {seed}: today {greedy(today):.0f} (ideal {sum(today) / SLOTS:.0f}) | persistent, "
                f"today's order dealt {dealt(persistent, False):.0f}, zigzag {dealt(persistent, True):.0f}; "
                f"longest first zigzag {dealt(longest_first, True):.0f}, taken from a shared counter "
                f"{greedy(longest_first):.0f} (ideal {sum(persistent) / SLOTS:.0f})"
            )


if __name__ == "__main__":
    main()
