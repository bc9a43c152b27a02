"""The tables of this folder's README from Nsight Compute's source page (`stalls16k_sass.csv.gz`: one fwd+bwd, dense
then documents, T = 16K, D = 64, B = 1, H = 12):

    python results/tuning/h200-2026-11-29-masked-stalls/stall_summary.py

Per kernel: its executed instructions, the warp-stall reasons of its samples, and its code grouped by how many times
each instruction ran (a loop body's instructions all run the same number of times, so the groups are the main loop,
the masked steps and the per-program code).
"""

import collections
import csv
import gzip
import io
from pathlib import Path

SOURCE = Path(__file__).with_name("stalls16k_sass.csv.gz")
CASES = ("dense", "documents")  # the order ncu_masks.py profiled them in


def kernels() -> list[tuple[str, list[dict]]]:
    """(kernel name, its SASS rows) in launch order: the CSV holds one block per kernel, each with its own header."""
    blocks: list[tuple[str, list[str]]] = []
    with gzip.open(SOURCE, "rt") as source:
        lines = source.read().splitlines()
    for line in lines:
        if line.startswith('"Kernel Name"'):
            blocks.append((line.split(",")[1].strip('"'), []))
        elif blocks and line:
            blocks[-1][1].append(line)
    return [(name, list(csv.DictReader(io.StringIO("\n".join(body))))) for name, body in blocks]


def count(row: dict, column: str) -> int:
    return int(row[column] or 0)


def main() -> None:
    launches = kernels()
    per_case = len(launches) // len(CASES)
    for i, (name, rows) in enumerate(launches):
        samples = sum(count(r, "Warp Stall Sampling (All Samples)") for r in rows)
        executed = sum(count(r, "Instructions Executed") for r in rows)
        print(f"\n{CASES[i // per_case]}: {name}, {executed / 1e6:.1f}M warp instructions, {samples} samples")
        reasons: collections.Counter = collections.Counter()
        for r in rows:
            for column, value in r.items():
                if column.startswith("stall_") and "(Not" not in column:
                    reasons[column] += int(value or 0)
        print("  stalls: " + ", ".join(f"{k[6:]} {100 * v / samples:.0f}%" for k, v in reasons.most_common(6)))
        groups: dict[int, list[dict]] = collections.defaultdict(list)
        for r in rows:
            groups[count(r, "Instructions Executed")].append(r)
        ranked = sorted(groups.items(), key=lambda g: -g[0] * len(g[1]))[:4]
        for runs, members in ranked:
            share = 100 * runs * len(members) / executed
            held = 100 * sum(count(r, "Warp Stall Sampling (All Samples)") for r in members) / samples
            print(f"  {len(members):5d} instructions run {runs:7d} times: {share:4.1f}% of those executed, "
                  f"{held:4.1f}% of samples")  # fmt: skip


if __name__ == "__main__":
    main()
