"""Is a token cache the one that was written, and were its inputs left unchanged since?

When a shard folder is written, its meta.json records the size and checksum of every file in it, and, for sources
that read files of this machine (text_files, hf with local data_files), each input file's size, modification time
and sha256. Opening the folder checks the sizes (a truncated, resized, empty or odd-sized file fails at once) and
the checksums (a file overwritten in place fails); a changed, added or removed input file makes the cache stale.

The checksum is BLAKE2b (128-bit digest) of the file's size and bytes: in the standard library, about 1.3 GB/s on
one core, so a corpus of 250M tokens (0.5 GB) is checked in well under a second at every start. Above
FULL_HASH_MAX_BYTES a file is checked by SAMPLED_CHUNKS chunks spread evenly over it, first and last included
(64 MiB read), so opening a many-gigabyte corpus stays fast: any change of size, and any overwrite larger than the
gap between chunks, is still caught; a few flipped bytes in a file that large may not be.

Inputs are compared by size and modification time first, then by sha256 only where those differ, so a copy that
only touched the times is not taken for an edit.
"""

import hashlib
import os
from pathlib import Path
from typing import Any

from flashgpt.data.fetch import sha256_of

FULL_HASH_MAX_BYTES = 1 << 30
SAMPLED_CHUNKS = 1024
SAMPLE_BYTES = 1 << 16
_READ_BYTES = 1 << 20


class ShardError(ValueError):
    """A token cache that is damaged, incomplete or stale; the message names the file."""


def file_checksum(path: Path) -> str:
    """BLAKE2b-128 of the file's size and contents (sampled above FULL_HASH_MAX_BYTES), as hex."""
    size = path.stat().st_size
    digest = hashlib.blake2b(size.to_bytes(8, "little"), digest_size=16)
    with path.open("rb") as f:
        if size <= FULL_HASH_MAX_BYTES:
            for chunk in iter(lambda: f.read(_READ_BYTES), b""):
                digest.update(chunk)
        else:
            last = size - SAMPLE_BYTES
            for index in range(SAMPLED_CHUNKS):
                f.seek(last * index // (SAMPLED_CHUNKS - 1))
                digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()


def record_files(directory: Path, names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """{name: {"bytes", "blake2b"}} of the files `names` of `directory`, for meta.json."""
    return {
        name: {"bytes": (directory / name).stat().st_size, "blake2b": file_checksum(directory / name)} for name in names
    }


def check_files(directory: Path, recorded: dict[str, dict[str, Any]]) -> None:
    """Raise ShardError naming the first file of `directory` that is missing or differs from its record."""
    for name, expected in recorded.items():
        path = directory / name
        if not path.is_file():
            raise ShardError(f"{path} is missing")
        size = path.stat().st_size
        if size != expected["bytes"]:
            raise ShardError(f"{path} has {size} bytes, {expected['bytes']} when it was written (truncated or resized)")
        if file_checksum(path) != expected["blake2b"]:
            raise ShardError(f"{path} does not match the checksum recorded when it was written (overwritten)")


def fingerprint_inputs(files: list[Path]) -> dict[str, dict[str, Any]]:
    """{path: {"bytes", "mtime_ns", "sha256"}} of a source's local input files, for meta.json."""
    return {str(path): _fingerprint(path, with_sha256=True) for path in files}


def changed_inputs(recorded: dict[str, dict[str, Any]], files: list[Path]) -> list[str]:
    """The input files added, removed or edited since `recorded` (fingerprint_inputs) was taken."""
    now = {str(path): path for path in files}
    changed = [f"{name} (removed)" for name in sorted(recorded.keys() - now.keys())]
    changed += [f"{name} (added)" for name in sorted(now.keys() - recorded.keys())]
    for name in sorted(recorded.keys() & now.keys()):
        before, stat = recorded[name], _fingerprint(now[name], with_sha256=False)
        same_stat = (stat["bytes"], stat["mtime_ns"]) == (before["bytes"], before["mtime_ns"])
        if not same_stat and sha256_of(now[name]) != before["sha256"]:
            changed.append(f"{name} (edited)")
    return changed


def _fingerprint(path: Path, *, with_sha256: bool) -> dict[str, Any]:
    stat = os.stat(path)
    fingerprint = {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    if with_sha256:
        fingerprint["sha256"] = sha256_of(path)
    return fingerprint
