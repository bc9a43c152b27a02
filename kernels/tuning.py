"""Launch configurations: tile sizes, warps and pipeline stages per (pass, head dim, dtype, causal, T bucket).

The table is measured on Hopper by `scripts/tune_attention.py` and committed as `tuned_h100.json`; a lookup is
a dictionary access, so nothing is re-tuned at run time. Shapes the table does not cover fall back to the
defaults below, which are sound on any GPU Triton supports. Under the interpreter tiles are chosen for speed on
the CPU (fewer, larger numpy operations), since warps and stages mean nothing there.
"""

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

TUNED_TABLE = Path(__file__).with_name("tuned_h100.json")
SEQ_LEN_BUCKETS = (1024, 2048, 4096, 8192, 16384)
PASSES = ("fwd", "bwd_dkdv", "bwd_dq", "bwd_fused")
# Passes whose programs own a tile of keys and walk tiles of queries; the others own queries and walk keys.
KEY_ROW_PASSES = frozenset({"bwd_dkdv", "bwd_fused", "bwd_dkdv_hopper", "bwd_fused_hopper"})
NATIVE_HEAD_DIMS = (16, 32, 64, 128, 256)  # the kernels' HEAD_DIM; other head dims are zero-padded to one of these
MIN_TILE = 16


@dataclass(frozen=True)
class LaunchConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    tma: bool = False  # the tiles a program streams (K/V, or Q/dO for the key-row passes) via tensor descriptors
    # A cap on registers per thread (ptxas's maxnreg): below 65536 / (threads per program · 3), three programs
    # fit on an SM instead of two, at the price of whatever ptxas then spills. None: ptxas chooses.
    maxnreg: int | None = None

    @classmethod
    def parse(cls, text: str) -> "LaunchConfig":
        """BLOCK_M,BLOCK_N,WARPS,STAGES[,tma][,maxnreg=N], as the profiling scripts take it on the command line."""
        fields = text.split(",")
        if len(fields) < 4:
            raise ValueError(f"launch configuration {text!r}: expected BLOCK_M,BLOCK_N,WARPS,STAGES[,tma][,maxnreg=N]")
        extra: dict = {"tma": "tma" in fields[4:]}
        for field in fields[4:]:
            if field.startswith("maxnreg="):
                extra["maxnreg"] = int(field.removeprefix("maxnreg="))
            elif field != "tma":
                raise ValueError(f"unknown field {field!r} in launch configuration {text!r}")
        return cls(*map(int, fields[:4]), **extra)

    def as_dict(self) -> dict:
        """The fields as the tuned table stores them (maxnreg only where set)."""
        fields = dict(vars(self))
        if fields["maxnreg"] is None:
            del fields["maxnreg"]
        return fields

    def validate(self, kernel_pass: str) -> None:
        """Each pass walks its diagonal band in steps of the smaller tile, which must divide the larger. Tiles are
        powers of two of at least 16: tl.dot needs 16, and a dropout draw spans 16 keys (and 32 queries, half of
        which a 16-row query tile takes)."""
        for tile in (self.block_m, self.block_n):
            if tile < MIN_TILE or tile & (tile - 1):
                raise ValueError(f"{kernel_pass}: tile {tile} must be a power of two >= {MIN_TILE} ({self})")
        big, small = (self.block_n, self.block_m) if kernel_pass in KEY_ROW_PASSES else (self.block_m, self.block_n)
        if big % small:
            raise ValueError(f"{kernel_pass}: tile {small} must divide tile {big} ({self})")


