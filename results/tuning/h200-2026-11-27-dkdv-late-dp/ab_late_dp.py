"""The Gluon dK/dV pass with dPᵀ = V·dOᵀ issued late (after dV's product, once Pᵀ is computed) against the kept
schedule (issued with Sᵀ), in one process. Issued late, Sᵀ and dPᵀ are never in flight together, which leaves each
warpgroup the registers for FlashAttention-3's 64 × 128 tile at D = 128 (two warpgroups of 64 × 64). A
configuration BLOCK_M,BLOCK_N,WARPS,STAGES,maxnreg=N may end in "+late" (the kernel's LATE_DP constexpr, set
through `launch._EXPERIMENT`; `variant.patch` restores it on top of commit 9aeed8b). Check at odd shapes against
float64 first, then timings alternating round by round.

    PYTHONPATH=. python results/tuning/h200-2026-11-27-dkdv-late-dp/ab_late_dp.py --out $OUT/ab_late_dp.json
"""

import argparse
import itertools
import json
import math
import statistics

import torch
import triton

from flashgpt.attention_reference import reference_attention
from flashgpt.kernels import launch
from flashgpt.kernels.launch import (
    AttentionParams,
    launch_dkdv,
    launch_dkdv_hopper,
    launch_dq,
    launch_forward,
    tuned_config,
)
from flashgpt.kernels.tuning import LaunchConfig

CHECK_SHAPES = ((1000, 1000, True, False), (1000, 1000, False, True), (333, 777, True, True), (256, 256, True, False))


def setup(batch, heads, seq_len_q, seq_len_k, head_dim, causal, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(batch, heads, seq_len_q, head_dim, device="cuda", generator=g).bfloat16() for _ in range(2))
    k, v = (torch.randn(batch, heads, seq_len_k, head_dim, device="cuda", generator=g).bfloat16() for _ in range(2))
    params = AttentionParams(causal, 0.0, 1 / math.sqrt(head_dim))
    o = torch.empty_like(q)
    lse = torch.empty(batch, heads, seq_len_q, device="cuda", dtype=torch.float32)
    launch_forward(q, k, v, o, lse, params, tuned_config("fwd", q, params))
    return q, k, v, do, o, lse, params


class Variant(str):
    """A configuration's text, optionally ending in "+late"."""

    @property
    def config(self) -> LaunchConfig:
        return LaunchConfig.parse(self.removesuffix("+late"))

    @property
    def late(self) -> bool:
        return self.endswith("+late")


def run_variant(variant: Variant, *args) -> None:
    launch._EXPERIMENT["dkdv"] = {"LATE_DP": variant.late}
    launch_dkdv_hopper(*args, variant.config)


def check(configs: dict) -> list[dict]:
    rows = []
    for head_dim, (tq, tk, causal, with_dlse) in itertools.product(configs, CHECK_SHAPES):
        dkdv_cfgs = configs[head_dim]
        q, k, v, do, o, lse, params = setup(1, 2, tq, tk, head_dim, causal, tq + tk)
        dlse = torch.randn(lse.shape, device="cuda") if with_dlse else None
        qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
        ref_o, ref_lse = reference_attention(qr, kr, vr, causal=causal)
        outs, grads = ([ref_o, ref_lse], [do.double(), dlse.double()]) if with_dlse else ([ref_o], [do.double()])
        ref = torch.autograd.grad(outs, (qr, kr, vr), grads)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        delta = torch.empty_like(lse)
        launch_dq(q, k, v, do, lse, delta, dq, params, tuned_config("bwd_dq", q, params), o=o, dlse=dlse)
        launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, tuned_config("bwd_dkdv", q, params))
        triton_delta = delta.clone()
        err = {"triton": [(g.double() - r).abs().max().item() for g, r in zip((dq, dk, dv), ref, strict=True)]}
        for cfg in dkdv_cfgs:
            dk.fill_(float("nan")), dv.fill_(float("nan"))
            run_variant(cfg, q, k, v, do, lse, triton_delta, dk, dv, params)
            torch.cuda.synchronize()
            err[f"dkdv {cfg}"] = [(g.double() - r).abs().max().item() for g, r in zip((dk, dv), ref[1:], strict=True)]
        scale = max(r.abs().max().item() for r in ref)
        _, t_dk, t_dv = err["triton"]
        ok = all(e[0] <= 1.5 * t_dk + 4e-3 * scale and e[1] <= 1.5 * t_dv + 4e-3 * scale
                        for n, e in err.items() if n.startswith("dkdv"))  # fmt: skip
        rows.append({"D": head_dim, "Tq": tq, "Tk": tk, "causal": causal, "dlse": with_dlse, "max_abs_err": err,
                     "ok": ok})  # fmt: skip
        print(("ok  " if ok else "BAD ") + json.dumps(rows[-1]), flush=True)
    return rows


