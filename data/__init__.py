"""Data pipeline: offline GPT-2 BPE, corpora, memory-mapped shards split by document, window sampling."""

from data.config import DataConfig
from data.shards import TokenSplits, load_splits
from data.tokenizer import EOT_ID, get_tokenizer

__all__ = ["EOT_ID", "DataConfig", "TokenSplits", "get_tokenizer", "load_splits"]
