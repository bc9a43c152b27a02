"""The dense, dropout-free head-dim-64 cases of `scripts/bench_attention.py`'s GPU check, and a ragged causal one
(T = 3000), run through whichever `flashgpt` the path gives: a copy in .ab/ whose table sends them to a
two-warpgroup fused backward. Prints each case; exit status 1 if any fails.

    PYTHONPATH=$PWD/.ab/f2split:$PWD/.ab/f2split/scripts \
        python results/tuning/h200-2026-11-28-fused-reduce/check_paired.py
"""

import json
import sys

from bench_attention import CheckCase, check_case, gpu_profile

import flashgpt


def main() -> int:
    profile = gpu_profile(quick=False, head_dims=())
    cases = [c for c in profile.check_cases if c.head_dim == 64]
    cases.append(CheckCase(2, 12, 3000, 64, causal=True, samples=4))
    failed = 0
    print(f"flashgpt: {flashgpt.__file__}")
    for case in cases:
        result = check_case(case, profile)
        failed += not result["passed"]
        print(json.dumps({"case": result["case"], "rel_err": result["rel_err"], "passed": result["passed"]}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
