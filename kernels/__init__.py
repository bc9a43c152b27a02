"""Fused FlashAttention (forward and backward) in Triton."""

from .dropout import effective_dropout_p
from .interface import flash_attention, flash_mask
from .tile_schedule import FlashMask

__all__ = ["FlashMask", "effective_dropout_p", "flash_attention", "flash_mask"]
