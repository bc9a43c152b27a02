"""Tokenized corpora on disk: uint16 token shards, memory-mapped, split into train and val by whole documents.

A shard folder `<cache_dir>/<name>-<key>/` (key: a hash of everything that decides its tokens) holds
  train.bin, val.bin             uint16 tokens; each document is `<|endoftext|>` followed by its text
  train_docs.npy, val_docs.npy   int64 offset of each document's leading `<|endoftext|>`
  doc_ids.json                   {"train": [...], "val": [...]}, in shard order
  meta.json                      source, provenance, checksum, tokenizer, counts per split, format version, and
                                 the size and checksum of each file above (and of local input files)
It is written under a temporary name and renamed into place, so it is either complete or absent (a killed run
leaves at most a hidden staging folder beside it, which nothing reads and the next prepare removes). The key
hashes the config, not the source's contents, so that a GPU machine finds shipped shards without the source.

Opening a folder verifies it (data/integrity.py): every file against the size and checksum recorded when it was
written, the token and document counts against meta.json, every document starting with `<|endoftext|>`; and
where the local files a text_files or hf source reads can be found, that none was edited, added or removed since.
A folder that fails is tokenized again, or, where that is not allowed, refused with an error naming the file.
"""

import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flashgpt.data.config import DataConfig, prepare_command
from flashgpt.data.integrity import ShardError, changed_inputs, check_files, fingerprint_inputs, record_files
from flashgpt.data.sources import Document, local_input_files, open_corpus, source_identity
from flashgpt.data.tokenizer import EOT_ID, TOKENIZER_NAME, VOCAB_SIZE, get_tokenizer
from flashgpt.temporary_files import make_temp_dir, remove_if_abandoned

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: meta.json records every file's size and checksum, and the local input files
SPLITS = ("train", "val")
SHARD_FILES = ("train.bin", "val.bin", "train_docs.npy", "val_docs.npy", "doc_ids.json")
# What a staging or retired folder of `<name>-<key>` is called, before its owner and random part.
_TEMPORARY = re.compile(r"^\.(?P<target>.+-[0-9a-f]{12}(?:\.old)?)\.")
# Characters tokenized per call: enough to keep tiktoken's threads busy, with bounded memory.
_BATCH_CHARS = 4_000_000


@dataclass
class TokenSplits:
    """Both splits of a corpus. Document i of a split is tokens[docs[i]:docs[i + 1]], EOT first."""

    train: np.memmap
    val: np.memmap
    train_docs: np.ndarray
    val_docs: np.ndarray
    meta: dict[str, Any]  # meta.json, plus "shard_dir": the folder it was read from


def load_splits(cfg: DataConfig, *, prepare_if_missing: bool = True) -> TokenSplits:
    """The verified, memory-mapped splits of `cfg`'s corpus. Tokenized first if missing, and again if damaged or
    stale, when `prepare_if_missing`; otherwise those raise FileNotFoundError / ShardError naming the file."""
    directory = shard_dir(cfg)
    remove_abandoned_staging(directory.parent)
    if not (directory / "meta.json").is_file():
        if not prepare_if_missing:
            raise FileNotFoundError(
                f"no tokenized data for data={cfg.name} at {directory}. Tokenize it where its source can "
                f"be reached (GPU machines have no network): `{prepare_command(cfg)}`, then copy {directory} "
                "here."
            )
        prepare_shards(cfg)
    try:
        return _open_current(cfg, directory)
    except ShardError as error:
        if not prepare_if_missing:
            raise ShardError(
                f"{error}. Tokenize it again where its source can be reached: `{prepare_command(cfg)} --force`"
            ) from error
        log.warning(f"{error}; tokenizing data={cfg.name} again")
        try:
            prepare_shards(cfg, force=True)
        except (FileNotFoundError, ConnectionError) as unreachable:
            raise ShardError(f"{error}; tokenizing it again failed: {unreachable}") from unreachable
        return _open_current(cfg, directory)


def _open_current(cfg: DataConfig, directory: Path) -> TokenSplits:
    """open_shards, and check that the local files the source reads (if any are found here) are unchanged."""
    splits = open_shards(directory)
    recorded = splits.meta["inputs"]
    files = local_input_files(cfg) if recorded else []
    changed = changed_inputs(recorded, files) if files else []
    if changed:
        listed = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise ShardError(f"{directory} is stale: its input files changed since it was tokenized: {listed}")
    return splits


def shard_dir(cfg: DataConfig) -> Path:
    identity = {
        "source": source_identity(cfg),
        "val_fraction": cfg.val_fraction,
        "tokenizer": TOKENIZER_NAME,
        "format_version": FORMAT_VERSION,
    }
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return Path(cfg.cache_dir) / f"{cfg.name}-{key}"


