"""Same-process A/B of several copies of kernels/: the forward, dQ, split dK/dV and fused dK/dV passes, each copy at
the tuned launch configuration, on the inputs and masks of scripts/bench_masks.py (B·T = 16K, 12 heads, D = 64).

    mkdir -p .ab/head && git archive 2ab40e7 kernels | tar -x -C .ab/head
    PYTHONPATH=.:scripts OUT=<dir> python results/tuning/h100-2026-11-26-one-loop/ab_multi.py \
        head=.ab/head/kernels new=.

A copy "." is the working tree's. CASES=all|dense|masked picks the cases, KINDS the passes, ROUNDS the interleaved
rounds (median of each). Prints one line per case and pass; writes $OUT/ab_multi.json.
"""

import json
import math
import os
import statistics
import sys
from pathlib import Path
from types import ModuleType

import bench_masks as bm  # a script: scripts/ is on PYTHONPATH, as pytest puts it
import torch
import triton

from flashgpt.kernel_copies import load_launch
from flashgpt.kernels import flash_mask
from flashgpt.kernels import launch as current

HEADS, HEAD_DIM = 12, 64
MASKS_16K = ("window_1k", "window_4k", "documents", "local_global", "strided", "butterfly")
CASE_SETS = {
    "all": [("dense", t, p) for t in (1024, 4096, 16384) for p in (0.0, 0.1)]
    + [(m, 16384, p) for m in MASKS_16K for p in (0.0, 0.1)]
    + [(m, 4096, 0.0) for m in ("window_1k", "documents", "local_global", "strided", "butterfly")]
    + [("window_1k", 65536, 0.0), ("documents", 65536, 0.0), ("local_global", 65536, 0.0)],
    "dense": [("dense", t, p) for t in (1024, 4096, 16384) for p in (0.0, 0.1)],
    "masked": [("dense", 1024, 0.0), ("dense", 16384, 0.0), ("documents", 16384, 0.1), ("window_1k", 16384, 0.1)]
    + [(m, t, 0.0) for t in (4096, 16384) for m in MASKS_16K]
    + [(m, 65536, 0.0) for m in ("window_1k", "documents", "local_global")],
}


def load(name: str, directory: str) -> ModuleType:
    """The `launch` module of the kernel package in directory ("." : the working tree's)."""
    return current if directory == "." else load_launch(directory, name)


def passes(launch: ModuleType, q, k, v, do, lse, delta, params, masks, block_size) -> tuple[dict, tuple]:
    """Closures running each pass with this copy's launch functions, and the tensors they write."""
    dk, dv, o, dq = (torch.empty_like(t) for t in (k, v, q, q))
    dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    lse_out = torch.empty_like(lse)

    def cfg(kernel_pass: str):
        return current.tuned_config(kernel_pass, q, params, block_size=block_size)

    def fused() -> None:
        dq_acc.zero_()
        launch.launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, cfg("bwd_fused"), masks, dq_acc=dq_acc,
                           dq_reduce="tma")  # fmt: skip

    runs = {
        "fwd": lambda: launch.launch_forward(q, k, v, o, lse_out, params, cfg("fwd"), masks),
        "dq": lambda: launch.launch_dq(q, k, v, do, lse, delta, dq, params, cfg("bwd_dq"), masks),
        "split": lambda: launch.launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, cfg("bwd_dkdv"), masks),
        "fused": fused,
    }
    return runs, (dk, dv, dq_acc, o, lse_out, dq)


def main() -> None:
    copies = dict(arg.split("=") for arg in sys.argv[1:])
    launches = {name: load(f"ab_{name}", directory) for name, directory in copies.items()}
    kinds = os.environ.get("KINDS", "fwd,dq,split,fused").split(",")
    rounds = int(os.environ.get("ROUNDS", "3"))
    profile = bm.Profile("cuda", torch.bfloat16, 128, 4096, 1024)
    rows = []
    for mask, seq_len, p in CASE_SETS[os.environ.get("CASES", "all")]:
        batch = max(1, 16384 // seq_len)
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(batch, HEADS, seq_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
                       for _ in range(4))  # fmt: skip
        params = current.AttentionParams(True, p, 1 / math.sqrt(HEAD_DIM), seed=7, offset=0)
        case = bm.build_case(mask, seq_len, batch, profile) if mask != "dense" else None
        kwargs = case.flash_kwargs if case else {}
        masks = None
        if case:
            masks = flash_mask(seq_len, seq_len, head_dim=HEAD_DIM, dtype=torch.bfloat16, dropout_p=p, **kwargs)
        block_size = kwargs.get("block_size") if "block_mask" in kwargs else None
        o = torch.empty_like(q)
        lse = torch.empty(batch, HEADS, seq_len, device="cuda", dtype=torch.float32)
        delta = torch.empty_like(lse)
        forward_cfg = current.tuned_config("fwd", q, params, block_size=block_size)
        current.launch_forward(q, k, v, o, lse, params, forward_cfg, masks)
        current.launch_preprocess(o, do, delta)
        runs, outputs = {}, {}
        for name, launch in launches.items():
            closures, outputs[name] = passes(launch, q, k, v, do, lse, delta, params, masks, block_size)
            runs.update({(name, kind): run for kind, run in closures.items() if kind in kinds})
        for run in runs.values():
            run()
        torch.cuda.synchronize()
        first = next(iter(outputs.values()))
        err = {name: max(torch.nan_to_num((a.float() - b.float()).abs(), nan=1e9).max().item()
                         for a, b in zip(out, first, strict=True)) for name, out in outputs.items()}  # fmt: skip
        times: dict = {key: [] for key in runs}
        for _ in range(rounds):
            for key, run in runs.items():
                times[key].append(triton.testing.do_bench(run, warmup=10, rep=40, return_mode="median"))
        for kind in kinds:
            base = statistics.median(times[(next(iter(launches)), kind)])
            line = f"{mask:12s} T={seq_len:6d} p={p} {kind:5s}"
            for name in launches:
                ms = statistics.median(times[(name, kind)])
                rows.append(dict(mask=mask, T=seq_len, dropout=p, kind=kind, variant=name, ms=ms, speed=base / ms,
                                 err=err[name]))  # fmt: skip
                line += f" | {name} {ms:7.4f} ms {base / ms:5.3f}x"
            print(line, " err", {name: f"{e:.1e}" for name, e in err.items()}, flush=True)
    Path(os.environ.get("OUT", "."), "ab_multi.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