_DEFAULTS: dict[tuple[str, int], LaunchConfig] = {
    ("fwd", 32): LaunchConfig(128, 64, 4, 3),
    ("fwd", 64): LaunchConfig(128, 64, 4, 3),
    ("fwd", 128): LaunchConfig(128, 64, 8, 3),
    ("bwd_dkdv", 32): LaunchConfig(32, 128, 4, 3),
    ("bwd_dkdv", 64): LaunchConfig(32, 128, 4, 3),
    ("bwd_dkdv", 128): LaunchConfig(32, 128, 8, 3),
    ("bwd_dq", 32): LaunchConfig(128, 32, 4, 3),
    ("bwd_dq", 64): LaunchConfig(128, 32, 4, 3),
    ("bwd_dq", 128): LaunchConfig(128, 32, 8, 3),
    ("bwd_fused", 32): LaunchConfig(32, 128, 4, 3),
    ("bwd_fused", 64): LaunchConfig(32, 128, 4, 3),
    ("bwd_fused", 128): LaunchConfig(32, 128, 8, 3),
    # D = 256: a 64x256 bf16 tile is 32 KiB, so smaller tiles and fewer stages keep K/V (or Q/dO) buffers within
    # the ~100 KiB of shared memory of consumer GPUs, and 8 warps keep the 256-wide fp32 accumulators in registers.
    ("fwd", 256): LaunchConfig(64, 32, 8, 2),
    ("bwd_dkdv", 256): LaunchConfig(16, 32, 8, 1),
    ("bwd_dq", 256): LaunchConfig(32, 16, 8, 1),
    ("bwd_fused", 256): LaunchConfig(16, 32, 8, 1),
}
_INTERPRETER = LaunchConfig(64, 32, 1, 1)


def seq_len_bucket(seq_len: int) -> int:
    """The smallest tuned bucket that holds seq_len (the largest bucket for anything longer)."""
    return next((b for b in SEQ_LEN_BUCKETS if seq_len <= b), SEQ_LEN_BUCKETS[-1])


def table_key(kernel_pass: str, head_dim: int, dtype: str, causal: bool, dropout: bool, bucket: int) -> str:
    mask, drop = "causal" if causal else "full", "drop" if dropout else "nodrop"
    return f"{kernel_pass}/d{head_dim}/{dtype}/{mask}/{drop}/T{bucket}"


def _lookup(table: dict, kernel_pass: str, head_dim: int, dtype: str, causal: bool, dropout: bool, bucket: int):
    """The table's entry for a call, or None. The tuner measures causal attention; a non-causal call without entries
    of its own takes the causal one, since its programs walk whole rows as the causal table's longest walks do (on an
    H200, fwd+bwd 1.1-1.4x the untuned defaults it took before: results/tuning/h200-2026-11-29-noncausal/)."""
    key = table_key(kernel_pass, head_dim, dtype, causal, dropout, bucket)
    if key not in table and not causal:
        key = table_key(kernel_pass, head_dim, dtype, True, dropout, bucket)
    return table.get(key)


@cache
def _tuned_file() -> dict:
    return json.loads(TUNED_TABLE.read_text()) if TUNED_TABLE.exists() else {}


@cache
def _tuned_table() -> dict[str, LaunchConfig]:
    return {key: LaunchConfig(**cfg) for key, cfg in _tuned_file().get("configs", {}).items()}


@cache
def backward_schedule(
    head_dim: int,
    dtype: str,
    causal: bool,
    dropout: bool,
    seq_len: int,
    *,
    documents: bool = False,
    interpreting: bool,
    hopper: bool,
) -> str:
    """The faster backward where determinism is not asked for: "fused" (5 products, dQ summed with float atomics)
    or "split" (the deterministic 7-product kernels), as the tuner measured it for this shape on Hopper. Split for
    shapes and GPUs it did not measure, where the fused one is untimed (and it won only with dropout where it was
    timed); fused in the interpreter, so that the CPU tests run it by default. With document masks the table's
    `backward_documents` entries, where measured, take precedence: their short, ragged loops favour another choice."""
    if interpreting:
        return "fused"
    if not hopper:
        return "split"
    tuned_dtype = "bfloat16" if dtype == "float16" else dtype
    key = (head_dim, tuned_dtype, causal, dropout, seq_len_bucket(seq_len))
    table = _tuned_file()
    if documents and (choice := _lookup(table.get("backward_documents", {}), "backward", *key)) is not None:
        return choice
    return _lookup(table.get("backward", {}), "backward", *key) or "split"


# The Gluon passes (`flash_fwd_hopper.py`, `flash_bwd_*_hopper.py`), with tables of their own.
HOPPER_PASSES = ("fwd_hopper", "bwd_dq_hopper", "bwd_dkdv_hopper", "bwd_fused_hopper")