def open_shards(directory: Path) -> TokenSplits:
    """The splits in `directory`, verified against its meta.json; raises ShardError naming the file that fails."""
    meta = _read_meta(directory)
    check_files(directory, meta["files"])
    tokens = {split: np.memmap(directory / f"{split}.bin", dtype=np.uint16, mode="r") for split in SPLITS}
    docs = {split: np.load(directory / f"{split}_docs.npy", allow_pickle=False) for split in SPLITS}
    for split in SPLITS:
        _check_split(directory, split, tokens[split], docs[split], meta)
    meta["shard_dir"] = str(directory)
    return TokenSplits(tokens["train"], tokens["val"], docs["train"], docs["val"], meta)


def _read_meta(directory: Path) -> dict[str, Any]:
    path = directory / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ShardError(f"{path} cannot be read: {error}") from error
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        found = meta.get("format_version") if isinstance(meta, dict) else None
        raise ShardError(f"{path} has format_version {found}, this code reads {FORMAT_VERSION}")
    missing = [key for key in ("files", "inputs", "n_tokens", "n_docs", "vocab_size") if key not in meta]
    if missing:
        raise ShardError(f"{path} lacks {', '.join(missing)}")
    return meta


def _check_split(directory: Path, split: str, tokens: np.ndarray, docs: np.ndarray, meta: dict[str, Any]) -> None:
    """Counts as recorded, and document offsets that start at 0, increase, and each point at an EOT."""
    if len(tokens) != meta["n_tokens"][split]:
        raise ShardError(
            f"{directory / split}.bin holds {len(tokens)} tokens, meta.json says {meta['n_tokens'][split]}"
        )
    where = directory / f"{split}_docs.npy"
    if docs.ndim != 1 or docs.dtype != np.int64 or len(docs) != meta["n_docs"][split]:
        raise ShardError(f"{where} is not {meta['n_docs'][split]} int64 document offsets")
    if len(docs) and (docs[0] != 0 or np.any(np.diff(docs) <= 0) or docs[-1] >= len(tokens)):
        raise ShardError(f"{where} offsets do not start at 0 and increase within the {len(tokens)} tokens")
    if np.any(tokens[docs] != EOT_ID):
        raise ShardError(f"{directory / split}.bin has documents that do not start with <|endoftext|>")


def read_doc_ids(directory: Path) -> dict[str, list[str]]:
    """The document ids of each split, in shard order."""
    return json.loads((directory / "doc_ids.json").read_text())


def prepare_shards(cfg: DataConfig, *, force: bool = False) -> Path:
    """Tokenize `cfg`'s corpus into its shard folder unless it is there (or `force`); return the folder."""
    directory = shard_dir(cfg)
    if (directory / "meta.json").is_file() and not force:
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_staging(directory.parent)
    staging = make_temp_dir(directory.parent, directory.name)
    try:
        staging.chmod(0o755)  # mkdtemp makes it private; the published folder is ordinary shared data
        _write_shards(cfg, staging)
        _publish(staging, directory, replace=force)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def remove_abandoned_staging(cache_dir: Path) -> list[Path]:
    """Delete the staging and retired folders of shard folders in `cache_dir` whose writer was killed (a live
    writer's are kept; see flashgpt/temporary_files.py); returns what was deleted."""
    if not cache_dir.is_dir():
        return []
    removed = []
    for path in cache_dir.glob(".*"):
        named = _TEMPORARY.match(path.name)
        if named and remove_if_abandoned(path, named["target"]):
            removed.append(path)
    return removed


def split_score(work: str) -> float:
    """A stable pseudo-random number in [0, 1) for a work: the same on every machine, run and seed."""
    return int.from_bytes(hashlib.sha256(work.encode()).digest()[:8], "big") / 2**64


@dataclass
class _Tokenized:
    doc_ids: list[str] = field(default_factory=list)
    works: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    n_empty: int = 0
    n_duplicate: int = 0
    source_sha256: str = ""


