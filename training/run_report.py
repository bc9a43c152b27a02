"""Turn training runs and kernel benchmarks into results/<name>/: report.md, PNG plots and raw/, the small raw
files they were built from (config.yaml, overrides.yaml, metrics.jsonl, result.json, sweep.json per run; the
benchmark JSON). The report is always built from raw/, so the committed folder rebuilds itself with no GPU.

    python scripts/report.py --out results/long_context --speed runs/long_context_speed --ppl runs/long_context_ppl \\
        --bench results/bench_attention/<device>-<date>.json
    python scripts/report.py --from-raw results/long_context                  # rebuild report.md and plots
    python scripts/report.py --from-raw results/long_context --readme-table   # print the headline tables
    python scripts/report.py --from-raw results/long_context --wandb offline  # + plots, tables, folder to W&B
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # no display on GPU boxes or CI
import matplotlib.pyplot as plt
import yaml

from flashgpt.benchmark_tables import anchors_for, markdown_tables
from flashgpt.training.study_plan import read_json

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ("speed", "ppl")  # short timed runs; longer perplexity runs
WARMUP_STEPS = 5  # logged steps skipped for throughput: kernel compilation, autotuning, allocator growth
# In a Hydra run dir -> in raw/: the files worth keeping (not checkpoints, not wandb).
RAW_FILES = {
    ".hydra/config.yaml": "config.yaml",
    ".hydra/overrides.yaml": "overrides.yaml",
    "metrics.jsonl": "metrics.jsonl",
    "result.json": "result.json",
    "sweep.json": "sweep.json",  # written by scripts/sweep.py: exact command, start time, exit code
    "resolved_config.yaml": "resolved_config.yaml",  # the config with every ${...} resolved (e.g. batch sizes)
}


@dataclass
class Run:
    name: str
    backend: str
    seq_len: int
    status: str  # ok | oom | nan (train.py) | crashed (scripts/sweep.py) | incomplete (no result.json)
    command: str
    sweep_command: str | None = None  # the scripts/sweep.py invocation that launched it
    device: str | None = None
    date: str | None = None
    tokens_per_sec: float | None = None
    mfu: float | None = None
    peak_gib: float | None = None
    requested_gib: float | None = None  # the allocation that failed, for out-of-memory runs
    message: str | None = None  # why a run that is not ok ended
    tokens: int | None = None
    val_loss: float | None = None
    val_ppl: float | None = None
    loss_by_position: dict[str, float] = field(default_factory=dict)


# --- loading ----------------------------------------------------------------------------------------------


class ReportError(ValueError):
    """An input report.py cannot use: the message names it and what it expected."""


def _read_json(path: Path) -> dict:
    """study_plan.read_json, its error an input error of the report."""
    try:
        return read_json(path)
    except ValueError as error:
        raise ReportError(str(error)) from error


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _command(run_dir: Path, sweep: dict) -> str:
    """The exact command from sweep.json, else rebuilt from the overrides Hydra recorded."""
    if "command" in sweep:
        return shlex.join(sweep["command"])
    overrides = (
        yaml.safe_load((run_dir / "overrides.yaml").read_text()) if (run_dir / "overrides.yaml").exists() else []
    )
    return shlex.join(["python", "train.py", *overrides])


def load_run(run_dir: Path, name: str) -> Run:
    """One run from its raw files (run_dir holds config.yaml, metrics.jsonl, ... as in raw/). A run that died
    before Hydra wrote its config is known from the result.json that scripts/sweep.py wrote for it."""
    config_path = run_dir / "config.yaml"
    config = yaml.safe_load(config_path.read_text()) if config_path.exists() else {}
    result, sweep = _read_json(run_dir / "result.json"), _read_json(run_dir / "sweep.json")
    metrics_path = run_dir / "metrics.jsonl"
    if not config and not {"backend", "seq_len"} <= result.keys():
        raise ReportError(
            f"{run_dir}: not a train.py run (no config.yaml, and its result.json has no backend and seq_len)"
        )
    try:
        records = [json.loads(line) for line in metrics_path.read_text().splitlines()] if metrics_path.exists() else []
    except json.JSONDecodeError as error:
        raise ReportError(f"{metrics_path} is not JSON lines ({error})") from error
    train = [r for r in records if "perf/tokens_per_sec" in r]
    steady = [r for r in train if r["step"] > WARMUP_STEPS] or train
    evals = [r for r in records if "val/loss" in r]
    peaks = [r.get("mem/peak_gib") for r in train] + [result.get("mem/peak_gib")]
    tokens = [r["train/tokens"] for r in train]
    return Run(
        name=name,
        backend=config["attention"]["name"] if config else result["backend"],
        seq_len=config["seq_len"] if config else result["seq_len"],
        status=result.get("status", "incomplete"),
        command=_command(run_dir, sweep),
        sweep_command=sweep.get("sweep_command"),
        device=result.get("device"),
        date=sweep.get("started", "")[:10] or None,
        tokens_per_sec=_median([r["perf/tokens_per_sec"] for r in steady]),
        mfu=_median([r.get("perf/mfu") for r in steady]),
        peak_gib=max((p for p in peaks if p is not None), default=None),
        requested_gib=result.get("oom/requested_gib"),
        message=result.get("message"),
        tokens=max(tokens, default=None),
        val_loss=evals[-1]["val/loss"] if evals else None,
        val_ppl=evals[-1]["val/ppl"] if evals else None,
        loss_by_position=evals[-1].get("val/loss_by_position", {}) if evals else {},
    )


def _run_dirs(root: Path, markers: Sequence[str]) -> list[Path]:
    """The dirs under `root` holding any of the `markers` (paths relative to a run dir)."""
    return sorted({p.parents[len(Path(m).parts) - 1] for m in markers for p in root.rglob(m)})


def load_group(group_dir: Path) -> list[Run]:
    run_dirs = _run_dirs(group_dir, ["config.yaml", "result.json"])
    runs = [load_run(d, str(d.relative_to(group_dir))) for d in run_dirs]
    return sorted(runs, key=lambda r: (r.backend, r.seq_len, r.name))


def load_bench(raw: Path) -> dict | None:
    """The benchmark JSON copied into raw/bench, if any."""
    files = sorted((raw / "bench").glob("*.json"))
    return read_bench(files[-1]) if files else None


BENCH_KEYS = ("device", "dtype", "tokens_per_call", "command", "rows")


def read_bench(path: Path) -> dict:
    """A scripts/bench_attention.py JSON, checked to be one."""
    if not path.is_file():
        raise ReportError(f"{path}: no such benchmark file (a scripts/bench_attention.py --out JSON)")
    bench = _read_json(path)
    missing = [key for key in BENCH_KEYS if not isinstance(bench, dict) or key not in bench]
    if missing:
        raise ReportError(f"{path} is not a scripts/bench_attention.py JSON: it has no {', '.join(missing)}")
    return bench


def run_dirs_in(source: Path, flag: str) -> list[Path]:
    """The train.py run dirs under `source` (given as `flag`); an error when there are none."""
    if not source.is_dir():
        raise ReportError(f"{flag} {source}: no such directory (a sweep's output dir of train.py runs)")
    run_dirs = _run_dirs(source, [".hydra/config.yaml", "result.json"])
    if not run_dirs:
        raise ReportError(f"{flag} {source} holds no train.py run dir (none has .hydra/config.yaml or result.json)")
    return run_dirs


def import_runs(source: Path, dest: Path, run_dirs: list[Path]) -> int:
    """Copy the raw files of `run_dirs` (under `source`) into `dest`, replacing it only once the copy is complete;
    returns the count."""
    staging = dest.with_name(f".{dest.name}.new")
    shutil.rmtree(staging, ignore_errors=True)
    for run_dir in run_dirs:
        target = staging / run_dir.relative_to(source)
        target.mkdir(parents=True)
        for src, dst in RAW_FILES.items():
            if (run_dir / src).exists():
                shutil.copyfile(run_dir / src, target / dst)
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)
    return len(run_dirs)


# --- formatting -------------------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    return "–" if value is None else f"{value * scale:{spec}}{suffix}"


def _status(run: Run) -> str:
    if run.status == "oom":
        asked = "" if run.requested_gib is None else f", asked +{run.requested_gib:.2f} GiB"
        return f"OOM{asked}"
    return run.status


def runs_table(runs: list[Run]) -> str:
    header = "| backend | seq_len | status | tokens/s | MFU | peak GiB | tokens seen | val loss | val ppl |"
    lines = [header, "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        cells = [
            r.backend,
            str(r.seq_len),
            _status(r),
            _fmt(r.tokens_per_sec, ",.0f"),
            _fmt(r.mfu, ".1f", 100, "%"),
            _fmt(r.peak_gib, ".2f"),
            _fmt(r.tokens, ",.0f"),
            _fmt(r.val_loss, ".3f"),
            _fmt(r.val_ppl, ".2f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _by_backend(runs: list[Run]) -> dict[str, dict[int, Run]]:
    table: dict[str, dict[int, Run]] = {}
    for r in runs:
        table.setdefault(r.backend, {})[r.seq_len] = r
    return table


def throughput_pivot(runs: list[Run]) -> str:
    """The headline: backend x seq_len -> tokens/s, MFU, peak memory (or why there is none)."""
    seq_lens = sorted({r.seq_len for r in runs})
    lines = ["| attention | " + " | ".join(f"T={t}" for t in seq_lens) + " |", "|---" * (len(seq_lens) + 1) + "|"]
    for backend, by_t in _by_backend(runs).items():
        cells = [_pivot_cell(by_t.get(t)) for t in seq_lens]
        lines.append(f"| {backend} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _has_speed(run: Run) -> bool:
    return run.status == "ok" and run.tokens_per_sec is not None


def _pivot_cell(run: Run | None) -> str:
    if run is None:
        return ""
    if not _has_speed(run):
        return _status(run)
    mfu = f", MFU {run.mfu:.1%}" if run.mfu is not None else ""
    mem = f", {run.peak_gib:.1f} GiB" if run.peak_gib is not None else ""
    speed = run.tokens_per_sec
    return f"{speed / 1e3:.0f}K tok/s{mfu}{mem}" if speed >= 1e4 else f"{speed:.0f} tok/s{mfu}{mem}"


def position_table(runs: list[Run]) -> str:
    """Rows: context length; columns: position buckets; cells: validation loss."""
    with_buckets = [r for r in runs if r.loss_by_position]
    buckets = sorted({b for r in with_buckets for b in r.loss_by_position}, key=_bucket_start)
    lines = ["| backend | seq_len | " + " | ".join(buckets) + " |", "|---|---:" + "|---:" * len(buckets) + "|"]
    for r in with_buckets:
        cells = [_fmt(r.loss_by_position.get(b), ".3f") if b in r.loss_by_position else "" for b in buckets]
        lines.append(f"| {r.backend} | {r.seq_len} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _bucket_start(bucket: str) -> int:
    return int(bucket.split("-")[0])


def _bucket_end(bucket: str) -> int:
    return int(bucket.split("-")[1]) + 1


def check_table(check: dict) -> str:
    """The kernel's correctness check: relative errors vs the fp32 reference, and the dropout statistics."""
    errors = ("o", "lse", "dq", "dk", "dv")
    lines = ["| check | passed | " + " | ".join(errors) + " | other |", "|---|---" + "|---:" * len(errors) + "|---|"]
    for r in check["results"]:
        cells = [_fmt(r.get("rel_err", {}).get(name), ".1e") for name in errors]
        other = {k: v for k, v in r.items() if k not in ("name", "passed", "rel_err", "case")}
        extra = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in other.items())
        lines.append(f"| {r['name']} | {'yes' if r['passed'] else 'NO'} | " + " | ".join(cells) + f" | {extra} |")
    return "\n".join(lines)


