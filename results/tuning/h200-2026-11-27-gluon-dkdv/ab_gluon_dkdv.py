"""The Gluon dK/dV pass (`kernels/flash_bwd_dkdv_hopper.py`) against the Triton one, on a Hopper GPU, in one process.

First a check: at small odd shapes (ragged T, Tq < Tk, causal and not, D = 64 and 128) both passes' dK and dV
are compared with float64 gradients of `reference_attention`; the Gluon pass must be within 1.5× the Triton
pass's error (plus bf16 rounding slack). Then timings, alternating variants round by round (medians of
`triton.testing.do_bench`): the Triton dK/dV pass at its tuned configuration, the Gluon pass at each of --configs,
the whole split backward (dQ pass + dK/dV pass) with each, and cuDNN's backward through SDPA. 16K tokens a call,
causal, bf16; H = 12 at D = 64, 16 at D = 128, as in `profile_backward.py`.

    PYTHONPATH=. python results/tuning/h200-2026-11-27-gluon-dkdv/ab_gluon_dkdv.py --head-dims 64,128 \
        --seq-lens 1024,4096,16384 --configs "32,64,4,3;32,64,4,4;64,64,4,3@64;32,128,8,3" --out $OUT/ab.json
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
from flashgpt.kernels import flash_bwd_dkdv_hopper  # the warp-specialised pass, kept
from flashgpt.kernels.launch import (
    AttentionParams,
    launch_dkdv,
    launch_dq,
    launch_forward,
    provide_tma_scratch,
    tuned_config,
)
from flashgpt.kernels.tuning import LaunchConfig

sys.path.insert(0, str(Path(__file__).parent))
import flash_bwd_dkdv_one_warpgroup  # kept beside this script: the variant not kept

# A configuration written "ws:..." runs the warp-specialised kernel (with its maxnreg), any other the first one.
_WARP_SPECIALISED: set[str] = set()


def gluon_dkdv(q, k, v, do, lse, delta, dk, dv, params: AttentionParams, cfg: LaunchConfig) -> None:
    batch, heads, seq_len_q, head_dim = q.shape
    seq_len_k = k.shape[2]
    provide_tma_scratch()
    strides = [s for t in (q, k, v, do, dk, dv) for s in t.stride()[:3]]
    module = flash_bwd_dkdv_hopper if str(cfg) in _WARP_SPECIALISED else flash_bwd_dkdv_one_warpgroup
    options = {"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}
    module.flash_bwd_dkdv_hopper_kernel[(triton.cdiv(seq_len_k, cfg.block_n), batch * heads)](
        q, k, v, do, lse, delta, dk, dv, *strides, heads, seq_len_q, seq_len_k, params.softmax_scale,
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
    launch_dq(q, k, v, do, lse, delta, dq, params, tuned_config("bwd_dq", q, params), o=o)
    return q, k, v, do, o, dq, lse, delta, params


CHECK_SHAPES = ((1000, 1000, True), (1000, 1000, False), (333, 777, True), (256, 256, True))


def check(configs: list[LaunchConfig], head_dims: list[int]) -> list[dict]:
    rows = []
    for head_dim in head_dims:
        for seq_len_q, seq_len_k, causal in CHECK_SHAPES:
            q, k, v, do, _, _, lse, delta, params = setup(1, 2, seq_len_q, seq_len_k, head_dim, causal, seed=seq_len_q)
            qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
            ref_o, _ = reference_attention(qr, kr, vr, causal=causal)
            ref_dk, ref_dv = torch.autograd.grad(ref_o, (kr, vr), do.double())
            dk, dv = torch.empty_like(k), torch.empty_like(v)
            launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, tuned_config("bwd_dkdv", q, params))
            err = {"triton": max((dk.double() - ref_dk).abs().max().item(), (dv.double() - ref_dv).abs().max().item())}
            for cfg in configs:
                if head_dim not in cfg_head_dims(cfg):
                    continue
                dk.fill_(float("nan"))
                dv.fill_(float("nan"))
                gluon_dkdv(q, k, v, do, lse, delta, dk, dv, params, cfg)
                torch.cuda.synchronize()
                err[str(cfg)] = max(
                    (dk.double() - ref_dk).abs().max().item(), (dv.double() - ref_dv).abs().max().item()
                )
            scale = max(ref_dk.abs().max().item(), ref_dv.abs().max().item())
            ok = all(e <= 1.5 * err["triton"] + 4e-3 * scale for e in err.values())
            rows.append({"D": head_dim, "Tq": seq_len_q, "Tk": seq_len_k, "causal": causal, "max_abs_err": err,
                         "ref_scale": scale, "ok": ok})  # fmt: skip
            print(("ok  " if ok else "BAD ") + json.dumps(rows[-1]), flush=True)
    return rows


_HEAD_DIMS: dict[str, list[int]] = {}


def cfg_head_dims(cfg: LaunchConfig) -> list[int]:
    return _HEAD_DIMS.get(str(cfg), [64, 128])


def make_runs(configs, head_dim, q, k, v, do, o, dq, lse, delta, params) -> dict:
    """Closures timing each variant on these inputs: the dK/dV passes alone, the split backward with each, cuDNN."""
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    tuned_dkdv = tuned_config("bwd_dkdv", q, params)
    tuned_dq = tuned_config("bwd_dq", q, params)
    passes = {"triton dkdv": lambda: launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, tuned_dkdv)}
    for cfg in configs:
        if head_dim in cfg_head_dims(cfg):
            kind = "gluon-ws" if str(cfg) in _WARP_SPECIALISED else "gluon"
            passes[f"{kind} dkdv {cfg}"] = lambda cfg=cfg: gluon_dkdv(q, k, v, do, lse, delta, dk, dv, params, cfg)
    runs = dict(passes)
    for name, run in passes.items():
        runs[name.replace("dkdv", "split bwd")] = lambda run=run: (
            launch_dq(q, k, v, do, lse, delta, dq, params, tuned_dq, o=o),
            run(),
        )
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
    runs["cudnn bwd"] = lambda: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)
    return runs


def time_shapes(configs, head_dims, seq_lens, rounds) -> list[dict]:
    rows = []
    for head_dim in head_dims:
        for seq_len in seq_lens:
            batch, heads = max(1, 16384 // seq_len), 12 if head_dim <= 64 else 16
            q, k, v, do, o, dq, lse, delta, params = setup(batch, heads, seq_len, seq_len, head_dim, True)
            runs = make_runs(configs, head_dim, q, k, v, do, o, dq, lse, delta, params)
            times = {name: [] for name in runs}
            for _ in range(rounds):
                for name, run in runs.items():
                    times[name].append(triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median"))
            fwd_flops = 4 * batch * heads * seq_len**2 * head_dim * 0.5
            ms = {name: statistics.median(t) for name, t in times.items()}
            tuned_dkdv = tuned_config("bwd_dkdv", q, params)
            row = {"D": head_dim, "T": seq_len, "B": batch, "H": heads, "ms": ms, "tuned_dkdv": str(tuned_dkdv),
                   "bwd_tflops": {n: 2.5 * fwd_flops / t / 1e9 for n, t in ms.items() if "bwd" in n}}  # fmt: skip
            rows.append(row)
            print(f"D={head_dim} T={seq_len}", flush=True)
            for name, t in ms.items():
                extra = f" ({ms['triton dkdv'] / t:.3f}x triton)" if "dkdv" in name else ""
                if "split bwd" in name:
                    extra = f" ({ms['cudnn bwd'] / t:.3f}x cuDNN)"
                print(f"  {t:8.4f} ms  {name}{extra}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seq-lens", default="1024,4096,16384")
    parser.add_argument("--configs", default="64,64,4,3;32,64,4,3", help="Gluon configs BM,BN,WARPS,STAGES[@D,D]")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    configs = []
    for text in args.configs.split(";"):
        spec, _, dims = text.partition("@")
        warp_specialised = spec.startswith("ws:")
        cfg = LaunchConfig.parse(spec.removeprefix("ws:"))
        if warp_specialised:
            _WARP_SPECIALISED.add(str(cfg))
        if dims:
            _HEAD_DIMS[str(cfg)] = [int(d) for d in dims.split(",")]
        configs.append(cfg)
    head_dims = [int(d) for d in args.head_dims.split(",")]
    result = {"device": torch.cuda.get_device_name(), "check": check(configs, head_dims)}
    result["timings"] = time_shapes(configs, head_dims, [int(t) for t in args.seq_lens.split(",")], args.rounds)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
