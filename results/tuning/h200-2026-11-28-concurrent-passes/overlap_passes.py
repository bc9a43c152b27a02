"""The split backward's two Gluon passes run at once: does overlapping them beat running them one after the other?

Today the dK/dV pass waits for the whole dQ pass, which also writes δ = rowsum(dO ∘ O) for it. Given δ from the
small preprocess kernel first, the two passes are independent (each writes only its own outputs), so they can run
on two streams and fill each other's tail. Nothing changes in the arithmetic: the outputs must stay bit-identical
(δ from the preprocess kernel may differ from the dQ pass's in its last bits, which the dK/dV outputs would show).

    PYTHONPATH=$PWD python results/tuning/h200-2026-11-28-concurrent-passes/overlap_passes.py --out $OUT/overlap.json

D = 64, causal, bf16, no dropout, B·T = 16K, H = 12 (bench_attention's shapes). Variants, each the whole backward
after one forward, timed by `triton.testing.do_bench` in alternating rounds:
- `sequential`: dQ pass (δ too), then dK/dV: HEAD's split backward;
- `preprocess`: δ by the preprocess kernel, then the two passes one after the other (what δ alone costs);
- `overlap_dkdv_first` / `overlap_dq_first`: δ, then both passes on two streams, launched in that order;
- `overlap_priority`: δ, then dK/dV, and dQ on a high-priority stream.
"""

import argparse
import json
import math
import statistics

import torch
import triton

from flashgpt.kernels import launch
from flashgpt.kernels.launch import AttentionParams


def variants(seq_len: int) -> tuple[dict, dict]:
    batch, heads, head_dim = 16384 // seq_len, 12, 64
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(batch, heads, seq_len, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    params = AttentionParams(True, 0.0, 1 / math.sqrt(head_dim), seed=7, offset=0)
    masks = launch.NO_MASKS
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], device="cuda", dtype=torch.float32)
    fwd = launch.hopper_launch_config("fwd_hopper", q, k, v, o, None, params, masks)
    launch.launch_forward_hopper(q, k, v, o, lse, params, fwd, masks)
    dq_cfg = launch.hopper_launch_config("bwd_dq_hopper", q, k, v, o, do, params, masks)
    dkdv_cfg = launch.hopper_launch_config("bwd_dkdv_hopper", q, k, v, o, do, params, masks)
    assert dq_cfg is not None and dkdv_cfg is not None, "the Gluon passes do not take this shape"
    outs = {name: {g: torch.empty_like(q) for g in ("dq", "dk", "dv")} for name in ("a", "b")}
    delta, scratch = torch.empty_like(lse), torch.empty_like(lse)
    side = torch.cuda.Stream()
    urgent = torch.cuda.Stream(priority=-1)

    def dq_pass(out, d):
        launch.launch_dq_hopper(q, k, v, do, o, lse, None, d, out["dq"], params, dq_cfg, masks)

    def dkdv_pass(out, d):
        launch.launch_dkdv_hopper(q, k, v, do, lse, d, out["dk"], out["dv"], params, dkdv_cfg, masks)

    def sequential(out=outs["a"]):
        dq_pass(out, delta)
        dkdv_pass(out, delta)

    def preprocess(out=outs["b"]):
        launch.launch_preprocess(o, do, delta)
        dq_pass(out, scratch)
        dkdv_pass(out, delta)

    def overlap(first: str, stream: torch.cuda.Stream, out=outs["b"]):
        main = torch.cuda.current_stream()
        launch.launch_preprocess(o, do, delta)
        stream.wait_stream(main)
        if first == "dkdv":
            dkdv_pass(out, delta)
            with torch.cuda.stream(stream):
                dq_pass(out, scratch)
        else:
            with torch.cuda.stream(stream):
                dq_pass(out, scratch)
            dkdv_pass(out, delta)
        main.wait_stream(stream)

    runs = {
        "sequential": sequential,
        "preprocess": preprocess,
        "overlap_dkdv_first": lambda: overlap("dkdv", side),
        "overlap_dq_first": lambda: overlap("dq", side),
        "overlap_priority": lambda: overlap("dkdv", urgent),
    }
    return runs, outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", default="4096,8192,16384")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    for seq_len in map(int, args.seq_lens.split(",")):
        runs, outs = variants(seq_len)
        for name, run in runs.items():
            run()
            torch.cuda.synchronize()
            grads = ("dq", "dk", "dv") if name != "sequential" else ()
            same = {g: torch.equal(outs["a"][g], outs["b"][g]) for g in grads}
            diff = {g: (outs["a"][g].float() - outs["b"][g].float()).abs().max().item() for g in same}
            rows.append(dict(seq_len=seq_len, variant=name, bit_identical=same, max_abs_diff=diff, rounds_ms=[]))
        by_name = {r["variant"]: r for r in rows if r["seq_len"] == seq_len}
        for _ in range(args.rounds):
            for name, run in runs.items():
                by_name[name]["rounds_ms"].append(triton.testing.do_bench(run, warmup=25, rep=100))
        base = statistics.median(by_name["sequential"]["rounds_ms"])
        for name, row in by_name.items():
            row["ms"] = statistics.median(row["rounds_ms"])
            row["speedup_over_sequential"] = base / row["ms"]
            print(f"T={seq_len:6d} {name:20s} {row['ms']:7.3f} ms  {row['speedup_over_sequential']:6.3f}x  "
                  f"{row['bit_identical'] or ''}")  # fmt: skip
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                rounds=args.rounds)  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
