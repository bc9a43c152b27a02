"""Checkpoints that make a resumed run continue exactly: model, optimizer, scheduler, step, and per rank the data
sampler and every RNG state.

Safe to load: a checkpoint holds tensors and plain Python values only (the Python and NumPy RNG states are
stored as tensors and ints), and is read with `torch.load(weights_only=True)`, which refuses any other object, so
loading a file never runs code from it.

Verified: torch.save writes a zip archive whose every record carries the CRC-32 of its bytes, computed as they are
written. Loading checks all of them first (Python's zipfile, 1.5-5 GB/s measured), so a truncated, empty or
bit-flipped file fails with an error naming it instead of resuming from damaged weights. Saving costs nothing extra.

Atomic: written to a temporary file beside the target, fsynced, renamed over it. A save killed midway leaves the
previous checkpoint intact and a temporary named after the killed process, removed by the next run.
"""

import logging
import os
import pickle
import random
import re
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flashgpt.temporary_files import make_temp_file, remove_abandoned

log = logging.getLogger(__name__)

LATEST = "latest.pt"
# What every training checkpoint holds; a file without these keys is not one.
REQUIRED_KEYS = ("model", "optimizer", "scheduler", "step", "rank_states", "config", "wandb_run_id")
_FORBIDDEN_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")  # how torch's weights-only unpickler names what it refused


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: missing, damaged, or holding more than tensors and plain values."""


def checkpoint_dir(run_dir: Path) -> Path:
    """Where a run keeps its checkpoint: <run dir>/checkpoints."""
    return run_dir / "checkpoints"


def capture_rng_state() -> dict[str, Any]:
    """Every RNG stream of this process, as tensors and plain values (loadable with weights_only=True)."""
    version, mt_state, gauss_next = random.getstate()
    numpy_state = np.random.get_state(legacy=False)
    return {
        "python": {"version": version, "state": torch.tensor(mt_state, dtype=torch.int64), "gauss_next": gauss_next},
        "numpy": {
            "key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
            "pos": numpy_state["state"]["pos"],
            "has_gauss": numpy_state["has_gauss"],
            "gauss": numpy_state["gauss"],
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    python = state["python"]
    random.setstate((python["version"], tuple(python["state"].tolist()), python["gauss_next"]))
    numpy = state["numpy"]
    key = numpy["key"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", key, numpy["pos"], numpy["has_gauss"], numpy["gauss"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write to a temporary file in the same directory, fsync it, then os.replace it over `path`: readers see
    the old file or the new one, never a partial write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = make_temp_file(path.parent, path.name)
    try:
        with os.fdopen(fd, "wb") as f, _crc32_on():
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink()
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def verify_checkpoint(path: Path) -> None:
    """Check every record of the checkpoint archive against the CRC-32 written with it; raise CheckpointError
    naming the file when it is missing, empty, truncated or damaged."""
    if path.is_dir():
        raise CheckpointError(
            f"checkpoint {path} is a directory; pass the checkpoint file, e.g. {path}/checkpoints/{LATEST}"
        )
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes): {_DAMAGED}")
    try:
        with zipfile.ZipFile(path) as archive:
            bad_record = archive.testzip()  # reads every record and compares its CRC-32
    except Exception as error:  # a damaged archive fails to parse in many ways (bad headers, names, methods)
        raise CheckpointError(f"checkpoint {path} is truncated or damaged ({error}): {_DAMAGED}") from error
    if bad_record is not None:
        raise CheckpointError(f"checkpoint {path} is damaged: record {bad_record} fails its CRC-32 check; {_DAMAGED}")


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The contents of checkpoint `path` (tensors on the CPU), verified first; never unpickles anything but
    tensors and plain Python values. Raises CheckpointError naming the file."""
    verify_checkpoint(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        found = _FORBIDDEN_GLOBAL.search(str(error))
        what = f"an object of {found[1]}" if found else "objects"
        raise CheckpointError(
            f"checkpoint {path} holds {what}, not only tensors and plain Python values; refusing to unpickle it, "
            "since that can run arbitrary code. flashgpt's trainer never writes such objects: this file was made "
            "elsewhere, or by a flashgpt version older than its weights-only checkpoint format."
        ) from error
    except RuntimeError as error:  # the zip is sound but not a torch archive
        raise CheckpointError(f"checkpoint {path} is not a torch checkpoint: {error}") from error
    return state


def load_training_state(path: Path) -> dict[str, Any]:
    """load_checkpoint, and check that the file is a trainer's checkpoint (every key of REQUIRED_KEYS)."""
    state = load_checkpoint(path)
    missing = [key for key in REQUIRED_KEYS if not isinstance(state, dict) or key not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path} is not a training checkpoint: it lacks {', '.join(missing)}")
    return state


def last_good_checkpoint(path: Path | None) -> str | None:
    """`path` if it is a sound checkpoint, else None: what a failed run may name as the one to resume from."""
    if path is None:
        return None
    try:
        verify_checkpoint(path)
    except CheckpointError as error:
        log.error(f"the run's last checkpoint is not usable: {error}")
        return None
    return str(path)


def remove_abandoned_saves(directory: Path) -> list[Path]:
    """Delete temporaries of saves that were killed midway (whole checkpoints each); live writers' are kept."""
    return remove_abandoned(directory, LATEST)


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


_DAMAGED = "resume from another checkpoint (resume=<path>), or delete it to start the run again"


@contextmanager
def _crc32_on() -> Iterator[None]:
    """torch.save computes each record's CRC-32 by default; a process may have switched that off globally
    (torch.serialization.set_crc32_options, torch >= 2.6; older versions always compute it)."""
    if not hasattr(torch.serialization, "set_crc32_options"):
        yield
        return
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(True)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(before)
