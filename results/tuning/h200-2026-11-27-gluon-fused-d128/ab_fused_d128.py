"""The Gluon fused backward (`kernels/flash_bwd_fused_hopper.py`) at D = 128: two math warpgroups of 64 keys, dPᵀ
issued late, dQᵀ = Kᵀ·dSᵀ, against the split backward the table takes (Gluon dQ and dK/dV passes), in one process.

First a check at odd shapes (ragged T, Tq < Tk, causal and not, a gradient of the LSE; dropout 0 and 0.1): dQ, dK
and dV of every variant against float64 gradients of `reference_attention` under the mask the Triton forward drew,
within 1.5x the split backward's error plus bf16 slack. Then timings, rounds alternating (medians of
`triton.testing.do_bench`), each backward whole: 16K tokens a call, causal, bf16, H = 16.

    PYTHONPATH=. python results/tuning/h200-2026-11-27-gluon-fused-d128/ab_fused_d128.py --out $OUT/ab.json
"""

import argparse
import itertools
import json
import math
import statistics
import sys

import torch

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
    launch_fused_hopper,
    launch_preprocess,
    tuned_config,
)
from flashgpt.kernels.tuning import LaunchConfig

CHECK_SHAPES = ((1000, 1000, True, False), (1000, 1000, False, True), (333, 777, True, True), (256, 256, True, False))
FUSED = {f"fused {c}": LaunchConfig.parse(c) for c in ("32,128,4,2,tma,maxnreg=168", "32,128,4,4,tma,maxnreg=168")}


def setup(batch, heads, seq_len_q, seq_len_k, head_dim, dropout, causal, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(batch, heads, seq_len_q, head_dim, device="cuda", generator=g).bfloat16() for _ in range(2))
    k, v = (torch.randn(batch, heads, seq_len_k, head_dim, device="cuda", generator=g).bfloat16() for _ in range(2))
    params = AttentionParams(causal, dropout, 1 / math.sqrt(head_dim), seed=1234 + seed, offset=2**33 + 7 * seed)
    o = torch.empty_like(q)
    lse = torch.empty(batch, heads, seq_len_q, device="cuda", dtype=torch.float32)
    launch_forward(q, k, v, o, lse, params, tuned_config("fwd", q, params))
    return q, k, v, do, o, lse, params


def make_runs(q, k, v, do, o, lse, params, dlse=None) -> tuple[dict, dict]:
    """Closures running each backward whole; their outputs (dq, dk, dv) land in the returned dict."""
    names = ["split", *FUSED]
    outs = {name: (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)) for name in names}
    delta = torch.empty_like(lse)
    dq_acc = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    dq_hopper = hopper_launch_config("bwd_dq_hopper", q, k, v, o, do, params, NO_MASKS)
    dkdv_hopper = hopper_launch_config("bwd_dkdv_hopper", q, k, v, o, do, params, NO_MASKS)

    def split():
        dq, dk, dv = outs["split"]
        if dq_hopper is not None:
            launch_dq_hopper(q, k, v, do, o, lse, dlse, delta, dq, params, dq_hopper)
        else:
            launch_dq(q, k, v, do, lse, delta, dq, params, tuned_config("bwd_dq", q, params), o=o, dlse=dlse)
        if dkdv_hopper is not None:
            launch_dkdv_hopper(q, k, v, do, lse, delta, dk, dv, params, dkdv_hopper)
        else:
            launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, tuned_config("bwd_dkdv", q, params))

    def fused(name):
        dq, dk, dv = outs[name]
        launch_preprocess(o, do, delta, dlse, dq_acc)
        launch_fused_hopper(q, k, v, do, lse, delta, dk, dv, dq_acc, params, FUSED[name])
        launch_dq_convert(dq_acc, dq, params.softmax_scale)

    runs = {"split": split, **{name: (lambda name=name: fused(name)) for name in FUSED}}
    return runs, outs


