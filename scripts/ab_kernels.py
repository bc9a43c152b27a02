"""A/B of a kernel change in one process: the working tree's kernels against a baseline copy of `kernels/`.

The baseline is a directory holding another version of the kernel package, e.g. the last commit's:

    mkdir -p .ab/baseline && git archive HEAD kernels | tar -x -C .ab/baseline
    python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes fwd --head-dims 64,128 \\
        --seq-lens 4096,16384 --dropout 0,0.1 --out results/tuning/<run>/ab.json

It is loaded as a package of its own (its `__init__` is skipped, so it registers no operator), and both versions
launch each pass at their own tuned configuration on the same inputs. Timings alternate A, B, A, B (median of
`triton.testing.do_bench` each, then the median of --rounds rounds), so clock drift falls on both alike; the
outputs are compared too (max |A − B|), so a faster variant that computes something else shows. Passes: fwd, bwd
(the schedule `flash_attention` would take: split or fused) and fwd_bwd.

With --masks (`scripts/bench_masks.py`'s: window_1k, documents, local_global, ...; "none" is the plain causal call,
"full" non-causal attention)
each version builds the mask's schedules with its own `FlashMask` for the tiles it launches, as `flash_mask` would,
and TFLOP/s count the pairs the mask keeps:

    python scripts/ab_kernels.py --baseline .ab/baseline/kernels --passes fwd,fwd_bwd --seq-lens 4096,16384 \\
        --masks documents,local_global,strided

With --power, each version then also runs each pass back to back in windows of a second and a half (A, B, B, A)
while `nvidia-smi` samples the SM clock and power draw, and each row gets their medians past each window's first
half second, the time per call there and the energy per call (power × time). At its power limit the GPU lowers its
clock to hold its power: two versions can then tie in time and differ in clock, and the one that needs less
energy per call has room to gain (`results/tuning/h200-2026-11-28-power/`). do_bench's own timings are too short,
and too broken by its cache flushes, for the power readings.
"""

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

import torch
import triton
from bench_masks import MASKS, Profile, build_case

from flashgpt.gpu_power import PowerSampler
from flashgpt.kernel_copies import load_launch
from flashgpt.kernels import launch as current_launch

PASSES = ("fwd", "bwd", "fwd_bwd")
MASK_PROFILE = Profile("cuda", torch.bfloat16, block_size=128, check_seq_len=4096, dropout_check_seq_len=1024)


def hopper_configs(launch: ModuleType, q, k, v, o, do, params, masks) -> tuple:
    """(dQ, dK/dV) configurations of the split backward's Gluon passes where this version has them and takes them
    for the shape, else None each (versions before the Gluon dQ pass had only the dK/dV one)."""
    if hasattr(launch, "hopper_launch_config"):
        return tuple(
            launch.hopper_launch_config(p, q, k, v, o, do, params, masks) for p in ("bwd_dq_hopper", "bwd_dkdv_hopper")
        )
    if hasattr(launch, "hopper_dkdv_launch_config"):
        return None, launch.hopper_dkdv_launch_config(q, k, v, do, params, masks)
    return None, None


def build_masks(launch: ModuleType, kwargs: dict, q, params):
    """This version's FlashMask of the masks `kwargs` (flash_attention's keywords), with schedules for the tiles
    its passes launch at q's shape, as its `flash_mask` builds them; NO_MASKS without masks."""
    if not kwargs:
        return launch.NO_MASKS
    package = launch.__name__.rpartition(".")[0]
    tuning, tile_schedule = (sys.modules[f"{package}.{name}"] for name in ("tuning", "tile_schedule"))
    seq_len, block_mask = q.shape[2], kwargs.get("block_mask")
    tiles = launch.launch_tiles(
        tuning.PASSES, q.shape[-1], q.dtype, q.device.type, q.device.index, params.causal, params.dropout,
        tuning.seq_len_bucket(seq_len), kwargs.get("block_size", 128) if block_mask is not None else None,
        kwargs.get("document_ids") is not None,
    )  # fmt: skip
    return tile_schedule.FlashMask.build(seq_len, seq_len, tiles, passes=tuning.PASSES, **kwargs)


