"""Where a Gluon forward program's time goes, from %globaltimer stamps each program writes (a patched build:
trace.diff adds a Trace argument to the Gluon forward). Per program: start, SM, Q landed (as its first math
warpgroup sees it), walk done, O and LSE stored, and the walk's length in key tiles.

    PYTHONPATH=.:scripts python results/tuning/h200-2026-11-29-fwd-program-trace/trace_forward.py --out trace.json
"""

import argparse
import json
import statistics

import torch
from bench_masks import HEAD_DIM, HEADS, TOKENS_PER_CALL, Profile, build_case, flash_fn

from flashgpt.kernels import launch, launch_plans

FIELDS = ("start", "sm", "q", "unused", "walk", "stored", "unused2", "steps")


def trace_case(mask: str, seq_len: int) -> dict:
    batch = max(1, TOKENS_PER_CALL // seq_len)
    case = build_case(mask, seq_len, batch, Profile("cuda", torch.bfloat16, 128, 4096, 1024))
    fn = flash_fn(case, 0.0, seq_len, torch.bfloat16)
    q, k, v = (torch.randn(batch, HEADS, seq_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for _ in range(5):
        fn(q, k, v)
    torch.cuda.synchronize()
    launch.TRACE.zero_()
    fn(q, k, v)
    torch.cuda.synchronize()
    t = launch.TRACE.view(-1, 8).cpu()
    t = t[t[:, 0] > 0]
    if not len(t):
        print("  the Triton forward took this call")
        return {"summary": {"mask": mask, "seq_len": seq_len, "gluon": False}}
    t0 = int(t[:, 0].min())
    rows = [dict(zip(FIELDS, r, strict=True)) for r in t.tolist()]
    for r in rows:
        for f in ("start", "q", "walk", "stored"):
            r[f] = (r[f] - t0) / 1e3  # µs from the kernel's first program
    end = max(r["stored"] for r in rows)
    n_sms = len({r["sm"] for r in rows})
    busy = sum(r["stored"] - r["start"] for r in rows)
    step_us = [(r["walk"] - r["q"]) / r["steps"] for r in rows if r["steps"] > 4]
    med_step = statistics.median(step_us)

    def med(f):
        return statistics.median(f(r) for r in rows)

    summary = {
        "mask": mask, "seq_len": seq_len, "batch": batch, "programs": len(rows), "sms": n_sms, "kernel_us": end,
        "mean_steps": sum(r["steps"] for r in rows) / len(rows), "median_step_us": med_step,
        "start to Q landed (us)": med(lambda r: r["q"] - r["start"]),
        "walk (us)": med(lambda r: r["walk"] - r["q"]),
        "walk done to O stored (us)": med(lambda r: r["stored"] - r["walk"]),
        "programs per SM at once": busy / (n_sms * end),
        "fixed per program, in steps (span - walk)": med(lambda r: (r["stored"] - r["start"]) / med_step - r["steps"]),
    }  # fmt: skip
    for key, value in summary.items():
        print(f"  {key:>42}: {value:.3f}" if isinstance(value, float) else f"  {key:>42}: {value}")
    return {"summary": summary, "programs": rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    cases = "dense:4096,dense:16384,documents:16384,documents:65536,window_1k:16384,strided:16384"
    parser.add_argument("--cases", default=cases, help="mask:T, comma-separated")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    launch_plans.ENABLED = False  # TRACE is read at each launch
    launch.TRACE = torch.zeros(65536 * 8, dtype=torch.int64, device="cuda")
    results = []
    for spec in args.cases.split(","):
        mask, seq_len = spec.split(":")
        print(f"{mask} T={seq_len}", flush=True)
        results.append(trace_case(mask, int(seq_len)))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "results": results}, f)


if __name__ == "__main__":
    main()
