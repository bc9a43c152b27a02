"""Tune the FlashAttention launch configurations on this GPU and write the table `kernels/tuning.py` reads.

Each pass (forward, backward dK/dV, backward dQ, fused backward) is timed on its own, for every candidate tile
shape, warp count and pipeline depth that fits the head dim, at the benchmark's shapes (B = 16384 // T, H·D = 768 up
to D = 64 and 2048 above, causal, bf16). Head dims are the kernels' native ones (16, 32, 64, 128, 256):
`flash_attention` pads every other head dim to the next of these, and looks the padded one up. The fastest candidate
per (pass, head dim, dtype, causal, dropout, T bucket) goes into the table, and the whole measurement into a JSON
log (kernel time only: no autograd, no launch gaps). Candidates that do not compile (too much shared memory) are
skipped.

    python scripts/tune_attention.py --out kernels/tuned_h100.json --log results/tuning/h100.json
"""

import argparse
import functools
import json
import math
import platform
import sys
import time
from dataclasses import replace
from datetime import date
from pathlib import Path

import torch
import triton

from flashgpt.kernels.launch import (
    AttentionParams,
    launch_dkdv,
    launch_dq,
    launch_dq_convert,
    launch_forward,
    launch_preprocess,
)
from flashgpt.kernels.tuning import HOPPER_PASSES, NATIVE_HEAD_DIMS, TUNED_TABLE, LaunchConfig, table_key

CANDIDATES: dict[str, list[LaunchConfig]] = {
    "fwd": [
        LaunchConfig(128, 64, 4, 3),
        LaunchConfig(128, 64, 4, 4),
        LaunchConfig(128, 64, 8, 3),
        LaunchConfig(128, 128, 8, 3),
        LaunchConfig(128, 128, 8, 2),
        LaunchConfig(128, 32, 4, 3),
        LaunchConfig(64, 64, 4, 3),
        LaunchConfig(64, 32, 4, 4),
        LaunchConfig(64, 64, 8, 3),
        LaunchConfig(64, 32, 4, 2),
        LaunchConfig(64, 32, 8, 2),
        LaunchConfig(64, 64, 8, 2),
    ],
    "bwd_dkdv": [
        LaunchConfig(32, 128, 4, 3),
        LaunchConfig(32, 128, 8, 3),
        LaunchConfig(64, 128, 8, 3),
        LaunchConfig(64, 128, 8, 2),
        LaunchConfig(32, 64, 4, 3),
        LaunchConfig(64, 64, 4, 3),
        LaunchConfig(16, 64, 4, 4),
        LaunchConfig(16, 128, 4, 3),
        LaunchConfig(64, 64, 8, 3),
        LaunchConfig(32, 64, 8, 3),
        LaunchConfig(16, 32, 8, 1),
        LaunchConfig(16, 64, 8, 2),
        LaunchConfig(32, 64, 8, 2),
    ],
    "bwd_fused": [
        LaunchConfig(32, 128, 4, 3),
        LaunchConfig(32, 128, 8, 3),
        LaunchConfig(64, 128, 8, 3),
        LaunchConfig(64, 128, 8, 2),
        LaunchConfig(128, 128, 8, 2),
        LaunchConfig(32, 64, 4, 3),
        LaunchConfig(64, 64, 4, 3),
        LaunchConfig(64, 64, 8, 3),
        LaunchConfig(16, 64, 4, 4),
        LaunchConfig(16, 128, 4, 3),
        LaunchConfig(16, 32, 8, 1),
        LaunchConfig(16, 64, 8, 2),
        LaunchConfig(32, 64, 8, 2),
    ],
    "bwd_dq": [
        LaunchConfig(128, 32, 4, 3),
        LaunchConfig(128, 32, 8, 3),
        LaunchConfig(128, 64, 8, 3),
        LaunchConfig(128, 64, 8, 2),
        LaunchConfig(64, 32, 4, 3),
        LaunchConfig(64, 64, 4, 3),
        LaunchConfig(128, 64, 4, 3),
        LaunchConfig(64, 16, 4, 4),
        LaunchConfig(64, 64, 8, 3),
        LaunchConfig(32, 16, 8, 1),
        LaunchConfig(64, 16, 8, 2),
        LaunchConfig(64, 32, 8, 2),
    ],
}
HEADS = {16: 48, 32: 24, 64: 12, 128: 16, 256: 8}


def candidates(kernel_pass: str, head_dim: int) -> list[LaunchConfig]:
    """The candidates worth compiling at this head dim: tiles of D columns grow with D, and past these sizes they
    spill registers or exceed shared memory (Hopper's 228 KiB)."""

    def fits(cfg: LaunchConfig) -> bool:
        if head_dim == 256:
            return cfg.block_m * cfg.block_n <= 64 * 64 and cfg.num_stages <= 2 and cfg.num_warps == 8
        if head_dim == 128:
            return cfg.block_m * cfg.block_n <= 128 * 64 or cfg.num_stages <= 2
        return True

    return [cfg for cfg in CANDIDATES[kernel_pass] if fits(cfg)]


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


