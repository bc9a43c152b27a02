"""The Gluon dQ pass (`kernels/flash_bwd_dq_hopper.py`) against the Triton one, on a Hopper GPU, in one process.

First a check: at small odd shapes (ragged T, Tq < Tk, causal and not, with and without a gradient dlse of the
LSE, D = 64 and 128) both passes' dQ are compared with float64 gradients of `reference_attention`, and the
Gluon pass's δ with the Triton pass's; the Gluon dQ must be within 1.5× the Triton pass's error (plus bf16
rounding slack). Then timings, alternating variants round by round (medians of `triton.testing.do_bench`): the
Triton dQ pass at its tuned configuration, the Gluon pass at each of --configs, the whole split backward (dQ
pass + the dK/dV pass the backward takes) with each, and cuDNN's backward through SDPA. 16K tokens a call,
causal, bf16; H = 12 at D = 64, 16 at D = 128.

    PYTHONPATH=. python results/tuning/h200-2026-11-27-gluon-dq/ab_gluon_dq.py --head-dims 64,128 \
        --seq-lens 1024,4096,16384 --configs "64,64,4,3,maxnreg=128;64,32,4,4,maxnreg=128@128" --out $OUT/ab.json
"""

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashgpt.attention_reference import reference_attention
from flashgpt.kernels import launch
from flashgpt.kernels.flash_bwd_dq_hopper import flash_bwd_dq_hopper_kernel
from flashgpt.kernels.launch import AttentionParams, launch_dkdv, launch_dq, launch_forward, tuned_config
from flashgpt.kernels.tuning import LaunchConfig

sys.path.insert(0, str(Path(__file__).parent))
import flash_bwd_dq_ahead  # kept beside this script: variants
import flash_bwd_dq_halves
import flash_bwd_dq_stats_first

# A configuration written "ahead:..." runs the variant that issues S one tile ahead, "halves:..." the one that takes
# each key tile as two halves, "first:..." the first version (δ before the first products); a variant is (name,
# config, kernel, head dims).
KERNELS = {
    "gluon": flash_bwd_dq_hopper_kernel,
    "ahead": flash_bwd_dq_ahead.flash_bwd_dq_hopper_kernel,
    "halves": flash_bwd_dq_halves.flash_bwd_dq_hopper_kernel,
    "first": flash_bwd_dq_stats_first.flash_bwd_dq_hopper_kernel,
}


def gluon_dq(q, k, v, do, o, lse, dlse, delta, dq, params: AttentionParams, cfg: LaunchConfig, kernel) -> None:
    batch, heads, seq_len_q, head_dim = q.shape
    seq_len_k = k.shape[2]
    launch.provide_tma_scratch()
    strides = [s for t in (q, k, v, do, o, dq) for s in t.stride()[:3]]
    options = {"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}
    kernel[(triton.cdiv(seq_len_q, cfg.block_m), batch * heads)](
        q, k, v, do, o, lse, dlse, delta, dq, *strides, heads, seq_len_q, seq_len_k, params.softmax_scale,
        HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.num_stages, CAUSAL=params.causal,
        num_warps=cfg.num_warps, **options,
    )  # fmt: skip


def setup(batch, heads, seq_len_q, seq_len_k, head_dim, causal, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(batch, heads, seq_len_q, head_dim, device="cuda", generator=g).bfloat16() for _ in range(2))
    k, v = (torch.randn(batch, heads, seq_len_k, head_dim, device="cuda", generator=g).bfloat16() for _ in range(2))
    params = AttentionParams(causal, 0.0, 1 / math.sqrt(head_dim))
    o, dq = torch.empty_like(q), torch.empty_like(q)
    lse = torch.empty(batch, heads, seq_len_q, device="cuda", dtype=torch.float32)
    delta = torch.empty_like(lse)
    launch_forward(q, k, v, o, lse, params, tuned_config("fwd", q, params))
    return q, k, v, do, o, dq, lse, delta, params


CHECK_SHAPES = (
    (1000, 1000, True, False),
    (1000, 1000, False, False),
    (333, 777, True, False),
    (333, 777, False, True),
    (256, 256, True, True),
    (4096, 4096, True, False),
)


def check(variants: list[tuple], head_dims: list[int]) -> list[dict]:
    rows = []
    for head_dim in head_dims:
        for seq_len_q, seq_len_k, causal, with_dlse in CHECK_SHAPES:
            q, k, v, do, o, dq, lse, delta, params = setup(1, 2, seq_len_q, seq_len_k, head_dim, causal, seq_len_q)
            g = torch.Generator(device="cuda").manual_seed(1)
            dlse = torch.randn(lse.shape, device="cuda", generator=g) if with_dlse else None
            qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
            ref_o, ref_lse = reference_attention(qr, kr, vr, causal=causal)
            outs, grads = [ref_o], [do.double()]
            if with_dlse:
                outs.append(ref_lse)
                grads.append(dlse.double())
            (ref_dq,) = torch.autograd.grad(outs, (qr,), grads)
            launch_dq(q, k, v, do, lse, delta, dq, params, tuned_config("bwd_dq", q, params), o=o, dlse=dlse)
            ref_delta = delta.clone()
            err = {"triton": (dq.double() - ref_dq).abs().max().item()}
            delta_err = {}
            for name, cfg, kernel, dims in variants:
                if head_dim not in dims:
                    continue
                dq.fill_(float("nan"))
                delta.fill_(float("nan"))
                gluon_dq(q, k, v, do, o, lse, dlse, delta, dq, params, cfg, kernel)
                torch.cuda.synchronize()
                err[name] = (dq.double() - ref_dq).abs().max().item()
                delta_err[name] = (delta - ref_delta).abs().max().item()
            scale = ref_dq.abs().max().item()
            ok = all(e <= 1.5 * err["triton"] + 4e-3 * scale for e in err.values())
            ok = ok and all(e <= 1e-4 * (1 + ref_delta.abs().max().item()) for e in delta_err.values())
            shape = {"D": head_dim, "Tq": seq_len_q, "Tk": seq_len_k, "causal": causal, "dlse": with_dlse}
            rows.append({**shape, "max_abs_err": err, "delta_max_abs_diff": delta_err, "ref_scale": scale, "ok": ok})
            print(("ok  " if ok else "BAD ") + json.dumps(rows[-1]), flush=True)
    return rows


def make_runs(variants, head_dim, q, k, v, do, o, dq, lse, delta, params) -> dict:
    """Closures timing each variant on these inputs: the dQ passes alone, the split backward with each, cuDNN."""
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    tuned_dq = tuned_config("bwd_dq", q, params)
    hopper = launch.hopper_dkdv_launch_config(q, k, v, do, params, launch.NO_MASKS)
    if hopper is not None:
        dkdv = lambda: launch.launch_dkdv_hopper(q, k, v, do, lse, delta, dk, dv, params, hopper)
    else:
        tuned_dkdv = tuned_config("bwd_dkdv", q, params)
        dkdv = lambda: launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, tuned_dkdv)
    passes = {"triton dq": lambda: launch_dq(q, k, v, do, lse, delta, dq, params, tuned_dq, o=o)}
    for name, cfg, kernel, dims in variants:
        if head_dim in dims:
            passes[f"{name.split(':')[0]} dq {cfg}"] = lambda cfg=cfg, kernel=kernel: gluon_dq(
                q, k, v, do, o, lse, None, delta, dq, params, cfg, kernel
            )
    runs = dict(passes)
    for name, run in passes.items():
        runs[name.replace(" dq", " split bwd")] = lambda run=run: (run(), dkdv())
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
    runs["cudnn bwd"] = lambda: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)
    return runs


