"""The `data:` node of the config tree (merged with configs/data/<name>.yaml by the trainer's schema)."""

import shlex
from dataclasses import dataclass, fields

SOURCE_NAMES = ("shakespeare", "long_prose", "python_stdlib", "sympy", "python_code", "long_mix", "hf", "text_files")


@dataclass
class DataConfig:
    name: str = "shakespeare"  # one of SOURCE_NAMES
    cache_dir: str = ".cache/data"  # relative to the current directory (Hydra does not chdir)
    val_fraction: float = 0.1  # share of whole documents held out; the split is a hash of the document id
    max_documents: int | None = None  # read at most this many documents from the source
    # hf: any `datasets.load_dataset(hf_path, hf_name, split=hf_split, data_files=data_files)` source
    hf_path: str | None = None
    hf_name: str | None = None
    hf_split: str = "train"
    data_files: str | None = None  # local files for builders such as "json", "parquet" or "text"
    text_field: str = "text"
    streaming: bool = False  # iterate without downloading the whole dataset first
    # text_files: a folder (every file under it) or a glob; one document per file
    path: str | None = None
    # Document masking: a token attends only within its document of the packed window (data/documents.py).
    # Read by the trainer, not by tokenizing: the same shards serve both settings.
    document_mask: bool = False


def prepare_command(cfg: DataConfig) -> str:
    """The command that tokenizes this corpus ahead of time (the fields that differ from the defaults)."""
    overrides = [f"data={cfg.name}"]
    for field in fields(DataConfig):
        value = getattr(cfg, field.name)
        if field.name not in ("name", "document_mask") and value != field.default:
            overrides.append(shlex.quote(f"data.{field.name}={'null' if value is None else value}"))
    return " ".join(["python scripts/prepare_data.py", *overrides])


def check_data_config(cfg: DataConfig) -> None:
    """Reject a config that cannot name a corpus, with the fix in the message."""
    if cfg.name not in SOURCE_NAMES:
        raise ValueError(f"unknown data source {cfg.name!r}; choose one of {', '.join(SOURCE_NAMES)}")
    if not 0.0 < cfg.val_fraction < 1.0:
        raise ValueError(f"data.val_fraction={cfg.val_fraction} must lie strictly between 0 and 1")
    if cfg.max_documents is not None and cfg.max_documents < 2:
        raise ValueError(f"data.max_documents={cfg.max_documents}: a split by document needs 2 or more")
    if cfg.name == "hf" and not cfg.hf_path:
        raise ValueError(
            "data=hf needs data.hf_path: a Hugging Face dataset id (e.g. data.hf_path=wikitext "
            "data.hf_name=wikitext-103-raw-v1) or a builder reading local files "
            "(e.g. data.hf_path=json data.data_files='corpus/*.jsonl')"
        )
    if cfg.name == "text_files" and not cfg.path:
        raise ValueError(
            "data=text_files needs data.path: a folder or glob of text files, e.g. data.path='corpus/*.txt'"
        )
