"""Checkpoints that make a resumed run continue exactly: model, optimizer, scheduler, step, and per rank the data
sampler and every RNG state. Written atomically, so a crash mid-save never leaves a torn or missing file."""

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

LATEST = "latest.pt"


def checkpoint_dir(run_dir: Path) -> Path:
    """Where a run keeps its checkpoint: <run dir>/checkpoints."""
    return run_dir / "checkpoints"


def capture_rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write to a temporary file in the same directory, fsync it, then os.replace it over `path`: readers see
    the old file or the new one, never a partial write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: Path) -> dict[str, Any]:
    # weights_only=False: the RNG states are Python and NumPy objects; these files are our own.
    return torch.load(path, map_location="cpu", weights_only=False)


def resolve_resume(resume: str | None, run_dir: Path) -> Path | None:
    """The checkpoint to resume from: None, "auto" (the run dir's latest, if any) or a path that must exist."""
    if resume is None:
        return None
    if resume == "auto":
        latest = checkpoint_dir(run_dir) / LATEST
        return latest if latest.exists() else None
    path = Path(resume)
    if not path.is_file():
        raise FileNotFoundError(
            f"resume={resume}: no such checkpoint file; pass a checkpoint's path (<run dir>/checkpoints/{LATEST}), "
            "resume=auto to continue the run dir's own if there is one, or resume=null to start fresh"
        )
    return path
