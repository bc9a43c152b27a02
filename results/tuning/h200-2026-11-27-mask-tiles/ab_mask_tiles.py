"""Same-process A/B of the Gluon passes' tiles under masks: each variant replaces `launch.fit_gluon_to_masks`
(the tiles a masked call's Gluon passes take, and so the schedules `flash_mask` builds for them), and every variant
runs on the same inputs, rounds alternating, medians of `do_bench`. Shapes as `scripts/bench_masks.py`'s (D = 64,
H = 12, B = 16K / T, bf16, causal, no dropout). Each variant's outputs are compared with the tuned variant's
(rel_err of o, dq, dk, dv: only the summation order differs), and the GPU time of each kernel is read from
torch.profiler.

    PYTHONPATH=.:scripts python results/tuning/h200-2026-11-27-mask-tiles/ab_mask_tiles.py --out ab.json

A variant is "tuned" or "+"-joined overrides PASS=ROWSxCOLS (fwd, dq, dkdv): the pass's tiles, with maxnreg 168
for a program of two math warpgroups (a 128-row forward, a 128-key dK/dV pass) and 128 otherwise, as the table's
own configurations have them, or the maxnreg a suffix @N gives (fwd=64x64@80: three programs an SM).
"""

import argparse
import json
import statistics
import sys
from dataclasses import replace

import bench_masks
import torch
import triton.testing
from bench_masks import HEADS, TOKENS_PER_CALL, Profile, build_case, flash_fn

from flashgpt.attention_reference import rel_err
from flashgpt.kernels import attention_op, launch, launch_plans

TUNED_FIT = launch.fit_gluon_to_masks
PASSES = {"fwd": "fwd_hopper", "dq": "bwd_dq_hopper", "dkdv": "bwd_dkdv_hopper"}
PROFILE = Profile("cuda", torch.bfloat16, block_size=128, check_seq_len=4096, dropout_check_seq_len=1024)
BLOCK_VARIANTS_8K = ["tuned", "fwd=128x128", "dkdv=32x128", "fwd=128x128+dkdv=32x128"]
# --plan first: (D, T, masks, variants), against the table's tiles fitted as they were before the change
FIRST = [
    (64, 16384, ["documents"], ["tuned", "fwd=128x128", "fwd=64x64", "fwd=192x128", "dq=64x64"]),
    (64, 16384, ["local_global", "strided", "butterfly"], ["tuned", "fwd=128x128"]),
    (64, 16384, ["window_1k", "window_4k"], ["tuned", "fwd=128x128", "fwd=64x128"]),
    (64, 8192, ["local_global", "strided", "butterfly"], BLOCK_VARIANTS_8K),
    (64, 8192, ["documents"], ["tuned", "fwd=128x128", "fwd=64x64"]),
    (64, 8192, ["window_1k"], ["tuned", "fwd=128x128", "fwd=64x128"]),
]
# --plan second: the kept fit (64-row forward under every mask, 64-key dQ tiles under documents) against the old
# tiles, at D = 64 and 128
SECOND = [
    (64, 16384, ["documents"], ["tuned", "dq=64x128"]),
    (64, 16384, ["window_1k", "window_4k"], ["tuned", "fwd=192x128", "dq=64x64"]),
    (64, 16384, ["local_global", "strided"], ["tuned", "dq=64x64"]),
    (64, 65536, ["window_1k", "window_4k"], ["tuned", "fwd=192x128"]),
    (128, 16384, ["documents", "window_1k", "strided"], ["tuned", "fwd=128x128"]),
    (128, 4096, ["documents", "window_1k", "strided"], ["tuned", "fwd=128x128"]),
]
# --plan third: the dK/dV pass's tiles under documents
THIRD = [
    (64, 16384, ["documents"], ["tuned", "dkdv=32x64", "dkdv=32x128", "dkdv=64x128"]),
    (64, 8192, ["documents"], ["tuned", "dkdv=64x64", "dkdv=32x128", "dq=64x128"]),
    (128, 16384, ["documents"], ["tuned", "dkdv=32x128", "dq=64x128"]),
]
# --plan fourth: the kept fit with the dK/dV rule (192-key programs to 64 x 64 under masks) against the old tiles
FOURTH = [(64, 8192, ["window_1k", "window_4k", "documents", "strided"], ["tuned", "dkdv=32x192"])]
# --plan fifth: the masked forward on 64 x 64 tiles at maxnreg 80, three programs an SM instead of two
OCCUPANCY = ["tuned", "fwd=64x64", "fwd=64x64@80"]
FIFTH = [
    (64, 16384, ["documents", "window_1k", "local_global", "strided"], OCCUPANCY),
    (64, 4096, ["documents", "local_global"], OCCUPANCY),
    (64, 65536, ["documents", "window_1k"], OCCUPANCY),
]
PLANS = {"first": FIRST, "second": SECOND, "third": THIRD, "fourth": FOURTH, "fifth": FIFTH}


def parse_variant(spec: str) -> dict[str, tuple[int, int, int | None]]:
    if spec == "tuned":
        return {}
    out = {}
    for part in spec.split("+"):
        name, tiles = part.split("=")
        tiles, _, maxnreg = tiles.partition("@")
        rows, cols = tiles.split("x")
        out[PASSES[name]] = (int(rows), int(cols), int(maxnreg) if maxnreg else None)
    return out


