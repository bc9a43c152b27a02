"""Same-process A/B of the passes a masked call with dropout 0.1 takes (D = 64 unless --head-dim says otherwise,
H = 12, B = 16K / T, bf16, causal; shapes as `scripts/bench_masks.py`'s). Before this folder's changes the Gluon
passes took masked calls only without dropout at D = 64: with dropout, the Triton forward and (at 8K and up) the
Triton fused backward took them. Each variant hands some passes to other kernels, on the same inputs and dropout
seed; rounds alternate, medians of `do_bench`; outputs compared with the first variant's (same seed: the same
keep-mask, so only the summation order differs); GPU time per kernel from torch.profiler.

    PYTHONPATH=.:scripts python results/tuning/h200-2026-11-27-masked-dropout/ab_masked_dropout.py --out ab.json

A variant is "tuned" or "+"-joined parts: "split" (the split backward instead of the fused one), or
PASS=ROWSxCOLS@MAXNREG[sSTAGES] (fwd, dq, dkdv, fused): the Gluon pass takes the call with these tiles (default stages:
2; 4 for the dK/dV pass, as its table has them). Plan "stages" runs without dropout: the depth of the masked
passes' rings (the Nsight Compute profile found them latency-bound).
"""

import argparse
import functools
import json
import statistics
import sys

import bench_masks
import torch
import triton.testing
from bench_masks import HEADS, TOKENS_PER_CALL, Profile, build_case

from flashgpt.attention_reference import rel_err
from flashgpt.kernels import attention_op, flash_attention, flash_mask, launch, launch_plans
from flashgpt.kernels.tuning import LaunchConfig

TUNED = (launch.hopper_config, launch.fit_gluon_to_masks, attention_op._backward_schedule)
PASSES = {"fwd": "fwd_hopper", "dq": "bwd_dq_hopper", "dkdv": "bwd_dkdv_hopper", "fused": "bwd_fused_hopper"}
PROFILE = Profile("cuda", torch.bfloat16, block_size=128, check_seq_len=4096, dropout_check_seq_len=1024)
DROPOUT = 0.1  # the plan's (`main`)
MASKS = ["window_1k", "window_4k", "documents", "local_global", "strided", "butterfly"]
VARIANTS = [
    "tuned",
    "fwd=64x64@80",
    "fwd=64x64@128",
    "fwd=64x128@128",
    "split",
    "split+dq=64x64@128",
    "fwd=64x64@80+split+dq=64x64@128",
]
# --plan first: the Gluon forward, and the split backward with Gluon passes, under every mask at 16K and two at 4K
FIRST = [(16384, MASKS, VARIANTS), (4096, ["documents", "strided"], VARIANTS)]
# --plan stages: without dropout, deeper rings for the masked passes (forward 64 x 64 at maxnreg 80: three programs
# an SM fit three or four stages, 57.6 / 74.0 KB each; the dQ pass on 64 x 64 tiles, two programs, four)
STAGES = [
    (
        16384,
        ["documents", "local_global", "strided", "window_1k"],
        ["tuned", "fwd=64x64@80s3", "fwd=64x64@80s4", "dq=64x64@128s4", "dkdv=64x64@128s5"],
    ),
    (65536, ["documents"], ["tuned", "fwd=64x64@80s3", "fwd=64x64@80s4"]),
]
# --plan stages-dropout: the same for the forward and dQ pass with dropout
STAGES_DROPOUT = [(16384, ["documents", "strided"], ["tuned", "fwd=64x64@80s3", "dq=64x64@128s4"])]
# --plan fused: the Gluon fused backward under masks ("tuned") against the split one through the Gluon passes
# (at maxnreg 128, the table's, it spills 112-176 bytes under masks; at 152, 40, with two programs an SM still)
FUSED_VARIANTS = ["tuned", "fused=64x64@152", "split"]
FUSED = [
    (16384, MASKS, FUSED_VARIANTS),
    (4096, ["documents", "strided", "window_1k"], FUSED_VARIANTS),
    (65536, ["documents", "strided"], FUSED_VARIANTS),
]
# --plan fused-d128 (with --head-dim 128): the same at D = 128, whose fused pass has two math warpgroups
FUSED_D128 = [
    (16384, ["documents", "strided", "window_1k"], ["tuned", "split"]),
    (4096, ["documents"], ["tuned", "split"]),
]
# --plan fused-tiles: the fused pass on 32-query tiles at D = 64 (dQ then transposed, as at D = 128: a product's rows
# come in 64s), which spill nothing under masks (64-query tiles: 112-176 bytes)
FUSED_TILES = [
    (16384, ["dense", *MASKS], ["tuned", "fused=32x64@128s4", "fused=32x64@128s2", "split"]),
    (65536, ["documents"], ["tuned", "fused=32x64@128s4", "split"]),
    (4096, ["documents", "dense"], ["tuned", "fused=32x64@128s4", "split"]),
]
# --plan fused-nodrop: without dropout, the masked fused backward (32- and 64-query tiles) against the split one
FUSED_NODROP = [
    (16384, MASKS, ["tuned", "fused=32x64@128s4", "fused=64x64@128s2"]),
    (65536, ["documents", "strided"], ["tuned", "fused=32x64@128s4"]),
]
# --plan occupancy: without dropout, the split backward's passes on smaller tiles under fewer registers, so that
# more programs share an SM: dK/dV on 32 x 64 at maxnreg 96 (no spill, 50 KB: four programs), dQ on 64 x 32 at 80
# (no spill, 33 KB: three)
OCCUPANCY = [
    (16384, ["dense", *MASKS], ["tuned", "dkdv=32x64@96s4", "dq=64x32@80", "dkdv=32x64@96s4+dq=64x32@80"]),
    (65536, ["documents"], ["tuned", "dkdv=32x64@96s4+dq=64x32@80"]),
]
PLANS = {
    "first": (0.1, FIRST),
    "occupancy": (0.0, OCCUPANCY),
    "fused-nodrop": (0.0, FUSED_NODROP),
    "fused-tiles": (0.1, FUSED_TILES),
    "fused-d128": (0.1, FUSED_D128),
    "stages": (0.0, STAGES),
    "stages-dropout": (0.1, STAGES_DROPOUT),
    "fused": (0.1, FUSED),
}