def time_shapes(variants, head_dims, seq_lens, rounds) -> list[dict]:
    rows = []
    for head_dim in head_dims:
        for seq_len in seq_lens:
            batch, heads = max(1, 16384 // seq_len), 12 if head_dim <= 64 else 16
            q, k, v, do, o, dq, lse, delta, params = setup(batch, heads, seq_len, seq_len, head_dim, True)
            launch_dq(q, k, v, do, lse, delta, dq, params, tuned_config("bwd_dq", q, params), o=o)
            runs = make_runs(variants, head_dim, q, k, v, do, o, dq, lse, delta, params)
            times = {name: [] for name in runs}
            for _ in range(rounds):
                for name, run in runs.items():
                    times[name].append(triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median"))
            fwd_flops = 4 * batch * heads * seq_len**2 * head_dim * 0.5
            ms = {name: statistics.median(t) for name, t in times.items()}
            row = {"D": head_dim, "T": seq_len, "B": batch, "H": heads, "ms": ms,
                   "tuned_dq": str(tuned_config("bwd_dq", q, params)),
                   "bwd_tflops": {n: 2.5 * fwd_flops / t / 1e9 for n, t in ms.items() if "bwd" in n}}  # fmt: skip
            rows.append(row)
            print(f"D={head_dim} T={seq_len}", flush=True)
            for name, t in ms.items():
                extra = f" ({ms['triton dq'] / t:.3f}x triton)" if " dq" in name else ""
                if "split bwd" in name:
                    extra = f" ({ms['triton split bwd'] / t:.3f}x triton split, {ms['cudnn bwd'] / t:.3f}x cuDNN)"
                print(f"  {t:8.4f} ms  {name}{extra}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seq-lens", default="1024,4096,16384")
    parser.add_argument("--configs", default="64,64,4,3,maxnreg=128", help="BM,BN,WARPS,STAGES[,maxnreg=N][@D,D]")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-check", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    variants = []
    for text in args.configs.split(";"):
        spec, _, dims = text.partition("@")
        kind, _, spec = spec.rpartition(":")
        kind = kind or "gluon"
        cfg = LaunchConfig.parse(spec)
        variants.append((f"{kind}:{cfg}", cfg, KERNELS[kind], [int(d) for d in dims.split(",")] if dims else [64, 128]))
    head_dims = [int(d) for d in args.head_dims.split(",")]
    result = {"device": torch.cuda.get_device_name(), "check": [] if args.skip_check else check(variants, head_dims)}
    result["timings"] = time_shapes(variants, head_dims, [int(t) for t in args.seq_lens.split(",")], args.rounds)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