def make_runs(launch: ModuleType, q, k, v, do, params, mask_kwargs: dict) -> dict:
    """Closures running each pass with this version's launch functions under the masks mask_kwargs (scheduled by
    `build_masks`); outputs land in the returned dict."""
    masks = build_masks(launch, mask_kwargs, q, params)
    out = {name: torch.empty_like(q) for name in ("o", "dq", "dk", "dv")}
    out["lse"] = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    delta = torch.empty_like(out["lse"])
    dq_acc = torch.empty(q.shape, device=q.device, dtype=torch.float32)

    def cfg(kernel_pass: str):
        return launch.tuned_config(kernel_pass, q, params)

    hopper_fwd = None  # versions before the Gluon forward had no "fwd_hopper" pass
    if hasattr(launch, "launch_forward_hopper"):
        hopper_fwd = launch.hopper_launch_config("fwd_hopper", q, k, v, out["o"], None, params, masks)

    def forward() -> None:
        if hopper_fwd is not None:
            launch.launch_forward_hopper(q, k, v, out["o"], out["lse"], params, hopper_fwd, masks)
        else:
            launch.launch_forward(q, k, v, out["o"], out["lse"], params, cfg("fwd"), masks)

    schedule = launch.backward_schedule_for(q.shape[-1], q.dtype, q.device, params.causal, params.dropout, q.shape[2])
    hopper_dq, hopper = hopper_configs(launch, q, k, v, out["o"], do, params, masks)
    fused_hopper = None  # versions before the Gluon fused backward had no "bwd_fused_hopper" pass
    if hasattr(launch, "launch_fused_hopper"):
        fused_hopper = launch.hopper_launch_config("bwd_fused_hopper", q, k, v, out["o"], do, params, masks)
    if masks.any and hopper is not None:
        schedule = "split"  # masks that the Gluon split passes take go there (`attention_op._backward_schedule`)

    def backward() -> None:
        if fused_hopper is not None:
            launch.launch_preprocess(out["o"], do, delta, None, dq_acc)
            launch.launch_fused_hopper(q, k, v, do, out["lse"], delta, out["dk"], out["dv"], dq_acc, params,
                                       fused_hopper, masks)  # fmt: skip
            launch.launch_dq_convert(dq_acc, out["dq"], params.softmax_scale)
        elif schedule == "fused":
            launch.launch_preprocess(out["o"], do, delta, None, dq_acc)
            launch.launch_dkdv(q, k, v, do, out["lse"], delta, out["dk"], out["dv"], params, cfg("bwd_fused"), masks,
                               dq_acc=dq_acc, dq_reduce="tma")  # fmt: skip
            launch.launch_dq_convert(dq_acc, out["dq"], params.softmax_scale)
        else:
            if hopper_dq is not None:
                launch.launch_dq_hopper(q, k, v, do, out["o"], out["lse"], None, delta, out["dq"], params, hopper_dq,
                                        masks)  # fmt: skip
            else:
                launch.launch_dq(q, k, v, do, out["lse"], delta, out["dq"], params, cfg("bwd_dq"), masks, o=out["o"])
            if hopper is not None:
                launch.launch_dkdv_hopper(q, k, v, do, out["lse"], delta, out["dk"], out["dv"], params, hopper, masks)
            else:
                launch.launch_dkdv(q, k, v, do, out["lse"], delta, out["dk"], out["dv"], params, cfg("bwd_dkdv"),
                                   masks)  # fmt: skip

    def forward_backward() -> None:
        forward()
        backward()

    if fused_hopper is not None:
        schedule = "fused, Gluon"
    elif schedule == "split" and (hopper_dq, hopper) != (None, None):
        gluon = [name for name, c in (("dQ", hopper_dq), ("dK/dV", hopper)) if c is not None]
        schedule = f"split, Gluon {' and '.join(gluon)}"
    if hopper_fwd is not None:
        schedule += "; Gluon forward"
    return {"fwd": forward, "bwd": backward, "fwd_bwd": forward_backward, "out": out, "schedule": schedule}


