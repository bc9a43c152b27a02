"""The run directory belongs to one run: a new run never writes over an earlier one unless told to.

Checked at start-up, before any data is loaded or model built:
- a run dir that already holds a run (metrics.jsonl, result.json or a checkpoint) is continued only with `resume`
  and replaced only with `overwrite=true`; otherwise the run stops and says which to pass. `resume` is refused where
  the earlier run left no checkpoint (checkpoint.every=0, or stopped before its first save): there is nothing to
  continue, and starting afresh would write over its metrics and result;
- `overwrite=true` deletes what the earlier run wrote (metrics, result, its checkpoint, its W&B files, which
  `wandb sync` would otherwise upload with the new run) and nothing else: other files in the run dir stay;
- `resume=auto` in a fresh timestamped run dir (Hydra's default `runs/<date>/<time>`, new for every launch) can
  never find a checkpoint, so it stops and names the run dirs that do hold one;
- temporaries of checkpoint saves that were killed midway are removed.
"""

import logging
import re
import shutil
from pathlib import Path

from flashgpt.training.checkpoint import LATEST, checkpoint_dir, remove_abandoned_saves
from flashgpt.training.metrics import METRICS_FILE, RESULT_FILE

log = logging.getLogger(__name__)

# Hydra's default run dir, runs/${now:%Y-%m-%d}/${now:%H-%M-%S}: a new folder at every launch.
_TIMESTAMPED = re.compile(r"\d{4}-\d{2}-\d{2}/\d{2}-\d{2}-\d{2}$")


class RunDirError(ValueError):
    """The run dir and the resume/overwrite settings disagree about what this run should do."""


def earlier_run_files(run_dir: Path) -> list[Path]:
    """What an earlier run left in `run_dir` that a new run would write over."""
    candidates = [run_dir / METRICS_FILE, run_dir / RESULT_FILE, checkpoint_dir(run_dir) / LATEST]
    return [path for path in candidates if path.exists()]


def claim_run_dir(
    run_dir: Path, resume: str | None, overwrite: bool, is_main: bool, extend_from: str | None = None
) -> None:
    """Check that this run may write into `run_dir` as configured; with overwrite=true, rank 0 (is_main) deletes
    the earlier run's metrics, result, checkpoint and W&B files. Raises RunDirError with the settings to pass."""
    earlier = earlier_run_files(run_dir)
    found = ", ".join(str(path.relative_to(run_dir)) for path in earlier)
    own_checkpoint = checkpoint_dir(run_dir) / LATEST
    has_checkpoint = own_checkpoint.exists()
    if overwrite and resume is not None:
        raise RunDirError(f"overwrite=true and resume={resume} contradict each other; pass one of them")
    if (
        overwrite
        and extend_from is not None
        and has_checkpoint
        and Path(extend_from).resolve() == own_checkpoint.resolve()
    ):
        raise RunDirError(
            f"extend_from={extend_from} is the checkpoint of the run in {run_dir}, which overwrite=true would delete "
            "before it is read. Copy it out of the run dir first, or pass another hydra.run.dir for the extended run"
        )
    if earlier and resume is None and not overwrite:
        to_continue = "Pass resume=auto to continue it, " if has_checkpoint else "It has no checkpoint to resume. Pass "
        raise RunDirError(
            f"run dir {run_dir} already holds a run ({found}). {to_continue}overwrite=true to delete it and start "
            "again, or another hydra.run.dir for a new run"
        )
    if earlier and resume is not None and not has_checkpoint:
        raise RunDirError(
            f"resume={resume}: run dir {run_dir} holds a run ({found}) but no checkpoint of it "
            f"(checkpoints/{LATEST}: it ran with checkpoint.every=0 or stopped before its first save), so there is "
            "nothing to continue, and a fresh start would write over its metrics. Pass overwrite=true to delete it "
            "and start again, or another hydra.run.dir for a new run"
        )
    if resume == "auto" and not earlier and _TIMESTAMPED.search(run_dir.as_posix()):
        raise RunDirError(_fresh_timestamped_auto_resume(run_dir))
    if is_main:
        if overwrite and earlier:
            for path in (run_dir / METRICS_FILE, run_dir / RESULT_FILE, checkpoint_dir(run_dir) / LATEST):
                path.unlink(missing_ok=True)
            for path in _wandb_files(run_dir):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
            log.warning(
                f"overwrite=true: deleted the earlier run's metrics, result, checkpoint and W&B files in {run_dir}"
            )
        remove_abandoned_saves(checkpoint_dir(run_dir))


def _wandb_files(run_dir: Path) -> list[Path]:
    """What wandb.init(dir=run_dir) writes under <run dir>/wandb: one folder per job (offline-run-*, run-*),
    the latest-run link and its debug logs."""
    patterns = ("offline-run-*", "run-*", "latest-run", "debug*.log")
    return [path for pattern in patterns for path in (run_dir / "wandb").glob(pattern)]


def _fresh_timestamped_auto_resume(run_dir: Path) -> str:
    runs_root = run_dir.parent.parent
    with_checkpoints = sorted(
        runs_root.glob(f"*/*/checkpoints/{LATEST}"), key=lambda path: path.stat().st_mtime, reverse=True
    )
    newest = [str(path.parent.parent) for path in with_checkpoints[:3]]
    hint = f" Newest runs with a checkpoint: {', '.join(newest)}." if newest else ""
    return (
        f"resume=auto found no checkpoint in {run_dir}: it is a new timestamped run dir (one is made at every "
        f"launch), so there is nothing to resume. To continue a run, pass its dir: hydra.run.dir=<run dir> "
        f"resume=auto, or resume=<run dir>/checkpoints/{LATEST}.{hint} To start a new run, drop resume=auto."
    )
