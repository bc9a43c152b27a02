"""Fused FlashAttention (forward and backward) in Triton."""

from .dropout import effective_dropout_p
from .interface import flash_attention

__all__ = ["effective_dropout_p", "flash_attention"]
