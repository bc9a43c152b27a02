"""Where a fused-backward program's time goes, from %globaltimer stamps each program writes (a patched build:
trace.diff adds a Trace argument to the Gluon fused backward). Per program: start, SM, K/V landed, first (peeled)
step done, walk done, dK/dV stored, the dQ warpgroup's last reduce-add sent, and the walk's length in steps.

    PYTHONPATH=.:scripts python results/tuning/h200-2026-11-29-bwd-program-trace/trace_programs.py --out trace.json
"""

import argparse
import itertools
import json
import statistics

import torch
from bench_masks import HEAD_DIM, HEADS, TOKENS_PER_CALL, Profile, build_case, flash_fn

from flashgpt.kernels import launch, launch_plans

FIELDS = ("start", "sm", "kv", "first", "walk", "stored", "dq_end", "steps")


def trace_case(mask: str, seq_len: int) -> dict:
    batch = max(1, TOKENS_PER_CALL // seq_len)
    case = build_case(mask, seq_len, batch, Profile("cuda", torch.bfloat16, 128, 4096, 1024))
    fn = flash_fn(case, 0.0, seq_len, torch.bfloat16)
    q, k, v = (torch.randn(batch, HEADS, seq_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))  # fmt: skip
    do = torch.randn_like(q)
    o = fn(q, k, v)
    for _ in range(5):
        torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    torch.cuda.synchronize()
    launch.TRACE.zero_()
    torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    torch.cuda.synchronize()
    t = launch.TRACE.view(-1, 8).cpu()
    t = t[t[:, 0] > 0]
    t0 = int(t[:, 0].min())
    rows = [dict(zip(FIELDS, r, strict=True)) for r in t.tolist()]
    for r in rows:
        for f in ("start", "kv", "first", "walk", "stored", "dq_end"):
            r[f] = (r[f] - t0) / 1e3 if r[f] else None  # µs from the kernel's first program
    end = max(max(r["stored"], r["dq_end"] or 0) for r in rows)
    per_sm: dict[int, list] = {}
    for r in rows:
        per_sm.setdefault(r["sm"], []).append(r)
    gaps, busy = [], 0.0
    for progs in per_sm.values():
        progs.sort(key=lambda r: r["start"])
        for a, b in itertools.pairwise(progs):
            gaps.append(b["start"] - max(a["stored"], a["dq_end"] or 0))
        busy += sum(max(r["stored"], r["dq_end"] or 0) - r["start"] for r in progs)
    step_us = [(r["walk"] - r["first"]) / (r["steps"] - 1) for r in rows if r["steps"] > 4]
    med_step = statistics.median(step_us)
    steps_total = sum(r["steps"] for r in rows)
    n_sms = len(per_sm)

    def med(f):
        return statistics.median(f(r) for r in rows)

    summary = {
        "mask": mask, "seq_len": seq_len, "batch": batch, "programs": len(rows), "sms": n_sms,
        "kernel_us": end, "mean_steps": steps_total / len(rows), "median_step_us": med_step,
        "prologue_us (start to K/V landed)": med(lambda r: r["kv"] - r["start"]),
        "first_step_us": med(lambda r: r["first"] - r["kv"]),
        "epilogue_us (walk done to dK/dV stored)": med(lambda r: r["stored"] - r["walk"]),
        "dq_tail_us (walk done to dQ sent)": med(lambda r: (r["dq_end"] or r["walk"]) - r["walk"]),
        "gap_us between programs on an SM (median)": statistics.median(gaps) if gaps else None,
        "programs per SM at once (busy time / SM time)": busy / (n_sms * end),
        "steady steps' share of SM time": steps_total * med_step / (n_sms * end),
        "fixed per program, in steps (span - walk)": med(
            lambda r: (max(r["stored"], r["dq_end"] or 0) - r["start"]) / med_step - r["steps"]),
    }  # fmt: skip
    for key, value in summary.items():
        print(f"  {key:>48}: {value:.3f}" if isinstance(value, float) else f"  {key:>48}: {value}")
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
