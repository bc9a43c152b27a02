"""The Gluon forward with dropout (each math warpgroup draws its tile's keep-mask query-major,
`kernels/gluon_dropout.keep_mask`) against the Triton forward with dropout, in one process.

First a check at odd shapes (ragged T, Tq < Tk, causal and not; D = 64 and 128): O and LSE of every configuration
against float64 `reference_attention` under the mask the Triton forward draws (`recover_keep_mask`), within 1.5x
the Triton forward's error plus bf16 rounding slack; a mask that differed anywhere would show as an error of the
order of O itself. Then timings, alternating round by round (medians of `triton.testing.do_bench`). 16K tokens a
call, causal, bf16, dropout 0.1; H = 12 at D = 64, 16 at D = 128. Configurations
BLOCK_M,BLOCK_N,WARPS,STAGES,maxnreg=N, per head dim.

    PYTHONPATH=. python results/tuning/h200-2026-11-27-fwd-dropout/ab_fwd_dropout.py --out $OUT/ab.json
"""

import argparse
import itertools
import json
import math
import statistics

import torch
import triton

from flashgpt.attention_reference import recover_keep_mask, reference_attention
from flashgpt.kernels.dropout import keep_scale
from flashgpt.kernels.launch import AttentionParams, launch_forward, launch_forward_hopper, tuned_config
from flashgpt.kernels.tuning import LaunchConfig

P = 0.1
CHECK_SHAPES = ((1000, 1000, True), (1000, 1000, False), (333, 777, True), (256, 256, True), (4096, 4096, True))


def setup(batch, heads, seq_len_q, seq_len_k, head_dim, causal, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, heads, seq_len_q, head_dim, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(batch, heads, seq_len_k, head_dim, device="cuda", generator=g).bfloat16() for _ in range(2))
    params = AttentionParams(causal, P, 1 / math.sqrt(head_dim), seed=1234 + seed, offset=2**33 + 7 * seed)
    return q, k, v, params


def outputs(q):
    return torch.empty_like(q), torch.empty(q.shape[:3], device="cuda", dtype=torch.float32)


def check(configs: dict) -> list[dict]:
    rows = []
    for head_dim, (tq, tk, causal) in itertools.product(configs, CHECK_SHAPES):
        q, k, v, params = setup(1, 2, tq, tk, head_dim, causal, tq + tk)

        def attend(q_, k_, v_, params=params):
            o_, lse_ = outputs(q_)
            launch_forward(q_, k_, v_, o_, lse_, params, tuned_config("fwd", q_, params))
            return o_

        keep = recover_keep_mask(attend, tuple(q.shape), tk, 0, device="cuda", dtype=torch.bfloat16)
        ref_o, ref_lse = reference_attention(q.double(), k.double(), v.double(), causal=causal, keep=keep,
                                             keep_scale=keep_scale(P))  # fmt: skip
        o, lse = outputs(q)
        launch_forward(q, k, v, o, lse, params, tuned_config("fwd", q, params))
        err = {"triton": [(o.double() - ref_o).abs().max().item(), (lse.double() - ref_lse).abs().max().item()]}
        for cfg in configs[head_dim]:
            o.fill_(float("nan")), lse.fill_(float("nan"))
            launch_forward_hopper(q, k, v, o, lse, params, cfg)
            torch.cuda.synchronize()
            err[f"gluon {cfg}"] = [(o.double() - ref_o).abs().max().item(), (lse.double() - ref_lse).abs().max().item()]
        scale = ref_o.abs().max().item()
        ok = all(e[0] <= 1.5 * err["triton"][0] + 4e-3 * scale and e[1] <= 1e-3
                 for n, e in err.items() if n.startswith("gluon "))  # fmt: skip
        rows.append({"D": head_dim, "Tq": tq, "Tk": tk, "causal": causal, "max_abs_err": err, "ok": ok})
        print(("ok  " if ok else "BAD ") + json.dumps(rows[-1]), flush=True)
    return rows


def make_runs(cfgs, q, k, v, params) -> dict:
    o, lse = outputs(q)
    tuned = tuned_config("fwd", q, params)
    runs = {"triton": lambda: launch_forward(q, k, v, o, lse, params, tuned)}
    for cfg in cfgs:
        runs[f"gluon {cfg}"] = lambda cfg=cfg: launch_forward_hopper(q, k, v, o, lse, params, cfg)
    return runs


def time_shapes(configs: dict, seq_lens, rounds) -> list[dict]:
    rows = []
    for head_dim, seq_len in itertools.product(configs, seq_lens):
        batch, heads = max(1, 16384 // seq_len), 12 if head_dim <= 64 else 16
        runs = make_runs(configs[head_dim], *setup(batch, heads, seq_len, seq_len, head_dim, True))
        times = {name: [] for name in runs}
        for _ in range(rounds):
            for name, run in runs.items():
                times[name].append(triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median"))
        ms = {name: statistics.median(t) for name, t in times.items()}
        rows.append({"D": head_dim, "T": seq_len, "B": batch, "H": heads, "ms": ms})
        print(f"D={head_dim} T={seq_len}: triton {ms['triton']:.4f} ms", flush=True)
        for name, t in ms.items():
            if name != "triton":
                print(f"  {t:8.4f} ms  {ms['triton'] / t:.3f}x  {name}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", default="1024,2048,4096,8192,16384")
    parser.add_argument(
        "--fwd-64",
        default="192,128,4,2,maxnreg=128;128,128,4,2,maxnreg=168;64,128,4,2,maxnreg=128;64,64,4,2,maxnreg=80",
    )
    parser.add_argument("--fwd-128", default="128,128,4,2,maxnreg=168;64,128,4,2,maxnreg=168;128,64,4,3,maxnreg=168")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    configs = {
        d: [LaunchConfig.parse(t + ",tma") for t in text.split(";") if t]
        for d, text in ((64, args.fwd_64), (128, args.fwd_128))
    }
    configs = {d: c for d, c in configs.items() if c}
    result = {"device": torch.cuda.get_device_name(), "check": check(configs)}
    result["timings"] = time_shapes(configs, [int(t) for t in args.seq_lens.split(",")], args.rounds)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
