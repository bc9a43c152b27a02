"""Data pipeline: offline GPT-2 BPE, corpora, memory-mapped shards split by document, window sampling."""

from flashgpt.data.config import DataConfig
from flashgpt.data.shards import TokenSplits, load_splits
from flashgpt.data.tokenizer import EOT_ID, get_tokenizer

__all__ = ["EOT_ID", "DataConfig", "TokenSplits", "get_tokenizer", "load_splits"]