# --- data-driven reading ----------------------------------------------------------------------------------


def _ratios(runs: list[Run], a: str, b: str) -> str | None:
    """Tokens/s of backend a over backend b at every T where both have a speed, e.g. "1.20× at T=1024"."""
    table = _by_backend(runs)
    pairs = [
        (t, table[a][t].tokens_per_sec / table[b][t].tokens_per_sec)
        for t in sorted(set(table.get(a, {})) & set(table.get(b, {})))
        if _has_speed(table[a][t]) and _has_speed(table[b][t])
    ]
    return ", ".join(f"{ratio:.2f}× at T={t}" for t, ratio in pairs) or None


def speed_reading(runs: list[Run]) -> list[str]:
    lines = []
    for a, b in (("flash", "sdpa"), ("flash", "naive"), ("sdpa", "naive")):
        if ratios := _ratios(runs, a, b):
            lines.append(f"- {a} vs {b}, training tokens/s: {ratios}.")
    for backend, by_t in _by_backend(runs).items():
        if failed := [t for t, r in sorted(by_t.items()) if r.status == "oom"]:
            lines.append(f"- {backend}: out of memory at T={', '.join(map(str, failed))}.")
        for t, r in sorted(by_t.items()):
            if r.status not in ("ok", "oom"):
                why = f": {r.message}" if r.message else ""
                lines.append(f"- {backend}: no result at T={t} ({r.status}{why}).")
    return lines