def fit_for(overrides: dict[str, tuple[int, int, int | None]]):
    def fit(kernel_pass, cfg, head_dim, block_size, documents):
        if kernel_pass not in overrides:
            return TUNED_FIT(kernel_pass, cfg, head_dim, block_size, documents)
        rows, cols, maxnreg = overrides[kernel_pass]
        consumers = (cols if kernel_pass == "bwd_dkdv_hopper" else rows) // 64
        cfg = replace(cfg, block_m=rows, block_n=cols, maxnreg=maxnreg or (168 if consumers == 2 else 128))
        if block_size is not None and (block_size % rows or block_size % cols):
            return None
        return cfg

    return fit


def use(spec: str) -> None:
    launch.fit_gluon_to_masks = fit_for(parse_variant(spec))
    launch_plans._WITHOUT_TENSOR_MASKS.clear()  # window-only calls: their plans would replay the last variant's
    attention_op._BACKWARD_SCHEDULES.clear()


def passes_taken(case, seq_len: int) -> dict[str, list[int] | None]:
    """The tiles each Gluon pass takes for the case (None: the Triton pass takes the call)."""
    from flashgpt.kernels import flash_mask

    mask = flash_mask(seq_len, seq_len, head_dim=bench_masks.HEAD_DIM, dtype=torch.bfloat16, **case.flash_kwargs)
    q = torch.empty(1, HEADS, seq_len, bench_masks.HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    params = launch.AttentionParams(True, 0.0, bench_masks.HEAD_DIM**-0.5)
    out = {}
    for name in PASSES.values():
        cfg = launch.hopper_launch_config(name, q, q, q, q, q, params, mask)
        out[name] = None if cfg is None else [cfg.block_m, cfg.block_n, cfg.num_stages, cfg.maxnreg]
    return out


def measure(fn, q, k, v, grad) -> tuple[float, float]:
    def fwd_bwd() -> None:
        fn(q, k, v).backward(grad)

    fwd = triton.testing.do_bench(lambda: fn(q, k, v), warmup=25, rep=100, return_mode="median")
    both = triton.testing.do_bench(fwd_bwd, warmup=25, rep=100, grad_to_none=[q, k, v], return_mode="median")
    return fwd, both


def kernel_ms(fn, q, k, v, grad, calls: int = 10) -> dict[str, float]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(q, k, v).backward(grad)
        torch.cuda.synchronize()
    q.grad = k.grad = v.grad = None
    return {
        e.key: e.device_time_total / calls / 1e3
        for e in prof.key_averages()
        if e.key.startswith("flash_") and e.device_time_total > 0
    }


def outputs(fn, q, k, v, grad) -> dict[str, torch.Tensor]:
    o = fn(q, k, v)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), grad)
    return {"o": o.detach(), "dq": dq, "dk": dk, "dv": dv}


def run_case(seq_len: int, mask: str, variants: list[str], rounds: int) -> dict:
    batch = max(1, TOKENS_PER_CALL // seq_len)
    case = build_case(mask, seq_len, batch, PROFILE)
    gen = torch.Generator(device="cuda").manual_seed(seq_len)
    head_dim = bench_masks.HEAD_DIM
    shape = (batch, HEADS, seq_len, head_dim)
    q, k, v = (
        torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_() for _ in range(3)
    )
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    fns, rows, want = {}, {}, None
    for spec in variants:
        use(spec)
        fns[spec] = flash_fn(case, 0.0, seq_len, torch.bfloat16)
        got = outputs(fns[spec], q, k, v, grad)
        if want is None:
            want = got
        rows[spec] = {
            "tiles": passes_taken(case, seq_len),
            "vs_tuned": {n: rel_err(got[n], want[n]) for n in got},
            "fwd": [],
            "fwd_bwd": [],
            "kernels": kernel_ms(fns[spec], q, k, v, grad),
        }
    for _ in range(rounds):
        for spec in variants:
            use(spec)
            fwd, both = measure(fns[spec], q, k, v, grad)
            rows[spec]["fwd"].append(fwd)
            rows[spec]["fwd_bwd"].append(both)
    base = rows[variants[0]]
    for spec in variants:
        row = rows[spec]
        row["fwd_ms"], row["fwd_bwd_ms"] = statistics.median(row["fwd"]), statistics.median(row["fwd_bwd"])
        row["speedup_fwd"] = statistics.median(base["fwd"]) / row["fwd_ms"]
        row["speedup_fwd_bwd"] = statistics.median(base["fwd_bwd"]) / row["fwd_bwd_ms"]
        kernels = " ".join(f"{n.removeprefix('flash_')[:18]}={ms:.3f}" for n, ms in row["kernels"].items())
        print(f"D={head_dim} T={seq_len:>6} {mask:>12} {spec:>24}: "
              f"fwd {row['fwd_ms']:.3f} ms ({row['speedup_fwd']:.3f}x) "
              f"fwd+bwd {row['fwd_bwd_ms']:.3f} ms ({row['speedup_fwd_bwd']:.3f}x) | {kernels} | "
              f"vs tuned {max(row['vs_tuned'].values()):.1e} | {row['tiles']}", flush=True)  # fmt: skip
    use("tuned")
    return {"head_dim": head_dim, "seq_len": seq_len, "mask": mask, "density": case.density, "variants": rows}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plan", choices=list(PLANS), default="second")
    args = parser.parse_args()
    results = []
    for head_dim, seq_len, masks, variants in PLANS[args.plan]:
        bench_masks.HEAD_DIM = head_dim  # flash_fn reads it
        for mask in masks:
            results.append(run_case(seq_len, mask, variants, args.rounds))
            torch.cuda.empty_cache()
            with open(args.out, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