def parse_variant(spec: str) -> tuple[bool, dict[str, tuple[int, int, int, int | None]]]:
    if spec == "tuned":
        return False, {}
    split, out = False, {}
    for part in spec.split("+"):
        if part == "split":
            split = True
            continue
        name, tiles = part.split("=")
        tiles, _, regs = tiles.partition("@")
        maxnreg, _, stages = regs.partition("s")
        rows, cols = tiles.split("x")
        out[PASSES[name]] = (int(rows), int(cols), int(maxnreg), int(stages) if stages else None)
    return split, out


def use(spec: str) -> None:
    split, overrides = parse_variant(spec)
    tuned_config, tuned_fit, tuned_schedule = TUNED

    def config(kernel_pass, head_dim, dtype, causal, dropout, seq_len):
        if kernel_pass in overrides:
            rows, cols, maxnreg, stages = overrides[kernel_pass]
            stages = stages or (4 if kernel_pass == "bwd_dkdv_hopper" else 2)
            return LaunchConfig(rows, cols, 4, stages, True, maxnreg)
        return tuned_config(kernel_pass, head_dim, dtype, causal, dropout, seq_len)

    def fit(kernel_pass, cfg, head_dim, block_size, documents, dropout):
        if kernel_pass not in overrides:
            return tuned_fit(kernel_pass, cfg, head_dim, block_size, documents, dropout)
        return cfg if block_size is None else launch.fit_gluon_to_blocks(kernel_pass, cfg, block_size)

    def schedule(*args):
        return (None, False) if split else tuned_schedule(*args)

    launch.hopper_config, launch.fit_gluon_to_masks, attention_op._backward_schedule = config, fit, schedule
    launch_plans._WITHOUT_TENSOR_MASKS.clear()  # window-only calls: their plans would replay the last variant's
    attention_op._BACKWARD_SCHEDULES.clear()


def passes_taken(mask, seq_len: int) -> dict[str, list[int] | None]:
    """The tiles each Gluon pass takes (None: the Triton pass takes the call)."""
    q = torch.empty(1, HEADS, seq_len, bench_masks.HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    params = launch.AttentionParams(True, DROPOUT, bench_masks.HEAD_DIM**-0.5)
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
    torch.manual_seed(1234)  # the dropout seed: every variant draws the same keep-mask
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
        mask_obj = flash_mask(seq_len, seq_len, head_dim=head_dim, dtype=torch.bfloat16, dropout_p=DROPOUT,
                              **case.flash_kwargs)  # fmt: skip
        fns[spec] = functools.partial(flash_attention, causal=True, dropout_p=DROPOUT, mask=mask_obj)
        got = outputs(fns[spec], q, k, v, grad)
        if want is None:
            want = got
        rows[spec] = {
            "tiles": passes_taken(mask_obj, seq_len),
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
        print(f"T={seq_len:>6} {mask:>12} {spec:>22}: "
              f"fwd {row['fwd_ms']:.3f} ms ({row['speedup_fwd']:.3f}x) "
              f"fwd+bwd {row['fwd_bwd_ms']:.3f} ms ({row['speedup_fwd_bwd']:.3f}x) | {kernels} | "
              f"vs tuned {max(row['vs_tuned'].values()):.1e} | {row['tiles']}", flush=True)  # fmt: skip
    use("tuned")
    return {"seq_len": seq_len, "mask": mask, "density": case.density, "variants": rows}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plan", choices=list(PLANS), default="first")
    parser.add_argument("--head-dim", type=int, default=64)
    args = parser.parse_args()
    global DROPOUT
    DROPOUT, plan = PLANS[args.plan]
    bench_masks.HEAD_DIM = args.head_dim  # build_case and the shapes read it
    results = []
    for seq_len, masks, variants in plan:
        for mask in masks:
            try:
                results.append(run_case(seq_len, mask, variants, args.rounds))
            except Exception as e:  # a variant that does not compile or run: report it, go on with the next case
                print(f"T={seq_len} {mask}: {type(e).__name__}: {str(e)[:400]}", flush=True)
                results.append({"seq_len": seq_len, "mask": mask, "error": f"{type(e).__name__}: {e}"[:2000]})
                use("tuned")
            torch.cuda.empty_cache()
            with open(args.out, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "dropout": DROPOUT, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
