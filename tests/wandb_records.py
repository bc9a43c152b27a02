"""Read what wandb wrote offline: the records of a run's .wandb file, W&B's transaction log that `wandb sync`
uploads. Its framing is LevelDB's log format (a 7-byte file header; 32 KiB blocks of chunks, each with a 7-byte
header: crc32 (4), length (2, little-endian), type (1: full, 2: first, 3: middle, 4: last)); each record is a
`wandb_internal_pb2.Record` protobuf."""

import struct
from collections.abc import Iterator
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # a block's tail too short for a chunk header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        pos += HEADER
        if kind == 0:  # zero padding up to the block's end
            pos += BLOCK - pos % BLOCK
            continue
        pending += data[pos : pos + length]
        pos += length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def offline_runs(run_dir: Path) -> list[Path]:
    """The .wandb files of a run dir's offline wandb runs, oldest first."""
    return sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
