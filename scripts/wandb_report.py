"""Log a built report (scripts/report.py --wandb ...) to a Weights & Biases run of job type "report": every plot as
an image, every group of runs as a table, and the report folder itself (report.md, plots, raw/) as an artifact."""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path

import wandb
from report import Run  # scripts/ is on sys.path when run as a script

TABLE_COLUMNS = [f.name for f in fields(Run) if f.name != "loss_by_position"]  # scalars only: one cell each


def runs_table(runs: list[Run]) -> wandb.Table:
    """One row per run, every scalar field of Run as a column."""
    return wandb.Table(columns=TABLE_COLUMNS, data=[[asdict(run)[c] for c in TABLE_COLUMNS] for run in runs])


def log_report(out: Path, groups: dict[str, list[Run]], mode: str, project: str, group: str | None) -> str:
    """Log out/*.png and the groups' runs to a new wandb run named after the report; returns the run's path or,
    offline, its local directory (`wandb sync <dir>` uploads it)."""
    run = wandb.init(project=project, group=group, job_type="report", name=out.name, mode=mode)
    run.log({f"plots/{png.stem}": wandb.Image(str(png)) for png in sorted(out.glob("*.png"))})
    run.log({f"tables/{name}": runs_table(runs) for name, runs in groups.items() if runs})
    artifact = wandb.Artifact(f"report-{out.name}", type="report")
    artifact.add_dir(str(out))
    run.log_artifact(artifact)
    where = run.dir if mode == "offline" else run.path
    run.finish()
    return str(Path(where).parent) if mode == "offline" else where
