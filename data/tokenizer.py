"""GPT-2 BPE that works with no network.

`tiktoken.get_encoding("gpt2")` downloads its merge ranks on first use and GPU machines have no network, so
the ranks are vendored (see assets/README.md) and checked against the hash tiktoken expects for r50k_base.
"""

from functools import cache
from pathlib import Path

import tiktoken
import tiktoken.load
from tiktoken_ext.openai_public import r50k_pat_str

TOKENIZER_NAME = "gpt2"
EOT_ID = 50256
EOT_TEXT = "<|endoftext|>"
VOCAB_SIZE = 50257

RANKS_PATH = Path(__file__).parent / "assets" / "gpt2.tiktoken"
RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


@cache
def get_tokenizer() -> tiktoken.Encoding:
    """The GPT-2 encoding (50,257 ids, `<|endoftext|>` = 50256), built from the vendored ranks."""
    ranks = tiktoken.load.load_tiktoken_bpe(str(RANKS_PATH), expected_hash=RANKS_SHA256)
    return tiktoken.Encoding(
        name=TOKENIZER_NAME,
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={EOT_TEXT: EOT_ID},
        explicit_n_vocab=VOCAB_SIZE,
    )