def make_runs(dkdv_cfgs, q, k, v, do, o, lse, params) -> tuple[dict, LaunchConfig]:
    """Closures running each dK/dV pass on these inputs (δ from the Triton dQ pass), and the Triton pass's config."""
    dq, dk, dv, delta = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(lse)
    tuned_dq, tuned_dkdv = tuned_config("bwd_dq", q, params), tuned_config("bwd_dkdv", q, params)
    launch_dq(q, k, v, do, lse, delta, dq, params, tuned_dq, o=o)
    runs = {"triton dkdv": lambda: launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, tuned_dkdv)}
    for cfg in dkdv_cfgs:
        runs[f"gluon dkdv {cfg}"] = lambda cfg=cfg: run_variant(cfg, q, k, v, do, lse, delta, dk, dv, params)
    return runs, tuned_dkdv


def time_shapes(configs: dict, seq_lens, rounds) -> list[dict]:
    rows = []
    for head_dim, seq_len in itertools.product(configs, seq_lens):
        batch, heads = max(1, 16384 // seq_len), 12 if head_dim <= 64 else 16
        q, k, v, do, o, lse, params = setup(batch, heads, seq_len, seq_len, head_dim, True)
        runs, tuned_dkdv = make_runs(configs[head_dim], q, k, v, do, o, lse, params)
        times = {name: [] for name in runs}
        for _ in range(rounds):
            for name, run in runs.items():
                times[name].append(triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median"))
        ms = {name: statistics.median(t) for name, t in times.items()}
        rows.append({"D": head_dim, "T": seq_len, "B": batch, "H": heads, "ms": ms, "tuned_dkdv": str(tuned_dkdv)})
        print(f"D={head_dim} T={seq_len}", flush=True)
        for name, t in ms.items():
            first = ms[f"gluon dkdv {configs[head_dim][0]}"]
            print(f"  {t:8.4f} ms  {ms['triton dkdv'] / t:.3f}x triton  {first / t:.3f}x first  {name}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", default="1024,2048,4096,8192,16384")
    parser.add_argument(
        "--dkdv-64",
        default="64,64,4,4,maxnreg=128;64,64,4,4,maxnreg=128+late;32,192,4,4,maxnreg=128+late;64,128,4,4,maxnreg=168+late",
        help="the first: the table's",
    )
    parser.add_argument(
        "--dkdv-128",
        default="32,64,4,4,maxnreg=128;32,64,4,4,maxnreg=128+late;64,128,4,2,maxnreg=168+late;"
        "64,128,4,3,maxnreg=168+late",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    configs = {d: [Variant(t) for t in text.split(";") if t] for d, text in ((64, args.dkdv_64), (128, args.dkdv_128))}
    configs = {d: c for d, c in configs.items() if c}
    result = {"device": torch.cuda.get_device_name(), "check": check(configs)}
    seq_lens = [int(t) for t in args.seq_lens.split(",")]
    result["timings"] = time_shapes(configs, seq_lens, args.rounds)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