def check(head_dim, dropouts) -> list[dict]:
    from flashgpt.attention_reference import recover_keep_mask, reference_attention
    from flashgpt.kernels.dropout import keep_scale

    rows = []
    for p, (tq, tk, causal, with_dlse) in itertools.product(dropouts, CHECK_SHAPES):
        q, k, v, do, o, lse, params = setup(1, 2, tq, tk, head_dim, p, causal, tq + tk)

        def attend(q_, k_, v_, params=params):
            o_ = torch.empty_like(q_)
            lse_ = torch.empty(q_.shape[:3], device="cuda", dtype=torch.float32)
            launch_forward(q_, k_, v_, o_, lse_, params, tuned_config("fwd", q_, params))
            return o_

        keep = recover_keep_mask(attend, tuple(q.shape), tk, 0, device="cuda", dtype=torch.bfloat16) if p else None
        dlse = torch.randn(lse.shape, device="cuda") if with_dlse else None
        qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
        ref_o, ref_lse = reference_attention(qr, kr, vr, causal=causal, keep=keep, keep_scale=keep_scale(p))
        outs_, grads = ([ref_o, ref_lse], [do.double(), dlse.double()]) if with_dlse else ([ref_o], [do.double()])
        ref = torch.autograd.grad(outs_, (qr, kr, vr), grads)
        runs, outs = make_runs(q, k, v, do, o, lse, params, dlse)
        err = {}
        for name, run in runs.items():
            run()
            torch.cuda.synchronize()
            err[name] = [(g.double() - r).abs().max().item() for g, r in zip(outs[name], ref, strict=True)]
        scale = max(r.abs().max().item() for r in ref)
        ok = all(e <= 1.5 * t + 4e-3 * scale for errs in err.values() for e, t in zip(errs, err["split"], strict=True))
        rows.append({"p": p, "Tq": tq, "Tk": tk, "causal": causal, "dlse": with_dlse, "max_abs_err": err, "ok": ok})
        print(("ok  " if ok else "BAD ") + json.dumps(rows[-1]), flush=True)
    return rows


def time_shapes(head_dim, dropouts, seq_lens, rounds) -> list[dict]:
    import triton

    rows = []
    for p, seq_len in itertools.product(dropouts, seq_lens):
        batch, heads = max(1, 16384 // seq_len), 2048 // head_dim
        q, k, v, do, o, lse, params = setup(batch, heads, seq_len, seq_len, head_dim, p, True)
        runs, _ = make_runs(q, k, v, do, o, lse, params)
        times = {name: [] for name in runs}
        for _ in range(rounds):
            for name, run in runs.items():
                times[name].append(triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median"))
        ms = {name: statistics.median(t) for name, t in times.items()}
        rows.append({"p": p, "T": seq_len, "B": batch, "H": heads, "ms": ms})
        line = "  ".join(f"{name} {t:.4f} ms ({ms['split'] / t:.3f}x)" for name, t in ms.items())
        print(f"D={head_dim} p={p} T={seq_len}: {line}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq-lens", default="1024,2048,4096,8192,16384")
    parser.add_argument("--dropout", default="0.1,0.0")
    parser.add_argument("--configs", default=None, help="fused configurations, ';'-separated (default: 2 and 4 stages)")
    parser.add_argument("--no-check", action="store_true")
    args = parser.parse_args()
    if args.configs:
        FUSED.clear()
        FUSED.update({f"fused {c}": LaunchConfig.parse(c) for c in args.configs.split(";")})
    dropouts = [float(p) for p in args.dropout.split(",")]
    result = {"device": torch.cuda.get_device_name(), "configs": list(FUSED), "command": " ".join(sys.argv)}
    if not args.no_check:
        result["check"] = check(128, dropouts)
    seq_lens = [int(t) for t in args.seq_lens.split(",")]
    result["timing"] = time_shapes(128, dropouts, seq_lens, args.rounds)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
