"""One training or evaluation job in a process of its own, for the runners that chain many of them (scripts/sweep.py
and training/study.py): a crash (a segfault, a CUDA error that poisons its process) ends that job only, its output
goes to a log the runner keeps, and a job that would outlast the runner's budget is stopped."""

import datetime
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

STOP_GRACE_S = 20.0  # a job stopped at its deadline gets this long to exit after SIGTERM, then SIGKILL


class JobResult(NamedTuple):
    returncode: int
    stopped: bool  # stopped at its deadline
    wall_s: float


def run_job(command: list[str], log: Path, cwd: Path, deadline: float | None = None) -> JobResult:
    """Run `command`, recorded as typed ("python train.py ..."), under this interpreter from `cwd`, its stdout and
    stderr appended to `log` after a header line. With a `deadline` (time.monotonic), stop it then: SIGTERM to its
    process group (so that whatever it started stops too), SIGKILL STOP_GRACE_S later."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("a") as out:
        out.write(f"\n== {datetime.datetime.now().isoformat(timespec='seconds')} {' '.join(command)}\n")
        out.flush()
        env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
        proc = subprocess.Popen(
            [sys.executable, *command[1:]], cwd=cwd, stdout=out, stderr=out, env=env, start_new_session=True
        )
        try:
            timeout = None if deadline is None else max(1.0, deadline - time.monotonic())
            returncode, stopped = proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            returncode, stopped = proc.returncode, True
    return JobResult(returncode, stopped, time.monotonic() - started)


def failure_line(log: Path) -> str:
    """Why a job failed, from its log: the last line that names an error or exception (a traceback's last line,
    also behind torchrun's "[rank0]:" prefix), else the last line."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"(Error|Exception)\b", line)]
    return (errors or lines or [""])[-1][:500]
