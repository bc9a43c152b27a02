"""Tokenize a corpus ahead of time, on a CPU machine that can reach its source.

GPU machines have no network: prepare the shards here and ship the folder this prints with the run (same path,
relative to the directory train.py runs in). The overrides are those of train.py's `data` group:

    python scripts/prepare_data.py data=long_prose
    python scripts/prepare_data.py data=hf data.hf_path=wikitext data.hf_name=wikitext-103-raw-v1
    python scripts/prepare_data.py data=text_files 'data.path=corpus/*.txt' data.val_fraction=0.05
"""

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from flashgpt.data.config import SOURCE_NAMES, DataConfig, check_data_config
from flashgpt.data.integrity import ShardError
from flashgpt.data.shards import load_splits, open_shards, prepare_shards, shard_dir

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "data"


def data_config(overrides: list[str]) -> DataConfig:
    """configs/data/<name>.yaml on DataConfig's defaults, then the `data.FIELD=VALUE` overrides."""
    name, fields = "shakespeare", {}
    for override in overrides:
        key, equals, raw = override.partition("=")
        if not equals or not (key == "data" or key.startswith("data.")):
            raise ValueError(f"override {override!r}: expected data=NAME or data.FIELD=VALUE")
        if key == "data":
            name = raw
        elif key == "data.name":  # it would replace the source data=NAME chose, keeping the other's settings
            raise ValueError(f"override {override!r}: choose the source with data=NAME, not data.name")
        else:
            fields[key.removeprefix("data.")] = _parse_value(raw)
    if name not in SOURCE_NAMES:
        raise ValueError(f"unknown data source {name!r}; choose one of {', '.join(SOURCE_NAMES)}")
    group_file = OmegaConf.load(CONFIG_DIR / f"{name}.yaml")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(DataConfig), group_file, fields)
    except OmegaConfBaseException as error:  # an unknown field or a value of the wrong type
        fields_are = ", ".join(f"data.{field}" for field in DataConfig.__dataclass_fields__)
        valid = f"; the fields are {fields_are}" if isinstance(error, ConfigKeyError) else ""
        raise ValueError(f"data.{error.key}={fields.get(error.key)!r}: {error.msg.splitlines()[0]}{valid}") from error
    cfg = OmegaConf.to_object(merged)
    check_data_config(cfg)
    return cfg


def _parse_value(raw: str) -> Any:
    try:
        return yaml.safe_load(raw)  # numbers, null, booleans, quoted strings
    except yaml.YAMLError:
        return raw  # a glob such as *.txt, which YAML would take for an alias


def _prepare(cfg: DataConfig, force: bool) -> tuple[Path, str]:
    """Tokenize unless the shards are there, verified and made from today's inputs (as train.py checks them:
    shards shipped to a GPU machine cannot be checked against the inputs there); returns the folder and what
    was done."""
    directory = shard_dir(cfg)
    if force or not (directory / "meta.json").is_file():
        return prepare_shards(cfg, force=force), "prepared"
    try:
        load_splits(cfg, prepare_if_missing=False)
    except ShardError as error:
        reason = error.__cause__ or error  # without load_splits' advice to run this script
        return prepare_shards(cfg, force=True), f"prepared again ({reason})"
    return directory, "already prepared, checked against its inputs (--force redoes it)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="data=NAME and data.FIELD=VALUE (see data/config.py)")
    parser.add_argument("--force", action="store_true", help="tokenize again even if the shards exist")
    args = parser.parse_args()
    try:
        cfg = data_config(args.overrides)
    except ValueError as err:
        parser.error(str(err))
    try:
        directory, state = _prepare(cfg, args.force)
    except (FileNotFoundError, ValueError) as err:
        sys.exit(f"error: {err}")  # missing data or a bad config: the message says what to do
    meta = open_shards(directory).meta
    size_mib = sum(f.stat().st_size for f in directory.iterdir()) / 2**20
    n_docs, n_tokens = meta["n_docs"], meta["n_tokens"]
    print(f"data={cfg.name}: {state} in {directory} ({size_mib:.1f} MiB)")
    for split in ("train", "val"):
        print(f"  {split:5s} {n_docs[split]:>8,} documents {n_tokens[split]:>14,} tokens")
    print(f"  total {sum(n_docs.values()):>8,} documents {sum(n_tokens.values()):>14,} tokens")
    skipped = meta["skipped_docs"]
    print(f"  skipped {skipped['empty']} empty and {skipped['duplicate']} repeated documents")
    print(f"  source sha256 {meta['source_sha256']}, prepared in {meta['prepare_seconds']} s")


if __name__ == "__main__":
    main()
