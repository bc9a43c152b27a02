"""The Gluon dQ pass with dropout (the mask drawn key-major and moved to the query-major tile through shared
memory, `kernels/gluon_dropout.keep_mask`) against the Triton dQ pass and the fused Triton backward with dropout,
in one process.

First a check at odd shapes (ragged T, Tq < Tk, causal and not, a gradient of the LSE; D = 64 and 128): dQ and δ
of every configuration against float64 gradients of `reference_attention` under the mask the Triton forward drew
(`recover_keep_mask`), within 1.5x the Triton pass's error plus bf16 rounding slack. Then timings, alternating
round by round (medians of `triton.testing.do_bench`): each dQ pass, the table's dK/dV pass (Gluon), and the fused
backward (its three launches). 16K tokens a call, causal, bf16, dropout 0.1; H = 12 at D = 64, 16 at D = 128.
Configurations BLOCK_M,BLOCK_N,WARPS,STAGES,maxnreg=N, per head dim.

    PYTHONPATH=. python results/tuning/h200-2026-11-27-dq-dropout/ab_dq_dropout.py --out $OUT/ab.json
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
from flashgpt.kernels.launch import (
    NO_MASKS,
    AttentionParams,
    hopper_launch_config,
    launch_dkdv,
    launch_dkdv_hopper,
    launch_dq,
    launch_dq_convert,
    launch_dq_hopper,
    launch_forward,
    launch_preprocess,
    tuned_config,
)
from flashgpt.kernels.tuning import LaunchConfig

P = 0.1
CHECK_SHAPES = ((1000, 1000, True, False), (1000, 1000, False, True), (333, 777, True, True), (256, 256, True, False))


def setup(batch, heads, seq_len_q, seq_len_k, head_dim, causal, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(batch, heads, seq_len_q, head_dim, device="cuda", generator=g).bfloat16() for _ in range(2))
    k, v = (torch.randn(batch, heads, seq_len_k, head_dim, device="cuda", generator=g).bfloat16() for _ in range(2))
    params = AttentionParams(causal, P, 1 / math.sqrt(head_dim), seed=1234 + seed, offset=2**33 + 7 * seed)
    o = torch.empty_like(q)
    lse = torch.empty(batch, heads, seq_len_q, device="cuda", dtype=torch.float32)
    launch_forward(q, k, v, o, lse, params, tuned_config("fwd", q, params))
    return q, k, v, do, o, lse, params


def check(configs: dict) -> list[dict]:
    rows = []
    for head_dim, (tq, tk, causal, with_dlse) in itertools.product(configs, CHECK_SHAPES):
        q, k, v, do, o, lse, params = setup(1, 2, tq, tk, head_dim, causal, tq + tk)

        def attend(q_, k_, v_, params=params):
            o_, lse_ = torch.empty_like(q_), torch.empty(q_.shape[:3], device="cuda", dtype=torch.float32)
            launch_forward(q_, k_, v_, o_, lse_, params, tuned_config("fwd", q_, params))
            return o_

        keep = recover_keep_mask(attend, tuple(q.shape), tk, 0, device="cuda", dtype=torch.bfloat16)
        dlse = torch.randn(lse.shape, device="cuda") if with_dlse else None
        qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
        ref_o, ref_lse = reference_attention(qr, kr, vr, causal=causal, keep=keep, keep_scale=keep_scale(P))
        outs, grads = ([ref_o, ref_lse], [do.double(), dlse.double()]) if with_dlse else ([ref_o], [do.double()])
        ref = torch.autograd.grad(outs, (qr, kr, vr), grads)
        dq, delta = torch.empty_like(q), torch.empty_like(lse)
        launch_dq(q, k, v, do, lse, delta, dq, params, tuned_config("bwd_dq", q, params), o=o, dlse=dlse)
        triton_delta = delta.clone()
        err = {"triton": [(dq.double() - ref[0]).abs().max().item()]}
        for cfg in configs[head_dim]:
            dq.fill_(float("nan")), delta.fill_(float("nan"))
            launch_dq_hopper(q, k, v, do, o, lse, dlse, delta, dq, params, cfg)
            torch.cuda.synchronize()
            err[f"dq {cfg}"] = [(dq.double() - ref[0]).abs().max().item(), (delta - triton_delta).abs().max().item()]
        scale = ref[0].abs().max().item()
        ok = all(e[0] <= 1.5 * err["triton"][0] + 4e-3 * scale and e[1] <= 1e-3
                 for n, e in err.items() if n.startswith("dq "))  # fmt: skip
        rows.append({"D": head_dim, "Tq": tq, "Tk": tk, "causal": causal, "dlse": with_dlse, "max_abs_err": err,
                     "ok": ok})  # fmt: skip
        print(("ok  " if ok else "BAD ") + json.dumps(rows[-1]), flush=True)
    return rows


def make_runs(dq_cfgs, q, k, v, do, o, lse, params) -> dict:
    dq, dk, dv, delta = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(lse)
    dq_acc = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    tuned = {p: tuned_config(p, q, params) for p in ("bwd_dq", "bwd_fused")}
    dkdv = hopper_launch_config("bwd_dkdv_hopper", q, k, v, o, do, params, NO_MASKS)
    launch_dq(q, k, v, do, lse, delta, dq, params, tuned["bwd_dq"], o=o)

    def fused():
        launch_preprocess(o, do, delta, None, dq_acc)
        launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, tuned["bwd_fused"], dq_acc=dq_acc, dq_reduce="tma")
        launch_dq_convert(dq_acc, dq, params.softmax_scale)

    runs = {
        "triton dq": lambda: launch_dq(q, k, v, do, lse, delta, dq, params, tuned["bwd_dq"], o=o),
        "gluon dkdv": lambda: launch_dkdv_hopper(q, k, v, do, lse, delta, dk, dv, params, dkdv),
        "fused": fused,
    }
    for cfg in dq_cfgs:
        runs[f"gluon dq {cfg}"] = lambda cfg=cfg: launch_dq_hopper(q, k, v, do, o, lse, None, delta, dq, params, cfg)
    return runs


def time_shapes(configs: dict, seq_lens, rounds) -> list[dict]:
    rows = []
    for head_dim, seq_len in itertools.product(configs, seq_lens):
        batch, heads = max(1, 16384 // seq_len), 12 if head_dim <= 64 else 16
        q, k, v, do, o, lse, params = setup(batch, heads, seq_len, seq_len, head_dim, True)
        runs = make_runs(configs[head_dim], q, k, v, do, o, lse, params)
        times = {name: [] for name in runs}
        for _ in range(rounds):
            for name, run in runs.items():
                times[name].append(triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median"))
        ms = {name: statistics.median(t) for name, t in times.items()}
        rows.append({"D": head_dim, "T": seq_len, "B": batch, "H": heads, "ms": ms})
        split = ms["triton dq"] + ms["gluon dkdv"]
        print(f"D={head_dim} T={seq_len}: triton dq {ms['triton dq']:.4f}  gluon dkdv {ms['gluon dkdv']:.4f}  "
              f"split {split:.4f}  fused {ms['fused']:.4f} ms", flush=True)  # fmt: skip
        for name, t in ms.items():
            if name.startswith("gluon dq"):
                new_split = ms["gluon dkdv"] + t
                print(f"  {t:8.4f} ms  pass {ms['triton dq'] / t:.3f}x  backward {split / new_split:.3f}x split, "
                      f"{ms['fused'] / new_split:.3f}x fused  {name}", flush=True)  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", default="1024,2048,4096,8192,16384")
    parser.add_argument("--dq-64", default="64,128,4,2,maxnreg=128;64,64,4,2,maxnreg=128;64,128,4,3,maxnreg=128")
    parser.add_argument("--dq-128", default="64,64,4,2,maxnreg=128;64,64,4,3,maxnreg=128")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    configs = {
        d: [LaunchConfig.parse(t + ",tma") for t in text.split(";") if t]
        for d, text in ((64, args.dq_64), (128, args.dq_128))
    }
    configs = {d: c for d, c in configs.items() if c}
    result = {"device": torch.cuda.get_device_name(), "check": check(configs)}
    result["timings"] = time_shapes(configs, [int(t) for t in args.seq_lens.split(",")], args.rounds)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
