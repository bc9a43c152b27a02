"""Time train.py's own training step beside a minimal compiled nanoGPT-style step, in one process.

train.py's step is built the way the trainer builds it: Hydra composes configs/ with the row's overrides, then
training/step.py's build_model_and_optimizer -> compile_model -> TrainStep, and each step's numbers are read back
one step late through StepNumbers, as training/loop.py does. The reference is scripts/nanogpt_reference.py (loss
inside the model, cuDNN SDPA, fused AdamW, no host sync, no clipping). Both get the same batches from
data/batches.py's get_batch (pinned memory, non-blocking copies) over random tokens.

Method (shared/anchors/h100-attention.md, "A GPT-2 training step"): GPT-2 124M, 32,768 tokens per step in one
micro-batch (B = 32768 // T), bf16 autocast, torch.compile, 3 warm-up + 10 timed steps between two device
synchronisations. tokens/s; MFU = tokens/s x (6·N + 6·L·d·T) / peak bf16 FLOP/s (training/mfu.py); peak memory
allocated from the model's construction to the last timed step. torch._dynamo.reset() between models, so no model
is recompiled with dynamic shapes. Out of memory is a result; any other failure is recorded with its message (exit
status 1).

    python scripts/bench_train.py --out $OUT/bench_train.json                 # GPU: every T, dropout 0 and 0.1
    python scripts/bench_train.py --dropout 0 --seq-lens 1024,2048 --out ...  # a part of the grid
    python scripts/bench_train.py --positions learned,rope --providers flash --out ...  # what rotary costs
    python scripts/bench_train.py --smoke --out /tmp/smoke.json               # CPU: gpt2-tiny, T = 64, 2 steps

The JSON is rewritten after every row, so a killed job keeps what it measured; --budget-min starts no row that
would end past that many minutes (judged by the longest row so far) and records the rest as "not run".
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from nanogpt_reference import ReferenceConfig, reference_step
from torch import Tensor

from flashgpt.command_line import command_line, csv_list, write_json
from flashgpt.data.batches import get_batch
from flashgpt.training.mfu import device_name, mfu, peak_flops_per_sec

ROOT = Path(__file__).resolve().parents[1]
PROVIDERS = ("reference", "naive", "flash", "sdpa")  # reference: scripts/nanogpt_reference.py; the rest: train.py
POSITIONS = ("learned", "rope")  # train.py's model.position_embedding; the reference has a learned table only
RANDOM_TOKENS = 1 << 22  # the corpus the random windows are cut from
Step = Callable[[Callable[[], tuple[Tensor, Tensor]]], Tensor]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--providers", type=csv_list(str), default=list(PROVIDERS), help="comma-separated")
    parser.add_argument("--seq-lens", type=csv_list(int), default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--dropout", type=csv_list(float), default=[0.0, 0.1])
    parser.add_argument(
        "--positions",
        type=csv_list(str),
        default=["learned"],
        help="train.py's model.position_embedding, comma-separated",
    )
    parser.add_argument("--tokens-per-step", type=int, default=32768, help="one micro-batch of this many tokens")
    parser.add_argument("--model", default="gpt2", help="a configs/model/ preset")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend; 'none': eager")
    parser.add_argument("--budget-min", type=float, help="start no row that would end past this many minutes")
    parser.add_argument("--smoke", action="store_true", help="CPU check: gpt2-tiny, T = 64, dropout 0.1, 2 steps")
    parser.add_argument("--out", type=Path, help="JSON file (default results/bench_train/<device>-<date>.json)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.seq_lens, args.dropout, args.tokens_per_step = "gpt2-tiny", [64], [0.1], 256
        args.warmup, args.steps, args.compile_backend = 1, 1, "aot_eager"  # traced whole, run without codegen
    if unknown := set(args.providers) - set(PROVIDERS):
        parser.error(f"unknown providers {sorted(unknown)}; choose from {list(PROVIDERS)}")
    if unknown := set(args.positions) - set(POSITIONS):
        parser.error(f"unknown --positions {sorted(unknown)}; choose from {list(POSITIONS)}")
    if bad := [t for t in args.seq_lens if args.tokens_per_step % t]:
        parser.error(f"--tokens-per-step {args.tokens_per_step} is not a multiple of seq_len {bad}")
    return args


def compose_config(
    args: argparse.Namespace, attention: str, positions: str, seq_len: int, dropout: float, device: torch.device
):
    """The trainer's typed, validated config for one row (Hydra, imported only here)."""
    from hydra import compose, initialize_config_dir

    from flashgpt.training.config import register_configs, typed_config, validate

    register_configs()
    overrides = [
        f"model={args.model}",
        f"attention={attention}",
        f"model.position_embedding={positions}",
        f"seq_len={seq_len}",
        f"model.dropout={dropout}",
        f"train.batch_size={args.tokens_per_step // seq_len}",
        "train.grad_accum=1",
        f"device={device.type}",
        f"compile={args.compile_backend != 'none'}",
    ]
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = typed_config(compose(config_name="config", overrides=overrides))
    validate(cfg)
    return cfg


