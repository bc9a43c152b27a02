"""Run train.py end to end as a subprocess, the way a user does, and read back what it wrote."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# gpt2-tiny on Shakespeare at a size that runs a step in a fraction of a second on two CPU cores.
TINY = [
    "model=gpt2-tiny", "attention=sdpa", "data=shakespeare", "seq_len=64", "train.batch_size=4",
    "train.lr=3e-3", "train.warmup_steps=2", "eval.steps=2", "eval.batch_size=4", "log.every=1",
    "wandb.mode=disabled", "device=cpu", "seed=0",
]  # fmt: skip
# What two CPU processes need to compute the same bits: one thread (no thread count or split of a reduction can
# differ) and MKL's code path that does not depend on the processor or on the alignment of its operands. Under CI's
# load, runs with two threads and MKL_CBWR=AUTO still differed now and then in the 6th digit of a logged loss.
DETERMINISTIC_CPU = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MKL_CBWR": "COMPATIBLE"}


def train(
    run_dir: Path, *overrides: str, nproc: int = 1, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python train.py <TINY> <overrides> hydra.run.dir=<run_dir>`, or under torchrun with nproc processes."""
    return finish(start(run_dir, *overrides, nproc=nproc, env=env))


def start(run_dir: Path, *overrides: str, nproc: int = 1, env: dict[str, str] | None = None) -> subprocess.Popen:
    """train() without waiting: independent runs started together overlap their seconds of start-up (imports)."""
    launcher = [sys.executable]
    if nproc > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    command = [*launcher, "train.py", *TINY, *overrides, f"hydra.run.dir={run_dir}"]
    pipe = subprocess.PIPE
    return subprocess.Popen(command, cwd=REPO, env=env or os.environ.copy(), stdout=pipe, stderr=pipe, text=True)


def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    """Wait for a started run, as subprocess.run would (killed after 10 minutes)."""
    try:
        stdout, stderr = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"train.py exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-5000:]}"


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def read_result(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "result.json").read_text())
