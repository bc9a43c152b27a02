"""Nsight Compute's warp-stall samples of the fused backward, summed by warp role and stall reason, from the
per-instruction source pages `run_stall_sampling.sh` wrote (source_<build>_<mask>.csv.gz). A role is told by how
often its instructions run in one launch (dense 16K: 1536 programs): a math warpgroup's step 780,288 times (two
warpgroups × four warps × 127 steps a program), the dQ warpgroup's step 792,576 (four warps × 129), the producer's
tile loop 198,144 (one warp × 129). Then the instructions each role stalls on most.

    python results/tuning/h200-2026-11-29-persistent-profile/stalls_by_role.py
"""

import collections
import csv
import gzip
from pathlib import Path

HERE = Path(__file__).parent
ROLES = {780288: "math step", 792576: "dQ step", 198144: "producer tile"}
REASONS = ("long_sb", "mio", "short_sb", "wait", "barrier", "selected", "not_selected", "dispatch")


def load(name: str) -> tuple[dict, list]:
    with gzip.open(HERE / f"source_{name}.csv.gz", "rt") as f:
        rows = list(csv.reader(f))
    header, data = rows[1], rows[2:]  # rows[0] names the kernel
    return {h: i for i, h in enumerate(header)}, data


def number(row: list, index: int) -> float:
    return float(row[index].replace(",", "") or 0)


def main() -> None:
    for name in ("baseline_dense", "one_item_dense"):
        ix, data = load(name)
        roles: dict = collections.defaultdict(collections.Counter)
        for row in data:
            role = ROLES.get(int(number(row, ix["Instructions Executed"])), "other")
            roles[role]["all"] += number(row, ix["Warp Stall Sampling (All Samples)"])
            for reason in REASONS:
                roles[role][reason] += number(row, ix[f"stall_{reason}"])
        print(f"== {name}: samples by role")
        for role, c in sorted(roles.items(), key=lambda kv: -kv[1]["all"]):
            print(f"  {role:14} all {c['all']:7.0f}  " + "  ".join(f"{r} {c[r]:6.0f}" for r in REASONS))
        print("  the math and dQ steps' five most-stalled instructions:")
        hot = [r for r in data if int(number(r, ix["Instructions Executed"])) in (780288, 792576)]
        for row in sorted(hot, key=lambda r: -number(r, ix["Warp Stall Sampling (All Samples)"]))[:5]:
            print(f"    {number(row, ix['Warp Stall Sampling (All Samples)']):7.0f}  {row[1].strip()[:70]}")


if __name__ == "__main__":
    main()
