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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs from anywhere, also without the install

from flashgpt.data.config import SOURCE_NAMES, DataConfig, check_data_config
from flashgpt.data.shards import open_shards, prepare_shards, shard_dir

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
        else:
            fields[key.removeprefix("data.")] = _parse_value(raw)
    if name not in SOURCE_NAMES:
        raise ValueError(f"unknown data source {name!r}; choose one of {', '.join(SOURCE_NAMES)}")
    group_file = OmegaConf.load(CONFIG_DIR / f"{name}.yaml")
    merged = OmegaConf.merge(OmegaConf.structured(DataConfig), group_file, fields)
    cfg = OmegaConf.to_object(merged)
    check_data_config(cfg)
    return cfg


def _parse_value(raw: str) -> Any:
    try:
        return yaml.safe_load(raw)  # numbers, null, booleans, quoted strings
    except yaml.YAMLError:
        return raw  # a glob such as *.txt, which YAML would take for an alias


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="data=NAME and data.FIELD=VALUE (see data/config.py)")
    parser.add_argument("--force", action="store_true", help="tokenize again even if the shards exist")
    args = parser.parse_args()
    try:
        cfg = data_config(args.overrides)
    except ValueError as err:
        parser.error(str(err))
    existed = (shard_dir(cfg) / "meta.json").is_file()
    try:
        directory = prepare_shards(cfg, force=args.force)
    except (FileNotFoundError, ValueError) as err:
        sys.exit(f"error: {err}")  # missing data or a bad config: the message says what to do
    meta = open_shards(directory).meta
    size_mib = sum(f.stat().st_size for f in directory.iterdir()) / 2**20
    n_docs, n_tokens = meta["n_docs"], meta["n_tokens"]
    state = "already prepared (--force redoes it)" if existed and not args.force else "prepared"
    print(f"data={cfg.name}: {state} in {directory} ({size_mib:.1f} MiB)")
    for split in ("train", "val"):
        print(f"  {split:5s} {n_docs[split]:>8,} documents {n_tokens[split]:>14,} tokens")
    print(f"  total {sum(n_docs.values()):>8,} documents {sum(n_tokens.values()):>14,} tokens")
    skipped = meta["skipped_docs"]
    print(f"  skipped {skipped['empty']} empty and {skipped['duplicate']} repeated documents")
    print(f"  source sha256 {meta['source_sha256']}, prepared in {meta['prepare_seconds']} s")


if __name__ == "__main__":
    main()
