"""attention=naive: the textbook reference, softmax(q kᵀ · scale + mask) v with the score matrix materialised."""

import torch.nn.functional as F
from torch import Tensor

from flashgpt.model.attention import AttentionMask, InnerAttention


class NaiveAttention(InnerAttention):
    """The textbook reference: materialises the (Tq, Tk) score matrix, so memory grows as T²."""

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, *, mask: AttentionMask, dropout_p: float, scale: float
    ) -> Tensor:
        scores = (q @ k.transpose(-2, -1)).float() * scale  # (B, H, Tq, Tk), fp32 even under bf16 autocast
        visible = mask.dense(q.size(-2), k.size(-2), q.device)
        if visible is not None:
            scores = scores.masked_fill(~visible, float("-inf"))
        probs = scores.softmax(dim=-1)
        if mask.block_mask is not None:
            # Only a block mask can hide every key of a row (causal, window and documents keep the query's own
            # key); such a row's softmax is 0/0 = NaN, and its output is defined as 0.
            probs = probs.masked_fill(~visible, 0.0)
        probs = F.dropout(probs, p=dropout_p).to(v.dtype)
        return probs @ v  # (B, H, Tq, D)