def ppl_reading(runs: list[Run]) -> list[str]:
    done = sorted((r for r in runs if r.val_ppl is not None), key=lambda r: r.seq_len)
    if not done:
        return []
    seen = {r.tokens for r in done}
    budget = f"{done[0].tokens:,} training tokens each" if len(seen) == 1 else "different token counts (see table)"
    by_t = ", ".join(f"T={r.seq_len}: {r.val_ppl:.2f}" for r in done)
    lines = [f"- validation perplexity, {budget}: {by_t}."]
    last = [
        (r.seq_len, *max(r.loss_by_position.items(), key=lambda kv: _bucket_start(kv[0])))
        for r in done
        if r.loss_by_position
    ]
    if last:
        cells = ", ".join(f"T={t} [{b}]: {loss:.3f}" for t, b, loss in last)
        lines.append(f"- loss of the last position bucket of each context: {cells}.")
    return lines


def kernel_reading(bench: dict) -> list[str]:
    rows = bench.get("rows", [])
    lines = []
    for head_dim, p in sorted({(r["head_dim"], r["dropout"]) for r in rows}):
        section = {(r["provider"], r["seq_len"]): r for r in rows if (r["head_dim"], r["dropout"]) == (head_dim, p)}
        for other in ("sdpa_flash", "sdpa_cudnn"):
            pairs = [
                f"{mine['tflops']['fwd_bwd'] / theirs['tflops']['fwd_bwd']:.2f}× at T={t}"
                for (provider, t), mine in sorted(section.items())
                if provider == "flash"
                and (theirs := section.get((other, t)))
                and mine["status"] == theirs["status"] == "ok"
            ]
            if pairs:
                lines.append(f"- flash vs {other} fwd+bwd TFLOP/s, D={head_dim}, dropout {p}: {', '.join(pairs)}.")
    check = bench.get("check")
    if check:
        worst = max((e for r in check["results"] for e in r.get("rel_err", {}).values()), default=math.nan)
        failed = [r["name"] for r in check["results"] if not r["passed"]]
        verdict = "passed" if check["passed"] else f"FAILED ({', '.join(failed)})"
        lines.append(f"- correctness check ({check['dtype']}): {verdict}; largest relative error {worst:.1e}.")
    return lines


