"""Fused FlashAttention (forward and backward) in Triton."""

from .attention_op import flash_attention, flash_mask
from .dropout import effective_dropout_p
from .tile_schedule import FlashMask

__all__ = ["FlashMask", "effective_dropout_p", "flash_attention", "flash_mask"]
