"""attention=sdpa: PyTorch's F.scaled_dot_product_attention (cuDNN, FlashAttention-2, memory-efficient)."""

import torch.nn.functional as F
from torch import Tensor

from flashgpt.model.attention import AttentionMask, InnerAttention


class SdpaAttention(InnerAttention):
    """PyTorch's F.scaled_dot_product_attention, which dispatches to its own fused kernels (cuDNN, FA2, ...).

    Plain causal attention with Tq == Tk takes its is_causal fast path. Any other mask goes in as the dense boolean
    attn_mask, which rules out its FlashAttention-2 kernel (cuDNN or memory-efficient attention run instead) and
    costs Tq·Tk bytes (B times that with document ids). is_causal itself is not used for Tq < Tk: sdpa aligns it
    top-left, while our causal mask is aligned bottom-right."""

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, *, mask: AttentionMask, dropout_p: float, scale: float
    ) -> Tensor:
        if not mask.extra_masks and q.size(-2) == k.size(-2):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=mask.causal, scale=scale)
        visible = mask.dense(q.size(-2), k.size(-2), q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, dropout_p=dropout_p, scale=scale)
