"""The dense, dropout-free head-dim-64 cases of `scripts/bench_attention.py`'s GPU check, and a ragged causal one
(T = 3000), run through whichever `flashgpt` the path gives: a copy in .ab/ whose table sends them to a
two-warpgroup fused backward. Prints each case; exit status 1 if any fails.

    PYTHONPATH=$PWD/.ab/f2split:$PWD/.ab/f2split/scripts \
        python results/tuning/h200-2026-11-28-fused-reduce/check_paired.py
"""

import json
import sys

import torch
from bench_attention import CheckCase, check_case, gpu_profile

import flashgpt
from flashgpt.kernels import launch


def main() -> int:
    profile = gpu_profile(quick=False, head_dims=())
    cases = [c for c in profile.check_cases if c.head_dim == 64]
    cases.append(CheckCase(2, 12, 3000, 64, causal=True, samples=4))
    failed = 0
    print(f"flashgpt: {flashgpt.__file__}")
    # A copy whose diff did not apply takes the split backward and would pass unseen: require the fused one.
    cuda = torch.device("cuda")
    fused = [launch.backward_schedule_for(64, torch.bfloat16, cuda, True, 0.0, t) for t in (4096, 16384)]
    if fused != ["fused", "fused"]:
        print(f"this copy's table does not send dense D = 64 calls to the fused backward: {fused}")
        return 1
    for case in cases:
        result = check_case(case, profile)
        failed += not result["passed"]
        print(json.dumps({"case": result["case"], "rel_err": result["rel_err"], "passed": result["passed"]}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
