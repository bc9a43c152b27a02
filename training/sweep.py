"""Run an experiment preset over attention backends x context lengths in budgeted, resumable pieces
(`python scripts/sweep.py`, whose entry point is `main`).

The sweep itself is Hydra's: `python train.py -m experiment=long_context_speed attention=flash,sdpa
seq_len=1024,4096,16384` runs the same grid, the preset deriving the batch from seq_len, an out-of-memory point
recorded as a result. This script adds what a Hydra -m sweep cannot do:

- a time budget: with --budget-min it starts no run that would end past the budget and exits with status 2; the same
  command continues later, for machines that cap a command's time (repeat it until it prints "sweep complete");
- resumability: every run trains in a fixed dir, <out>/<backend>-<seq_len>, and one that holds result.json is done
  and skipped (a -m sweep starts a new timestamped dir and reruns every point);
- one process per run: a crash (a segfault, a CUDA error that poisons the process) ends that run only; it gets a
  result.json with status "crashed", its exit code and the error line, and the sweep goes on (delete its dir to run
  it again). Out of memory is a result written by train.py itself: status "oom".

    python scripts/sweep.py long_context_speed --budget-min 8
    python scripts/sweep.py long_context_ppl --attention flash --budget-min 8
    python scripts/sweep.py long_context_speed --seq-lens 128 model=gpt2-tiny device=cpu   # extra overrides last
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from flashgpt.command_line import command_line, csv_list
from flashgpt.training.jobs import failure_line, run_job

ROOT = Path(__file__).resolve().parents[1]  # the checkout: runs train.py and writes runs/ there
LOG_FILE = "sweep.log"  # the run's stdout and stderr


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("preset", help="an experiment preset: configs/experiment/<preset>.yaml")
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides for every run")
    parser.add_argument("--attention", type=csv_list(str), default=["naive", "flash", "sdpa"])
    parser.add_argument("--seq-lens", type=csv_list(int), default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--budget-min", type=float, help="start no run that would end past this many minutes")
    parser.add_argument("--out", type=Path, help="sweep dir (default runs/<preset>)")
    args = parser.parse_intermixed_args(argv)  # overrides may follow the options
    presets = sorted(path.stem for path in (ROOT / "configs" / "experiment").glob("*.yaml"))
    if args.preset not in presets:
        parser.error(
            f"preset {args.preset!r}: no configs/experiment/{args.preset}.yaml; choose one of {', '.join(presets)}"
        )
    return args


def train_command(args: argparse.Namespace, backend: str, seq_len: int, run_dir: Path) -> list[str]:
    """One point of the grid; the preset derives the batch sizes from seq_len."""
    return [
        "python",
        "train.py",
        f"experiment={args.preset}",
        f"attention={backend}",
        f"seq_len={seq_len}",
        *args.overrides,
        f"hydra.run.dir={run_dir}",
    ]


def run_one(command: list[str], run_dir: Path, backend: str, seq_len: int, sweep_command: str) -> dict:
    """Train in a fresh process; returns result.json, written here when the run left none."""
    shutil.rmtree(run_dir, ignore_errors=True)  # a killed attempt: metrics.jsonl would be appended to
    run_dir.mkdir(parents=True)
    started = datetime.datetime.now().isoformat(timespec="seconds")
    job = run_job(command, run_dir / LOG_FILE, cwd=ROOT)
    sweep = {
        "command": command,
        "sweep_command": sweep_command,
        "started": started,
        "returncode": job.returncode,
        "wall_s": job.wall_s,
    }
    (run_dir / "sweep.json").write_text(json.dumps(sweep, indent=1) + "\n")
    result_path = run_dir / "result.json"
    if not result_path.exists():
        crashed = {"status": "crashed", "backend": backend, "seq_len": seq_len, "returncode": job.returncode}
        result_path.write_text(json.dumps({**crashed, "message": failure_line(run_dir / LOG_FILE)}, indent=1) + "\n")
    return {**json.loads(result_path.read_text()), "wall_s": sweep["wall_s"]}


def _summary(name: str, result: dict) -> str:
    speed = result.get("perf/tokens_per_sec")
    peak = result.get("mem/peak_gib")
    parts = [f"{name}: {result['status']} in {result['wall_s']:.0f} s"]
    parts += [f"{speed:,.0f} tok/s"] if speed else []
    parts += [f"peak {peak:.1f} GiB"] if peak else []
    parts += [result["message"][:200]] if result["status"] != "ok" and result.get("message") else []
    return ", ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    sweep_command = command_line("sweep.py", argv)
    out = args.out or Path("runs") / args.preset
    grid = [(backend, t) for t in args.seq_lens for backend in args.attention]
    pending = [(b, t) for b, t in grid if not (ROOT / out / f"{b}-{t}" / "result.json").exists()]
    print(f"{out}: {len(grid) - len(pending)} of {len(grid)} runs done, {len(pending)} to go", flush=True)
    clock, longest = time.monotonic(), 0.0
    for i, (backend, seq_len) in enumerate(pending):
        elapsed = time.monotonic() - clock
        if args.budget_min and elapsed + longest > 60 * args.budget_min:
            print(f"budget: stopping with {len(pending) - i} runs to go; run the same command again")
            return 2
        run_dir = out / f"{backend}-{seq_len}"
        command = train_command(args, backend, seq_len, run_dir)
        result = run_one(command, ROOT / run_dir, backend, seq_len, sweep_command)
        longest = max(longest, result["wall_s"])
        print(_summary(run_dir.name, result), flush=True)
    print(f"sweep complete: {len(grid)} runs in {out}")
    return 0