# --- plots ------------------------------------------------------------------------------------------------


def _log2_x(ax: plt.Axes, seq_lens: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(seq_lens, [f"{t // 1024}K" if t >= 1024 else str(t) for t in seq_lens])
    ax.grid(alpha=0.3)


def _context_axes(ax: plt.Axes, seq_lens: list[int], ylabel: str) -> None:
    """The axes of a per-run plot: context length on a log2 x axis, one line per backend."""
    _log2_x(ax, seq_lens)
    ax.set_xlabel("context length T")
    ax.set_ylabel(ylabel)
    ax.legend()


def _save(fig: plt.Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_throughput(runs: list[Run], path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    seq_lens = sorted({r.seq_len for r in runs})
    for backend, by_t in _by_backend(runs).items():
        ok = [(t, r) for t, r in sorted(by_t.items()) if _has_speed(r)]
        axes[0].plot([t for t, _ in ok], [r.tokens_per_sec for _, r in ok], "o-", label=backend)
        with_mfu = [(t, r.mfu) for t, r in ok if r.mfu is not None]
        axes[1].plot([t for t, _ in with_mfu], [100 * m for _, m in with_mfu], "o-", label=backend)
    for ax, ylabel in zip(axes, ("tokens/s (steady-state median)", "MFU (%)"), strict=True):
        _context_axes(ax, seq_lens, ylabel)
        ax.set_ylim(bottom=0)
    _save(fig, path)


def plot_memory(runs: list[Run], path: Path) -> None:
    """Peak memory per backend; an out-of-memory run is an X at the top, labelled with what it asked for."""
    fig, ax = plt.subplots(figsize=(6, 4))
    peaks = [r.peak_gib for r in runs if r.status == "ok" and r.peak_gib]
    top = 2 * max(peaks, default=1.0)
    for backend, by_t in _by_backend(runs).items():
        ok = [(t, r.peak_gib) for t, r in sorted(by_t.items()) if r.status == "ok" and r.peak_gib]
        (line,) = ax.plot([t for t, _ in ok], [g for _, g in ok], "o-", label=backend)
        for t, r in by_t.items():
            if r.status == "oom":
                ax.plot(t, top, "x", color=line.get_color(), markersize=12, markeredgewidth=2)
                asked = "" if r.requested_gib is None else f" +{r.requested_gib:.1f}"
                ax.annotate(
                    f"OOM{asked}", (t, top), textcoords="offset points", xytext=(0, -14), ha="center", fontsize=7
                )
    if peaks or any(r.status == "oom" for r in runs):  # runs without CUDA record no memory
        ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    _context_axes(ax, sorted({r.seq_len for r in runs}), "peak allocated GiB (log)")
    _save(fig, path)


def plot_perplexity(runs: list[Run], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for backend, by_t in _by_backend(runs).items():
        done = [(t, r.val_ppl) for t, r in sorted(by_t.items()) if r.val_ppl is not None]
        ax.plot([t for t, _ in done], [p for _, p in done], "o-", label=backend)
    tokens = {r.tokens for r in runs if r.tokens}
    budget = f"{tokens.pop():,} training tokens" if len(tokens) == 1 else "see table for tokens seen"
    ax.set_title(f"validation perplexity ({budget})", fontsize=10)
    _context_axes(ax, sorted({r.seq_len for r in runs}), "validation perplexity")
    _save(fig, path)


def plot_loss_by_position(runs: list[Run], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in sorted((r for r in runs if r.loss_by_position), key=lambda r: r.seq_len):
        buckets = sorted(r.loss_by_position, key=_bucket_start)
        ax.plot(
            [_bucket_end(b) for b in buckets],
            [r.loss_by_position[b] for b in buckets],
            "o-",
            label=f"{r.backend} T={r.seq_len}",
        )
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.set_xlabel("position within the context (end of bucket [lo, hi))")
    ax.set_ylabel("validation loss")
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_kernels(bench: dict, head_dim: int, path: Path) -> None:
    """fwd and bwd TFLOP/s vs T, one line per provider; one column per dropout rate."""
    rows = [r for r in bench["rows"] if r["head_dim"] == head_dim]
    rates = sorted({r["dropout"] for r in rows})
    fig, axes = plt.subplots(2, len(rates), figsize=(5.5 * len(rates), 7), squeeze=False)
    for col, p in enumerate(rates):
        for row, kind in enumerate(("fwd", "bwd")):
            ax = axes[row][col]
            for provider in dict.fromkeys(r["provider"] for r in rows):
                ok = sorted(
                    (r["seq_len"], r["tflops"][kind])
                    for r in rows
                    if r["provider"] == provider and r["dropout"] == p and r["status"] == "ok"
                )
                ax.plot([t for t, _ in ok], [v for _, v in ok], "o-", label=provider)
            _log2_x(ax, sorted({r["seq_len"] for r in rows}))
            ax.set_title(f"{kind}, D={head_dim}, dropout {p}", fontsize=10)
            ax.set_xlabel("T")
            ax.set_ylabel("TFLOP/s")
            ax.set_ylim(bottom=0)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{bench['device']}, {bench['dtype']}, causal, B·T = {bench['tokens_per_call']}", fontsize=10)
    _save(fig, path)


# --- the report -------------------------------------------------------------------------------------------


def _setup_lines(runs: list[Run], bench: dict | None) -> list[str]:
    lines = []
    for device in sorted({r.device for r in runs if r.device}):
        dates = sorted({r.date for r in runs if r.device == device and r.date}) or ["date not recorded"]
        lines.append(f"- training runs: {device}, {', '.join(dates)}")
    if bench:
        versions = f"torch {bench['torch']}, triton {bench['triton']}"
        lines.append(f"- kernel benchmark: {bench['device']}, {bench['date']}, {versions}")
    return lines


def _commands(runs: list[Run]) -> list[str]:
    """The sweep invocations, then every run's own command."""
    sweeps = [f"- sweep: `{c}`" for c in sorted({r.sweep_command for r in runs if r.sweep_command})]
    return ["Commands:", "", *sweeps, "- each run:", "", "```", *sorted({r.command for r in runs}), "```"]


def build_report(out: Path) -> str:
    """Read out/raw, write out/report.md and the plots; returns the markdown."""
    raw = out / "raw"
    groups = {g: load_group(raw / g) if (raw / g).exists() else [] for g in GROUPS}
    bench = load_bench(raw)
    md = [f"# {out.name}", "", f"Rebuild: `python scripts/report.py --from-raw {_rel(out)}` (reads only `raw/`).", ""]
    md += ["## Setup", "", *_setup_lines(groups["speed"] + groups["ppl"], bench), ""]
    if speed := groups["speed"]:
        plot_throughput(speed, out / "throughput.png")
        plot_memory(speed, out / "memory.png")
        md += ["## Training speed and memory", "", throughput_pivot(speed), "", runs_table(speed), ""]
        md += ["![throughput](throughput.png)", "![memory](memory.png)", "", *_commands(speed), ""]
        md += ["Reading:", "", *speed_reading(speed), ""]
    if ppl := groups["ppl"]:
        plot_perplexity(ppl, out / "perplexity.png")
        plot_loss_by_position(ppl, out / "loss_by_position.png")
        md += ["## Perplexity vs context length", "", runs_table(ppl), "", "Validation loss by position:", ""]
        md += [position_table(ppl), "", "![perplexity](perplexity.png)", "![loss by position](loss_by_position.png)"]
        md += ["", *_commands(ppl), "", "Reading:", "", *ppl_reading(ppl), ""]
    if bench:
        anchors = anchors_for(bench["device"], bench["dtype"], bench["tokens_per_call"])
        md += ["## Attention kernels", "", f"Command: `{bench['command']}`", ""]
        if bench["rows"]:
            md.append(markdown_tables(bench["rows"], anchors))
        for head_dim in sorted({r["head_dim"] for r in bench["rows"]}):
            plot_kernels(bench, head_dim, out / f"kernels_d{head_dim}.png")
            md += [f"![kernels D={head_dim}](kernels_d{head_dim}.png)", ""]
        if check := bench.get("check"):
            md += [f"Correctness check ({check['dtype']}, before timing):", "", check_table(check), ""]
        md += ["Reading:", "", *kernel_reading(bench), ""]
    text = "\n".join(md).rstrip() + "\n"
    (out / "report.md").write_text(text)
    return text


def _rel(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def readme_tables(out: Path) -> str:
    """The README's headline: training throughput per backend and context, and the kernels at D = 64."""
    raw = out / "raw"
    parts = []
    if (raw / "speed").exists():
        parts.append(throughput_pivot(load_group(raw / "speed")))
    if bench := load_bench(raw):
        anchors = anchors_for(bench["device"], bench["dtype"], bench["tokens_per_call"])
        parts.append(markdown_tables([r for r in bench["rows"] if r["head_dim"] == 64], anchors))
    return "\n\n".join(parts).rstrip() + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--out", type=Path, metavar="DIR", help="copy the runs and benchmark given into DIR/raw, build DIR"
    )
    source.add_argument("--from-raw", type=Path, metavar="DIR", help="rebuild DIR from DIR/raw only")
    parser.add_argument("--speed", type=Path, help="a sweep dir of short timed runs")
    parser.add_argument("--ppl", type=Path, help="a sweep dir of perplexity runs")
    parser.add_argument("--bench", type=Path, help="a scripts/bench_attention.py JSON")
    parser.add_argument("--readme-table", action="store_true", help="print the headline tables instead")
    parser.add_argument("--wandb", choices=["offline", "online"], help="also log plots, tables and the folder to W&B")
    parser.add_argument("--wandb-project", default="flashgpt")
    parser.add_argument("--wandb-group", help="e.g. the group its training runs logged to (wandb.group)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return _main(args)
    except ReportError as error:
        raise SystemExit(f"report.py: {error}") from error


def _main(args: argparse.Namespace) -> int:
    out = args.from_raw or args.out
    if args.out:
        # Every source is read and checked before anything in out/raw is replaced.
        sources = {
            group: (source, run_dirs_in(source, f"--{group}")) for group in GROUPS if (source := getattr(args, group))
        }
        if args.bench:
            read_bench(args.bench)
        for group, (source, run_dirs) in sources.items():
            print(f"{group}: {import_runs(source, out / 'raw' / group, run_dirs)} runs from {source}")
        if args.bench:
            shutil.rmtree(out / "raw" / "bench", ignore_errors=True)
            (out / "raw" / "bench").mkdir(parents=True)
            shutil.copyfile(args.bench, out / "raw" / "bench" / args.bench.name)
    raw = out / "raw"
    if not any((raw / part).is_dir() for part in (*GROUPS, "bench")):
        flags = "--speed, --ppl or --bench" if args.out else "--out DIR with --speed, --ppl or --bench"
        raise ReportError(f"{raw} holds no runs (speed/, ppl/) and no benchmark (bench/): build it with {flags}")
    if args.readme_table:
        print(readme_tables(out), end="")
        return 0
    build_report(out)
    print(f"wrote {out / 'report.md'}")
    if args.wandb:
        from flashgpt.training.wandb_report import log_report  # wandb is imported only when asked for

        groups = {group: load_group(out / "raw" / group) for group in GROUPS if (out / "raw" / group).exists()}
        print(f"wandb run: {log_report(out, groups, args.wandb, args.wandb_project, args.wandb_group)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
