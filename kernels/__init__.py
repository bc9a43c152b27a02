"""Fused FlashAttention (forward and backward) in Triton."""

from .interface import flash_attention

__all__ = ["flash_attention"]