def flops(kernel_pass: str, batch: int, heads: int, seq_len: int, head_dim: int, pairs: int | None = None) -> float:
    """The benchmark's FLOP count: fwd 4·D per visible pair (causal: B·H·T² / 2 of them, else `pairs`), bwd 2.5 ×
    fwd."""
    fwd = 4 * head_dim * (batch * heads * seq_len**2 * 0.5 if pairs is None else pairs)
    return {"fwd": fwd, "bwd": 2.5 * fwd, "fwd_bwd": 3.5 * fwd}[kernel_pass]


def compare(
    baseline: ModuleType,
    passes: list[str],
    head_dim: int,
    seq_len: int,
    dropout: float,
    rounds: int,
    mask: str,
    power: PowerSampler | None = None,
) -> list[dict]:
    """Time each pass of both versions at one shape (16K tokens, H = 12 for D <= 64, else 2048 / D) under one mask
    ("none": causal only, "full": non-causal); one row each. With a power sampler, each row also has each
    version's SM clock, power and energy per call with the pass run back to back (`sustained`)."""
    batch, heads = max(1, 16384 // seq_len), 12 if head_dim <= 64 else 2048 // head_dim
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(batch, heads, seq_len, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    case = None if mask in ("none", "full") else build_case(mask, seq_len, batch, MASK_PROFILE)
    if case is not None and heads != 12:
        case.visible_pairs = case.visible_pairs * heads // 12  # build_case counts bench_masks' 12 heads
    runs = {}
    for side, launch in (("a", baseline), ("b", current_launch)):
        params = launch.AttentionParams(mask != "full", dropout, 1 / math.sqrt(head_dim), seed=7, offset=0)
        runs[side] = make_runs(launch, q, k, v, do, params, case.flash_kwargs if case else {})
    # Compile both and write every output once (the backward only when a backward pass is timed).
    warmup = "fwd" if passes == ["fwd"] else "fwd_bwd"
    runs["a"][warmup](), runs["b"][warmup]()
    torch.cuda.synchronize()
    compared = ("o", "lse") if warmup == "fwd" else ("o", "lse", "dq", "dk", "dv")
    diff = {n: (runs["a"]["out"][n].float() - runs["b"]["out"][n].float()).abs().max().item() for n in compared}
    rows = []
    for kernel_pass in passes:
        times: dict[str, list[float]] = {"a": [], "b": []}
        for _ in range(rounds):
            for side in ("a", "b"):
                times[side].append(triton.testing.do_bench(runs[side][kernel_pass], warmup=25, rep=100))
        ms_a, ms_b = statistics.median(times["a"]), statistics.median(times["b"])
        pairs = case.visible_pairs if case else batch * heads * seq_len**2 if mask == "full" else None
        tflops = flops(kernel_pass, batch, heads, seq_len, head_dim, pairs) / ms_b / 1e9
        rows.append(
            dict(mask=mask, head_dim=head_dim, seq_len=seq_len, dropout=dropout, kernel_pass=kernel_pass,
                 baseline_ms=ms_a, new_ms=ms_b, rounds_ms=times, new_tflops=tflops, speedup=ms_a / ms_b,
                 backward_schedule=runs["b"]["schedule"], max_abs_diff=diff)
        )  # fmt: skip
        line = (f"{mask:12s} {head_dim:4d} {seq_len:6d} {dropout:5.2f} {kernel_pass:8s} {ms_a:8.3f} {ms_b:8.3f} "
                f"{tflops:8.0f} {ms_a / ms_b:8.3f} {max(diff.values()):9.2e}")  # fmt: skip
        if power is not None:
            rows[-1]["power"] = measured = sustained(runs["a"][kernel_pass], runs["b"][kernel_pass], power)
            line += "".join(
                f" {m['sm_mhz']:5.0f} MHz {m['power_w']:4.0f} W {m['mj_per_call']:7.2f} mJ" if m else " (no sample)"
                for m in measured.values()
            )
        print(line)
    return rows


def sustained(run_a, run_b, power: PowerSampler, seconds: float = 1.5, settle: float = 0.5) -> dict:
    """Each version's pass run back to back in windows of `seconds` (A, B, B, A), the host kept a few calls ahead of
    the GPU: per version, the median SM clock and power past each window's first `settle` seconds, the time per
    call there, and the energy per call (None where no sample fell inside)."""
    spans: dict[str, list[tuple[float, float]]] = {"a": [], "b": []}
    calls = {"a": 0, "b": 0}
    for side in ("a", "b", "b", "a"):
        run = run_a if side == "a" else run_b
        torch.cuda.synchronize()
        start, issued, counted, begin = time.perf_counter(), 0, 0, None
        while time.perf_counter() - start < seconds:
            run()
            issued += 1
            counted += begin is not None
            if begin is None and time.perf_counter() - start >= settle:
                torch.cuda.synchronize()
                begin = time.perf_counter()
            elif issued % 8 == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        spans[side].append((begin, time.perf_counter()))
        calls[side] += counted
    measured = {}
    for side in ("a", "b"):
        measured[side] = power.during(spans[side])
        if measured[side] is not None:
            ms = sum(t1 - t0 for t0, t1 in spans[side]) * 1e3 / calls[side]
            measured[side].update(ms_per_call=ms, mj_per_call=measured[side]["power_w"] * ms)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="a copy of kernels/ to compare against")
    parser.add_argument("--passes", default="fwd,bwd")
    parser.add_argument("--head-dims", default="64")
    parser.add_argument("--seq-lens", default="4096,16384")
    parser.add_argument("--dropout", default="0")
    parser.add_argument("--rounds", type=int, default=2, help="A, B timings per pass; their medians compare")
    parser.add_argument(
        "--masks", default="none", help="comma-separated: none (causal only), full (non-causal) or bench_masks' masks"
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--power", action="store_true", help="also the SM clock, power and energy per call")
    args = parser.parse_args()
    passes = args.passes.split(",")
    if unknown := set(passes) - set(PASSES):
        parser.error(f"unknown passes {sorted(unknown)}; choose from {', '.join(PASSES)}")

    if unknown := set(args.masks.split(",")) - {"none", "full", *MASKS}:
        parser.error(f"unknown masks {sorted(unknown)}; choose from none, full, {', '.join(MASKS)}")
    baseline = load_launch(args.baseline, "ab_baseline_kernels")
    power = PowerSampler(torch.cuda.current_device()) if args.power else None
    power_columns = "  base: clock, power, energy; new: the same" if power else ""
    print(f"{'mask':12s} {'D':>4s} {'T':>6s} {'drop':>5s} {'pass':8s} {'base ms':>8s} {'new ms':>8s} {'new TF/s':>8s}"
          f" {'speed-up':>8s} {'max|diff|':>9s}{power_columns}")  # fmt: skip
    rows = []
    with power or contextlib.nullcontext():
        for head_dim in map(int, args.head_dims.split(",")):
            for seq_len in map(int, args.seq_lens.split(",")):
                for dropout in map(float, args.dropout.split(",")):
                    for mask in args.masks.split(","):
                        rows += compare(baseline, passes, head_dim, seq_len, dropout, args.rounds, mask, power)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                    command=" ".join(sys.argv), baseline=str(args.baseline))  # fmt: skip
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