def tune_shape(
    head_dim: int,
    seq_len: int,
    dropout_p: float,
    dtype: torch.dtype,
    passes: list[str],
    warmup: int,
    rep: int,
    dq_reduce: str,
    split: tuple[LaunchConfig, LaunchConfig] | None,
    tma_top: int = 0,
) -> dict:
    """Time every candidate of every pass at one shape; returns {pass: [(config, ms) ...]}. bwd_fused is timed with
    the two small launches around it (δ and zeroing before, dQ's scale and cast after): the whole fused backward.
    With `split` (the bwd_dq and bwd_dkdv configurations), "split" is the deterministic backward at those, timed
    the same way, for the choice between the two (`kernels.tuning.backward_schedule`). The tma_top fastest
    candidates of each pass are timed again with their tiles loaded through tensor descriptors (`tma`)."""
    batch, heads = max(1, 16384 // seq_len), HEADS[head_dim]
    q, k, v, do = (torch.randn(batch, heads, seq_len, head_dim, device="cuda", dtype=dtype) for _ in range(4))
    params = AttentionParams(True, dropout_p, 1 / math.sqrt(head_dim), seed=1234, offset=0)
    o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
    lse = torch.empty(batch, heads, seq_len, device="cuda", dtype=torch.float32)
    delta = torch.empty_like(lse)
    launch_forward(q, k, v, o, lse, params, CANDIDATES["fwd"][0])
    dq_acc = torch.empty(q.shape, device="cuda", dtype=torch.float32)
    launch_preprocess(o, do, delta)

    def fused(cfg: LaunchConfig) -> None:
        launch_preprocess(o, do, delta, None, dq_acc)
        launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, cfg, dq_acc=dq_acc, dq_reduce=dq_reduce)
        launch_dq_convert(dq_acc, dq, params.softmax_scale)

    runners = {
        "fwd": lambda cfg: launch_forward(q, k, v, o, lse, params, cfg),
        "bwd_dkdv": lambda cfg: launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, cfg),
        "bwd_dq": lambda cfg: launch_dq(q, k, v, do, lse, delta, dq, params, cfg),
        "bwd_fused": fused,
    }
    if split is not None:
        dq_cfg, dkdv_cfg = split

        def split_backward(_: LaunchConfig) -> None:
            launch_dq(q, k, v, do, lse, delta, dq, params, dq_cfg, o=o)
            launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, dkdv_cfg)

        runners["split"] = split_backward
        passes = [*passes, "split"]

    def timed(kernel_pass: str, configs: list[LaunchConfig]) -> list[tuple[LaunchConfig, float]]:
        timings = []
        for cfg in configs:
            launch = functools.partial(runners[kernel_pass], cfg)
            try:
                launch()
                torch.cuda.synchronize()
                ms = triton.testing.do_bench(launch, warmup=warmup, rep=rep, return_mode="median")
            except Exception as err:  # out of resources: record and move on
                print(f"  skip {kernel_pass} {cfg}: {type(err).__name__}: {str(err).splitlines()[0][:100]}")
                continue
            timings.append((cfg, ms))
        return timings

    results = {}
    for kernel_pass in passes:
        if kernel_pass == "split":
            results[kernel_pass] = timed(kernel_pass, [dq_cfg])
            continue
        timings = timed(kernel_pass, candidates(kernel_pass, head_dim))
        # The tile loads through tensor descriptors, for the fastest pointer-load configurations only.
        fastest = sorted(timings, key=lambda t: t[1])[:tma_top]
        results[kernel_pass] = timings + timed(kernel_pass, [replace(cfg, tma=True) for cfg, _ in fastest])
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seq-lens", default="1024,2048,4096,8192,16384")
    parser.add_argument("--dropout", default="0,0.1")
    parser.add_argument(
        "--passes", default="fwd,bwd_dkdv,bwd_dq,bwd_fused", help="tune these; keep the table's entries for the others"
    )
    parser.add_argument(
        "--dq-reduce",
        choices=("tma", "atomic"),
        default="tma",
        help="how bwd_fused sums dQ (tma: Hopper only)",
    )
    parser.add_argument(
        "--tma-top", type=int, default=4, help="time this many fastest candidates again with TMA tile loads (Hopper)"
    )
    parser.add_argument("--warmup", type=int, default=10, help="ms")
    parser.add_argument("--rep", type=int, default=40, help="ms")
    parser.add_argument("--out", type=Path, default=Path("kernels/tuned_h100.json"))
    parser.add_argument("--log", type=Path, default=None, help="JSON with every candidate's timing")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("tune_attention.py needs a CUDA GPU")
    head_dims = [int(d) for d in args.head_dims.split(",")]
    if unknown := sorted(set(head_dims) - set(NATIVE_HEAD_DIMS)):
        sys.exit(f"--head-dims: {unknown} are not native head dims {NATIVE_HEAD_DIMS} (others are padded to these)")

    dtype, dtype_name = torch.bfloat16, "bfloat16"
    passes = args.passes.split(",")
    # Shapes and passes this run does not time keep their entries: from --out, or for a new file the committed table.
    existing = json.loads((args.out if args.out.exists() else TUNED_TABLE).read_text())
    table, schedules = existing.get("configs", {}), existing.get("backward", {})
    log = []
    started = time.time()
    for head_dim in head_dims:
        for dropout_p in map(float, args.dropout.split(",")):
            for seq_len in map(int, args.seq_lens.split(",")):
                key_of = functools.partial(
                    table_key, head_dim=head_dim, dtype=dtype_name, causal=True, dropout=dropout_p > 0, bucket=seq_len
                )
                tune_passes = [p for p in passes if p in ("fwd", "bwd_dq", "bwd_dkdv")]
                results = tune_shape(
                    head_dim, seq_len, dropout_p, dtype, tune_passes, args.warmup, args.rep, args.dq_reduce, None,
                    args.tma_top,
                )  # fmt: skip
                if "bwd_fused" in passes:
                    # The split backward at this run's best configurations, or the table's.
                    split = tuple(
                        min(results[p], key=lambda t: t[1])[0] if p in results else LaunchConfig(**table[key_of(p)])
                        for p in ("bwd_dq", "bwd_dkdv")
                    )
                    results |= tune_shape(
                        head_dim, seq_len, dropout_p, dtype, ["bwd_fused"], args.warmup, args.rep, args.dq_reduce,
                        split, args.tma_top,
                    )  # fmt: skip
                    fused_ms, split_ms = (min(ms for _, ms in results[p]) for p in ("bwd_fused", "split"))
                    schedules[key_of("backward")] = "fused" if fused_ms < split_ms else "split"
                batch, heads = max(1, 16384 // seq_len), HEADS[head_dim]
                fwd_flops = 4 * batch * heads * seq_len**2 * head_dim * 0.5
                best = {}
                for kernel_pass, timings in results.items():
                    cfg, ms = min(timings, key=lambda t: t[1])
                    best[kernel_pass] = ms
                    key = key_of(kernel_pass)
                    if kernel_pass != "split":
                        table[key] = cfg.as_dict()
                    if kernel_pass == "split":  # one timing, at the bwd_dq and bwd_dkdv configurations
                        configs = {"bwd_dq": split[0].as_dict(), "bwd_dkdv": split[1].as_dict()}
                        log.append({"key": key, "best": {**configs, "ms": ms}})
                    else:
                        timings_ms = [{**c.as_dict(), "ms": t} for c, t in timings]
                        log.append({"key": key, "timings_ms": timings_ms, "best": {**cfg.as_dict(), "ms": ms}})
                # FLOPs each kernel actually does, in units of the forward: S and dP are recomputed in both halves.
                # The two whole backwards are counted alike, at the 2.5 of the benchmark (fused and split compare).
                rates = {"fwd": 1.0, "bwd_dkdv": 2.0, "bwd_dq": 1.5, "bwd_fused": 2.5, "split": 2.5}
                cells = [f"{p}: {tflops(rates[p] * fwd_flops, ms):.0f} TFLOP/s" for p, ms in best.items()]
                print(f"D={head_dim} dropout={dropout_p} T={seq_len}: " + ", ".join(cells), flush=True)
                save(args, table, schedules, log, started)  # after every shape: a stopped job keeps what it measured
    print(f"wrote {args.out} ({len(table)} entries) in {round(time.time() - started)} s")


def save(args: argparse.Namespace, table: dict, schedules: dict, log: list, started: float) -> None:
    meta = {
        "device": torch.cuda.get_device_name(),
        "date": date.today().isoformat(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "tuning_seconds": round(time.time() - started),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tuned = {"meta": meta, "configs": dict(sorted(table.items())), "backward": dict(sorted(schedules.items()))}
    # Sections this tuner does not measure are carried over as they are: document masks' own backward choices
    # (measured with masks) and the Gluon passes' entries (measured by their own A/Bs).
    existing = json.loads((args.out if args.out.exists() else TUNED_TABLE).read_text())
    for section in ("backward_documents", *HOPPER_PASSES):
        if entries := existing.get(section):
            tuned[section] = entries
            meta[section] = existing.get("meta", {}).get(section)
    args.out.write_text(json.dumps(tuned, indent=1) + "\n")
    if args.log:
        args.log.parent.mkdir(parents=True, exist_ok=True)
        args.log.write_text(json.dumps({"meta": meta, "shapes": log}, indent=1) + "\n")


if __name__ == "__main__":
    main()