def trainpy_step(cfg, args: argparse.Namespace, device: torch.device) -> tuple[Step, int, dict]:
    """train.py's step for `cfg`, built through the trainer's own functions; returns (step, flops per token,
    what to record about it). The step queues one optimizer step and reads the previous one's numbers."""
    from flashgpt.model.backends import prepare_backend
    from flashgpt.training.distributed import DistContext
    from flashgpt.training.step import (
        StepNumbers,
        TrainStep,
        attention_traces_in_one_graph,
        build_model_and_optimizer,
        compile_model,
    )

    prepare_backend(cfg.attention.name, device)
    model, optimizer, scheduler = build_model_and_optimizer(cfg, device)
    compiled = args.compile_backend != "none"
    info = {"fullgraph": attention_traces_in_one_graph(model) if compiled else None}
    forward = compile_model(model, backend=args.compile_backend) if compiled else model
    ctx = DistContext(rank=0, local_rank=0, world_size=1, device=device)
    train_step = TrainStep(
        forward,
        optimizer,
        scheduler,
        grad_accum=1,
        grad_clip=cfg.train.grad_clip,
        ctx=ctx,
        document_mask=cfg.data.document_mask,
    )
    previous: list[StepNumbers] = []

    def step(next_batch: Callable[[], tuple[Tensor, Tensor]]) -> Tensor:
        stats = train_step(next_batch)
        if previous:  # the trainer reads step k - 1 while the device runs step k
            previous.pop().values()
        previous.append(StepNumbers(stats))
        return stats[0]

    return step, model.flops_per_token(cfg.seq_len), info


def reference_flops_per_token(model: torch.nn.Module, cfg: ReferenceConfig) -> int:
    """6·N + 6·L·d·T with N the parameters without the position table, as GPT.flops_per_token counts."""
    n_params = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    return 6 * n_params + 6 * cfg.n_layer * cfg.d_model * cfg.block_size


def measure(step: Step, next_batch: Callable[[], tuple[Tensor, Tensor]], args: argparse.Namespace, cuda: bool) -> dict:
    """Warm up, then time args.steps steps between two synchronisations; returns timing and the last loss."""
    for _ in range(args.warmup):
        step(next_batch)
    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(args.steps):
        loss = step(next_batch)
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    return {"step_ms": 1e3 * elapsed / args.steps, "loss": loss.item()}


def bench_row(
    args: argparse.Namespace, provider: str, positions: str, seq_len: int, dropout: float, device: torch.device
) -> dict:
    cuda = device.type == "cuda"
    batch = args.tokens_per_step // seq_len
    row = {"provider": provider, "positions": positions, "seq_len": seq_len, "dropout": dropout, "batch": batch}
    started = time.perf_counter()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    tokens = np.random.default_rng(0).integers(0, 50257, RANDOM_TOKENS, dtype=np.uint16)
    starts = np.random.default_rng(1)

    def next_batch() -> tuple[Tensor, Tensor]:
        return get_batch(tokens, starts.integers(0, len(tokens) - seq_len - 1, batch), seq_len, device)

    try:
        torch.manual_seed(0)
        attention = "sdpa" if provider == "reference" else provider
        cfg = compose_config(args, attention, positions, seq_len, dropout, device)
        if provider == "reference":
            m = cfg.model
            ref_cfg = ReferenceConfig(m.n_layer, m.n_head, m.d_model, m.vocab_size, seq_len, dropout)
            backend = None if args.compile_backend == "none" else args.compile_backend
            model, step = reference_step(ref_cfg, device, backend)
            flops_per_token = reference_flops_per_token(model, ref_cfg)
        else:
            step, flops_per_token, info = trainpy_step(cfg, args, device)
            row.update(info)
        timing = measure(step, next_batch, args, cuda)
    except torch.cuda.OutOfMemoryError as error:
        row.update(status="oom", message=str(error).splitlines()[0])
    except Exception as error:  # recorded, and the exit status says so: one broken provider must not hide the rest
        traceback.print_exc()
        row.update(status="error", message=f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}")
    else:
        tokens_per_sec = args.tokens_per_step / (timing["step_ms"] / 1e3)
        peak = peak_flops_per_sec(device_name(device))
        row.update(status="ok", tokens_per_sec=tokens_per_sec, mfu=mfu(flops_per_token, tokens_per_sec, peak, 1))
        row.update(timing)
    row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    row["seconds"] = time.perf_counter() - started  # build + compile + every step
    return row


