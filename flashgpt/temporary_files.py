"""Temporary files and folders that name their writer, so that what a killed process left behind can be removed
without touching what a live one is still writing.

Checkpoints and token shards are written under a temporary name and renamed into place. A process killed in
between leaves the temporary behind: a full checkpoint, or a half-tokenized corpus. Their names carry the
writer's pid and a short hash of its host name (`.<target>.<pid>-<host>.<random><suffix>`), and a leftover is
removed when its writer is known to be gone: same host and no such process any more. A leftover of another host
(a shared file system), or one named before this scheme, cannot be checked that way and is removed only once
nothing in it has changed for STALE_AFTER_S.
"""

import hashlib
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

STALE_AFTER_S = 24 * 3600
_OWNER = re.compile(r"\.(?P<pid>\d+)-(?P<host>[0-9a-f]{8})\.")


def _host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def owner_prefix(target: str, pid: int | None = None) -> str:
    """The start of every temporary name that process `pid` of this host (default: this process) uses for
    `target`: `.<target>.<pid>-<host>.`."""
    return f".{target}.{os.getpid() if pid is None else pid}-{_host_tag()}."


def make_temp_file(directory: Path, target: str, suffix: str = ".tmp") -> tuple[int, Path]:
    """A new temporary file for `target` in `directory` (an open fd and its path), named after this process."""
    fd, name = tempfile.mkstemp(dir=directory, prefix=owner_prefix(target), suffix=suffix)
    return fd, Path(name)


def make_temp_dir(directory: Path, target: str) -> Path:
    """A new temporary folder for `target` in `directory`, named after this process."""
    return Path(tempfile.mkdtemp(dir=directory, prefix=owner_prefix(target)))


def remove_abandoned(directory: Path, target: str) -> list[Path]:
    """Delete the temporaries of `target` in `directory` whose writer is gone; returns what was deleted."""
    if not directory.is_dir():
        return []
    return [path for path in directory.glob(f".{glob_escape(target)}.*") if remove_if_abandoned(path, target)]


def remove_if_abandoned(path: Path, target: str) -> bool:
    """Delete `path`, a temporary of `target`, if its writer is gone; returns whether it was deleted."""
    if not is_abandoned(path, target):
        return False
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:  # its writer finished (renamed it) or another process removed it first
        return False
    log.warning(f"removed {path}: left behind by a process killed while writing {target}")
    return True


def is_abandoned(path: Path, target: str) -> bool:
    """Whether `path`, a temporary of `target`, was left by a writer that is gone (see the module docstring)."""
    owner = _OWNER.match(path.name[len(target) + 1 :])
    if owner and owner["host"] == _host_tag():
        return not _process_alive(int(owner["pid"]))
    return _seconds_unchanged(path) > STALE_AFTER_S


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: checks that the process exists, sends nothing
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def _seconds_unchanged(path: Path) -> float:
    """Seconds since `path`, or anything directly in it, last changed (a folder's files grow as it is written)."""
    try:
        mtimes = [path.lstat().st_mtime]
        if path.is_dir() and not path.is_symlink():
            mtimes += [child.lstat().st_mtime for child in path.iterdir()]
    except FileNotFoundError:
        return 0.0
    return time.time() - max(mtimes)