def _write_shards(cfg: DataConfig, out: Path) -> None:
    started = time.perf_counter()
    corpus = open_corpus(cfg)
    tokenized = _tokenize(corpus.documents, out / "all.bin")
    is_val = _val_mask(tokenized.works, cfg.val_fraction)
    all_tokens = np.memmap(out / "all.bin", dtype=np.uint16, mode="r")
    doc_ids, n_tokens = {}, {}
    for split, in_split in zip(SPLITS, (~is_val, is_val), strict=True):
        chosen = np.flatnonzero(in_split)
        lengths = np.array([tokenized.lengths[i] for i in chosen], dtype=np.int64)
        with (out / f"{split}.bin").open("wb") as f:
            for i in chosen:
                start = tokenized.offsets[i]
                f.write(all_tokens[start : start + tokenized.lengths[i]].tobytes())
        np.save(out / f"{split}_docs.npy", np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))
        doc_ids[split] = [tokenized.doc_ids[i] for i in chosen]
        n_tokens[split] = int(lengths.sum())
    del all_tokens
    (out / "all.bin").unlink()
    (out / "doc_ids.json").write_text(json.dumps(doc_ids, indent=0))
    inputs = fingerprint_inputs(local_input_files(cfg))  # after reading them: an edit meanwhile shows as stale
    meta = {
        "format_version": FORMAT_VERSION,
        "source": cfg.name,
        "source_config": source_identity(cfg),
        "provenance": corpus.provenance,
        "source_sha256": tokenized.source_sha256,  # of every (doc_id, text) the source yielded, in order
        "tokenizer": TOKENIZER_NAME,
        "vocab_size": VOCAB_SIZE,
        "eot_id": EOT_ID,
        "dtype": "uint16",
        "val_fraction": cfg.val_fraction,
        "n_docs": {split: len(ids) for split, ids in doc_ids.items()},
        "n_tokens": n_tokens,
        "skipped_docs": {"empty": tokenized.n_empty, "duplicate": tokenized.n_duplicate},
        "files": record_files(out, SHARD_FILES),
        "inputs": inputs,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "prepare_seconds": round(time.perf_counter() - started, 1),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2))


def _tokenize(documents: Iterable[Document], path: Path) -> _Tokenized:
    """Write each document as `<|endoftext|>` + its tokens to `path`, skipping empty and repeated texts.

    A repeated text would otherwise be able to sit in both splits.
    """
    encoding = get_tokenizer()
    result = _Tokenized()
    checksum = hashlib.sha256()
    seen: set[bytes] = set()
    offset = 0
    with path.open("wb") as f:
        for batch in _batches(documents):
            kept = []
            for doc in batch:
                for part in (doc.doc_id.encode(), doc.text.encode()):
                    checksum.update(len(part).to_bytes(8, "little") + part)
                fingerprint = hashlib.sha256(doc.text.encode()).digest()
                if not doc.text.strip():
                    result.n_empty += 1
                elif fingerprint in seen:
                    result.n_duplicate += 1
                else:
                    seen.add(fingerprint)
                    kept.append(doc)
            for doc, ids in zip(kept, encoding.encode_ordinary_batch([d.text for d in kept]), strict=True):
                tokens = np.empty(len(ids) + 1, dtype=np.uint16)
                tokens[0] = EOT_ID
                tokens[1:] = ids
                f.write(tokens.tobytes())
                result.doc_ids.append(doc.doc_id)
                result.works.append(doc.work)
                result.offsets.append(offset)
                result.lengths.append(len(tokens))
                offset += len(tokens)
    result.source_sha256 = checksum.hexdigest()
    return result


def _batches(documents: Iterable[Document]) -> Iterator[list[Document]]:
    batch, n_chars = [], 0
    for doc in documents:
        batch.append(doc)
        n_chars += len(doc.text)
        if n_chars >= _BATCH_CHARS:
            yield batch
            batch, n_chars = [], 0
    if batch:
        yield batch


def _val_mask(works: list[str], val_fraction: float) -> np.ndarray:
    """Which documents go to val: those whose work scores below val_fraction; at least one work a side."""
    distinct = sorted(set(works))
    if len(distinct) < 2:
        raise ValueError(
            f"the source yielded {len(works)} non-empty distinct document(s) of {len(distinct)} work(s); "
            "a train/val split by document needs at least two"
        )
    scores = {work: split_score(work) for work in distinct}
    val_works = {work for work in distinct if scores[work] < val_fraction}
    if not val_works:
        val_works = {min(distinct, key=scores.__getitem__)}
    if len(val_works) == len(distinct):
        val_works.remove(max(distinct, key=scores.__getitem__))
    return np.array([work in val_works for work in works])


def _publish(staging: Path, directory: Path, *, replace: bool) -> None:
    if directory.exists() and (replace or not (directory / "meta.json").is_file()):
        # Move the old folder aside before deleting it: a rename is atomic, a recursive delete is not.
        retired = make_temp_dir(directory.parent, f"{directory.name}.old")
        os.rename(directory, retired / directory.name)
        shutil.rmtree(retired)
    try:
        os.rename(staging, directory)
    except OSError:
        if not (directory / "meta.json").is_file():
            raise
        # Another process (another rank, say) published the same shards first; they are as good as ours.
