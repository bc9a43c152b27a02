"""Document ids of packed windows, for document masking (data.document_mask=true).

A training window is cut from a split where each document is stored as `<|endoftext|>` followed by its text
(data/shards.py), so one window can hold the tail of a document, whole documents and the head of another. With
document masking a token attends only to tokens of its own document.

Convention: an `<|endoftext|>` belongs to the document it *starts*, as in the shards. Its query sees only itself
and predicts the first token of its document from nothing else, the same prediction the model makes at the start
of a document in an unpacked batch; the last token of a document still sees its document when it predicts the
`<|endoftext|>` that ends it. Tokens before the window's first `<|endoftext|>` form document 0.
"""

import torch
from torch import Tensor

from flashgpt.data.tokenizer import EOT_ID


def document_ids(tokens: Tensor, eot_id: int = EOT_ID) -> Tensor:
    """(B, T) token ids -> (B, T) int32 document ids: 0 up to the first `<|endoftext|>`, then one more at each."""
    if tokens.dim() != 2:
        raise ValueError(f"document_ids: tokens must have shape (B, T), got {tuple(tokens.shape)}")
    return (tokens == eot_id).cumsum(dim=-1, dtype=torch.int32)
