"""Log a built run report (scripts/report.py --wandb ...) to a Weights & Biases run of job type "report": every plot as
an image, every group of runs as a table, and the report folder itself (report.md, plots, raw/) as an artifact."""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import wandb


def runs_table(runs: list[Any]) -> wandb.Table:
    """One row per run (run_report's Run dataclass), every scalar field as a column (the per-position losses, a
    dict, are left out)."""
    columns = [f.name for f in fields(runs[0]) if f.name != "loss_by_position"]
    return wandb.Table(columns=columns, data=[[asdict(run)[c] for c in columns] for run in runs])


def log_report(out: Path, groups: dict[str, list[Any]], mode: str, project: str, group: str | None) -> str:
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
