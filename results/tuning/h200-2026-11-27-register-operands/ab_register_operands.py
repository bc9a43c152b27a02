"""The Gluon passes with a product's fixed left operand held in registers instead of shared memory, in one process.

A warpgroup MMA reads its left operand from shared memory or from registers. The product whose left operand stays
the same for a program's whole walk (the forward's S = Q·Kᵀ: Q; the dQ pass's S and dP: Q and dO; the dK/dV pass's
Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: K and V) can take it from registers, loaded once, which halves the shared-memory reads
of a 64 × 64 × 16 step. Variants, as constexprs of the kernels: forward Q_REGS (0, 1), dQ pass QDO_REGS (0; 1: Q;
2: Q and dO), dK/dV pass KV_REGS (0; 1: K; 2: K and V).

A check first: at odd shapes (ragged T, Tq < Tk, causal and not; D = 64 and 128) every variant's outputs against
variant 0's (max |diff|; the same products in the same order should give the same bits) and against float64
(`reference_attention`). Then timings alternating round by round (medians of `triton.testing.do_bench`), 16K
tokens a call, causal, bf16; H = 12 at D = 64, 16 at D = 128.

    PYTHONPATH=. python results/tuning/h200-2026-11-27-register-operands/ab_register_operands.py --out $OUT/ab.json
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
from flashgpt.kernels.tuning import LaunchConfig

# (pass, head dim) -> [(config, {constexpr: value}), ...]; the first is the reference variant.
VARIANTS = {
    ("fwd", 64): [
        ("64,128,4,2,maxnreg=128", {}),
        ("64,128,4,2,maxnreg=128", {"Q_REGS": 1}),
        ("192,128,4,2,maxnreg=128", {}),
    ],
    ("fwd", 128): [("128,128,4,3,maxnreg=168", {}), ("128,128,4,3,maxnreg=168", {"Q_REGS": 1})],
    ("dq", 64): [("64,128,4,2,maxnreg=128", {}), ("64,64,4,2,maxnreg=128", {"QDO_REGS": 2})],
    ("dq", 128): [("64,64,4,2,maxnreg=128", {}), ("64,64,4,2,maxnreg=128", {"QDO_REGS": 1})],
    ("dkdv", 64): [
        ("64,64,4,4,maxnreg=128", {}),
        ("64,64,4,4,maxnreg=128", {"KV_REGS": 1}),
        ("64,128,4,6,maxnreg=168", {}),
        ("64,128,4,6,maxnreg=168", {"KV_REGS": 1}),
        ("64,128,4,6,maxnreg=168", {"KV_REGS": 2}),
        ("32,192,4,4,maxnreg=128", {"KV_REGS": 1}),
    ],
    ("dkdv", 128): [("32,64,4,4,maxnreg=128", {}), ("32,128,4,6,maxnreg=168", {})],
}
CHECK_SHAPES = ((1000, 1000, True), (1000, 1000, False), (333, 777, True), (256, 256, True))


def inputs(batch, heads, seq_len_q, seq_len_k, head_dim, causal, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(batch, heads, seq_len_q, head_dim, device="cuda", generator=g).bfloat16() for _ in range(2))
    k, v = (torch.randn(batch, heads, seq_len_k, head_dim, device="cuda", generator=g).bfloat16() for _ in range(2))
    params = launch.AttentionParams(causal, 0.0, 1 / math.sqrt(head_dim))
    o = torch.empty_like(q)
    lse = torch.empty(batch, heads, seq_len_q, device="cuda", dtype=torch.float32)
    launch.launch_forward(q, k, v, o, lse, params, launch.tuned_config("fwd", q, params))
    delta = torch.empty_like(lse)
    launch.launch_dq(q, k, v, do, lse, delta, torch.empty_like(q), params, launch.tuned_config("bwd_dq", q, params),
                     o=o)  # fmt: skip
    return q, k, v, do, o, lse, delta, params


def runner(kernel_pass, cfg_text, constexprs, tensors):
    """A closure running one variant; returns its outputs."""
    q, k, v, do, o, lse, delta, params = tensors
    cfg = LaunchConfig.parse(cfg_text)
    out = {"o": torch.empty_like(q), "lse": torch.empty_like(lse), "dq": torch.empty_like(q),
           "delta": torch.empty_like(delta), "dk": torch.empty_like(k), "dv": torch.empty_like(v)}  # fmt: skip

    def run():
        launch._EXPERIMENT.clear()
        launch._EXPERIMENT[kernel_pass] = constexprs
        if kernel_pass == "fwd":
            launch.launch_forward_hopper(q, k, v, out["o"], out["lse"], params, cfg)
            return out["o"], out["lse"]
        if kernel_pass == "dq":
            launch.launch_dq_hopper(q, k, v, do, o, lse, None, out["delta"], out["dq"], params, cfg)
            return (out["dq"],)
        launch.launch_dkdv_hopper(q, k, v, do, lse, delta, out["dk"], out["dv"], params, cfg)
        return out["dk"], out["dv"]

    return run


def check() -> list[dict]:
    rows = []
    for (kernel_pass, head_dim), variants in VARIANTS.items():
        for tq, tk, causal in CHECK_SHAPES:
            tensors = inputs(1, 2, tq, tk, head_dim, causal, tq + tk)
            q, k, v, do = tensors[:4]
            qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
            ref_o, _ = reference_attention(qr, kr, vr, causal=causal)
            ref = {"fwd": (ref_o,), "dq": torch.autograd.grad(ref_o, qr, do.double(), retain_graph=True),
                   "dkdv": torch.autograd.grad(ref_o, (kr, vr), do.double())}[kernel_pass]  # fmt: skip
            first = None
            for cfg, constexprs in variants:
                outs = [t.clone() for t in runner(kernel_pass, cfg, constexprs, tensors)()]
                torch.cuda.synchronize()
                err = [(a.double() - r).abs().max().item() for a, r in zip(outs, ref, strict=False)]
                first = first or outs
                diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(outs, first, strict=True))
                row = {"pass": kernel_pass, "D": head_dim, "Tq": tq, "Tk": tk, "causal": causal, "config": cfg,
                       "constexprs": constexprs, "max_abs_err": err, "max_diff_vs_first": diff}  # fmt: skip
                row["ok"] = all(math.isfinite(e) and e < 0.05 * max(1.0, r.abs().max().item())
                                for e, r in zip(err, ref, strict=False))  # fmt: skip
                rows.append(row)
                print(("ok  " if row["ok"] else "BAD ") + json.dumps(row), flush=True)
    launch._EXPERIMENT.clear()
    return rows


def time_all(seq_lens, rounds) -> list[dict]:
    rows = []
    for (kernel_pass, head_dim), seq_len in itertools.product(VARIANTS, seq_lens):
        batch, heads = max(1, 16384 // seq_len), 12 if head_dim <= 64 else 16
        tensors = inputs(batch, heads, seq_len, seq_len, head_dim, True)
        runs = {
            f"{cfg} {json.dumps(c)}": runner(kernel_pass, cfg, c, tensors) for cfg, c in VARIANTS[kernel_pass, head_dim]
        }
        times = {name: [] for name in runs}
        for _ in range(rounds):
            for name, run in runs.items():
                times[name].append(triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median"))
        ms = {name: statistics.median(t) for name, t in times.items()}
        rows.append({"pass": kernel_pass, "D": head_dim, "T": seq_len, "B": batch, "H": heads, "ms": ms})
        first = next(iter(ms.values()))
        print(f"{kernel_pass} D={head_dim} T={seq_len}", flush=True)
        for name, t in ms.items():
            print(f"  {t:8.4f} ms  {first / t:.3f}x  {name}", flush=True)
    launch._EXPERIMENT.clear()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", default="1024,2048,4096,8192,16384")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = {"device": torch.cuda.get_device_name(), "check": check()}
    result["timings"] = time_all([int(t) for t in args.seq_lens.split(",")], args.rounds)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