def release() -> None:
    """Free the last model's memory and compiled graphs before the next model is built."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    torch._dynamo.reset()


def _cell(row: dict | None) -> str:
    if row is None:
        return "—"
    if row["status"] != "ok":
        return {"oom": "out of memory", "not run": "not run"}.get(row["status"], "error")
    speed = row["tokens_per_sec"]
    cell = f"{speed / 1e3:.0f}K tok/s" if speed >= 1e4 else f"{speed:.0f} tok/s"
    if row["mfu"] is not None:
        cell += f", MFU {row['mfu']:.1%}"
    if row["peak_gib"] is not None:
        cell += f", {row['peak_gib']:.1f} GiB"
    return cell


def markdown_tables(rows: Sequence[dict]) -> str:
    """One table per dropout: providers x T, then the speed ratios the issue's targets are stated in (learned
    positions) and what rotary positions cost each provider."""
    out = []
    for dropout in sorted({r["dropout"] for r in rows}):
        at = {(r["provider"], r.get("positions", "learned"), r["seq_len"]): r for r in rows if r["dropout"] == dropout}
        seq_lens = sorted({t for _, _, t in at})
        variants = [(p, e) for p in PROVIDERS for e in POSITIONS if any((p, e) == (q, f) for q, f, _ in at)]
        out += [f"**dropout {dropout}**", "", "| step | " + " | ".join(f"T={t}" for t in seq_lens) + " |"]
        out.append("|---" * (len(seq_lens) + 1) + "|")
        for provider, positions in variants:
            name = "nanoGPT-style reference" if provider == "reference" else f"train.py attention={provider}"
            name += ", rope" if positions == "rope" else ""
            out.append(f"| {name} | " + " | ".join(_cell(at.get((provider, positions, t))) for t in seq_lens) + " |")
        pairs = [
            ((num, "learned"), (den, "learned"), f"{num} / {den}")
            for num, den in (("flash", "sdpa"), ("flash", "reference"))
        ]
        pairs += [((p, "rope"), (p, "learned"), f"{p}: rope / learned") for p in PROVIDERS]
        for num, den, label in pairs:
            ratios = [_ratio(at.get((*num, t)), at.get((*den, t))) for t in seq_lens]
            if any(r is not None for r in ratios):
                cells = " | ".join("—" if r is None else f"{r:.2f}x" for r in ratios)
                out.append(f"| {label} | {cells} |")
        out.append("")
    return "\n".join(out)


def _ratio(num: dict | None, den: dict | None) -> float | None:
    if num is None or den is None or num["status"] != "ok" or den["status"] != "ok":
        return None
    return num["tokens_per_sec"] / den["tokens_per_sec"]


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    cuda = torch.cuda.is_available() and not args.smoke
    if not cuda:  # triton reads it once, at its own import: before the compiler or the kernels import triton
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = torch.device("cuda" if cuda else "cpu")
    name, date = device_name(device), datetime.date.today().isoformat()
    slug = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
    out = args.out or ROOT / "results" / "bench_train" / f"{slug}-{date}.json"
    report = {
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": date,
        "command": command_line("bench_train.py", argv),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "complete": False,
        "rows": [],
    }
    grid = [
        (p, e, t, d)
        for d in args.dropout
        for t in args.seq_lens
        for p in args.providers
        for e in args.positions
        if p != "reference" or e == "learned"
    ]
    started, longest = time.perf_counter(), 0.0
    for provider, positions, seq_len, dropout in grid:
        elapsed = time.perf_counter() - started
        if args.budget_min is not None and elapsed + longest > 60 * args.budget_min:
            row = dict(provider=provider, positions=positions, seq_len=seq_len, dropout=dropout, status="not run")
        else:
            row = bench_row(args, provider, positions, seq_len, dropout, device)
            release()
            longest = max(longest, row["seconds"])
        print(json.dumps(row), flush=True)
        report["rows"].append(row)
        write_json(out, report)
    report["complete"] = all(r["status"] != "not run" for r in report["rows"])
    write_json(out, report)
    print("\n" + markdown_tables(report["rows"]))
    print(f"wrote {out}")
    return 1 if any(r["status"] == "error" for r in report["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
