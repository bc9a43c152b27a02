"""Where numbers go: metrics.jsonl (always) and Weights & Biases (offline unless asked otherwise), from rank 0.

Keys are namespaced: train/*, val/*, perf/*, mem/*. `val/loss_by_position` is a dict of position buckets in the
jsonl and is flattened to `val/loss_by_position/<bucket>` for wandb, whose charts want scalars. In wandb every
chart's x axis is train/tokens (define_metric), on which runs of different batch sizes and contexts line up.

Offline resume (wandb 0.31, measured on its offline files): the resumed job writes a second
wandb/offline-run-<time>-<id> dir with the same run id, whose history continues at the checkpoint's step + 1.
`wandb sync <run dir>/wandb/offline-run-*` syncs the files of one run id one after the other in start-time order
(`wandb sync --help`), into one run. Steps that the first job logged after its last checkpoint, before it stopped,
the second logs again; W&B ignores rows logged at a step below the run's current one (its rule for wandb.log; a sync
cannot be tried offline), so those steps keep the first job's values: with an exact resume, the same numbers.
"""

import json
import logging
from pathlib import Path
from typing import Any

import wandb

from flashgpt.training.config import WandbConfig

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "result.json"
TOKENS = "train/tokens"  # wandb's x axis


class MetricsLogger:
    def __init__(
        self,
        run_dir: Path,
        wandb_cfg: WandbConfig,
        config: dict[str, Any],
        resume_step: int,
        wandb_id: str | None,
    ) -> None:
        """A run that starts at `resume_step` (0 when fresh) keeps the metrics.jsonl lines up to that step: later
        ones, if any, were written after its checkpoint and are about to be recomputed. wandb continues the run
        `wandb_id` when given (a resumed run), else starts a new one."""
        self.run_dir = run_dir
        self.path = run_dir / METRICS_FILE
        if self.path.exists():
            kept = [line for line, record in _read_records(self.path) if record["step"] <= resume_step]
            self.path.write_text("".join(f"{line}\n" for line in kept))
        self.run = wandb.init(
            project=wandb_cfg.project,
            entity=wandb_cfg.entity,
            name=wandb_cfg.name,
            dir=wandb_cfg.dir or run_dir,
            mode=wandb_cfg.mode.value,
            config=config,
            id=wandb_id,
            resume="allow" if wandb_id else None,
            group=wandb_cfg.group,
            tags=list(wandb_cfg.tags),
            job_type=wandb_cfg.job_type,
            notes=wandb_cfg.notes,
        )
        self.run.define_metric(TOKENS)
        for namespace in ("train", "val", "perf", "mem"):
            self.run.define_metric(f"{namespace}/*", step_metric=TOKENS)
        self.log_checkpoints = wandb_cfg.log_checkpoints

    @property
    def wandb_id(self) -> str:
        return self.run.id

    def checkpoint_saved(self, path: Path, step: int) -> None:
        """With wandb.log_checkpoints=true, log the checkpoint as a "model" artifact of this run, aliased latest and
        step-<step>. wandb copies the file first (offline: into its staging dir, $WANDB_DATA_DIR, until `wandb sync`),
        so the next save cannot change what it uploads."""
        if not self.log_checkpoints:
            return
        artifact = wandb.Artifact(f"checkpoint-{self.run.id}", type="model", metadata={"step": step})
        artifact.add_file(str(path))
        self.run.log_artifact(artifact, aliases=["latest", f"step-{step}"])

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        self.run.log(_flatten(metrics), step=step)

    def finish(self, result: dict[str, Any]) -> None:
        """Write result.json, copy it into the wandb run summary, close the wandb run."""
        (self.run_dir / RESULT_FILE).write_text(json.dumps(result, indent=2) + "\n")
        self.run.summary.update(_flatten(result))
        self.run.finish(exit_code=1 if result["status"] == "nan" else 0)  # an OOM is a result, not a crash


def _read_records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The lines of a metrics.jsonl with their records. A last line cut short (the process was killed while
    writing it) is dropped with a warning; any other unreadable line is an error naming it."""
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append((line, json.loads(line)))
        except json.JSONDecodeError as error:
            if number < len(lines):
                raise ValueError(f"{path}, line {number} is not JSON ({error}); delete or repair that line") from error
            log.warning(f"{path}: dropped its last line, cut short by an interrupted write: {line[:80]!r}")
    return records


def _flatten(metrics: dict[str, Any]) -> dict[str, Any]:
    flat = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            flat.update({f"{key}/{name}": inner for name, inner in value.items()})
        else:
            flat[key] = value
    return flat