def hopper_config(
    kernel_pass: str, head_dim: int, dtype: str, causal: bool, dropout: bool, seq_len: int
) -> LaunchConfig | None:
    """The launch configuration of the warp-specialised Gluon pass `kernel_pass` (one of HOPPER_PASSES: Hopper
    only, dense, each drawing its own dropout mask) where the table measured it faster than the Triton pass for
    this shape, else None. Its `maxnreg` is the whole program's register cap. fp16 shares the bf16
    measurements, as in `launch_config`."""
    return _hopper_config_for_bucket(kernel_pass, head_dim, dtype, causal, dropout, seq_len_bucket(seq_len))


def nearest_hopper_config(
    kernel_pass: str, head_dim: int, dtype: str, causal: bool, dropout: bool, seq_len: int
) -> LaunchConfig | None:
    """The table's configuration of `kernel_pass` for the bucket nearest seq_len's that lists one (the longer of
    two as near), else None: for masked calls, whose passes are fitted to their masks whatever the dense table
    chose (`launch.gluon_config`)."""
    return _nearest_hopper_config_for_bucket(kernel_pass, head_dim, dtype, causal, dropout, seq_len_bucket(seq_len))


@cache
def _nearest_hopper_config_for_bucket(
    kernel_pass: str, head_dim: int, dtype: str, causal: bool, dropout: bool, bucket: int
) -> LaunchConfig | None:
    by_distance = sorted(SEQ_LEN_BUCKETS, key=lambda b: (abs(math.log2(b / bucket)), -b))
    configs = (_hopper_config_for_bucket(kernel_pass, head_dim, dtype, causal, dropout, b) for b in by_distance)
    return next((cfg for cfg in configs if cfg is not None), None)


@cache  # asked on every backward call; keyed by the T bucket, so the cache stays small
def _hopper_config_for_bucket(
    kernel_pass: str, head_dim: int, dtype: str, causal: bool, dropout: bool, bucket: int
) -> LaunchConfig | None:
    tuned_dtype = "bfloat16" if dtype == "float16" else dtype
    entry = _lookup(_tuned_file().get(kernel_pass, {}), kernel_pass, head_dim, tuned_dtype, causal, dropout, bucket)
    return LaunchConfig(**entry) if entry is not None else None


def launch_config(
    kernel_pass: str,
    head_dim: int,
    dtype: str,
    causal: bool,
    dropout: bool,
    seq_len: int,
    *,
    interpreting: bool,
    hopper: bool,
) -> LaunchConfig:
    """The configuration to launch `kernel_pass` with; `dtype` is 'float16', 'bfloat16' or 'float32'.

    The table was measured on an H100 and is used on Hopper GPUs only: its largest tiles would not fit the shared
    memory of smaller chips."""
    return _config_for_bucket(
        kernel_pass, head_dim, dtype, causal, dropout, seq_len_bucket(seq_len), interpreting, hopper
    )


@cache  # three lookups per fwd+bwd; keyed by the T bucket, so the cache stays small
def _config_for_bucket(
    kernel_pass: str,
    head_dim: int,
    dtype: str,
    causal: bool,
    dropout: bool,
    bucket: int,
    interpreting: bool,
    hopper: bool,
) -> LaunchConfig:
    if interpreting:
        return LaunchConfig(32, 64, 1, 1) if kernel_pass in KEY_ROW_PASSES else _INTERPRETER
    if hopper:
        # fp16 tiles cost exactly what bf16 tiles cost, so fp16 shares the bf16 measurements.
        tuned_dtype = "bfloat16" if dtype == "float16" else dtype
        tuned = _lookup(_tuned_table(), kernel_pass, head_dim, tuned_dtype, causal, dropout, bucket)
        if tuned is not None:
            return tuned
    default = _DEFAULTS[(kernel_pass, max(32, head_dim))]
    if dtype == "float32":  # fp32 tiles take twice the shared memory
        block_m, block_n = max(MIN_TILE, default.block_m // 2), max(MIN_TILE, default.block_n // 2)
        return LaunchConfig(block_m, block_n, default.num_warps, min(2, default.num_stages))
    return default
