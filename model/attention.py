"""Inner attention: the interface every backend implements (`flashgpt.model.backends`: naive, flash, sdpa, chosen
by name), and the masks they apply.

Every backend maps q (B, H, Tq, D) and k, v (B, H, Tk, D), Tq <= Tk, any strides, to the output (B, H, Tq, D). The
model owns the projections around it; a backend only decides how softmax(q kᵀ · scale + mask) v is computed.
Attention dropout is applied by the backend itself (inside the kernel for flash and sdpa); callers pass
dropout_p=0 in eval mode.

What each query may see is one `AttentionMask`: causal (bottom-right aligned when Tq < Tk: the last query is the
last key), a sliding window, document ids and a block-sparse block mask, combined by AND. `flashgpt.attention_masks`
defines them; naive and sdpa apply them as its dense boolean mask, so every backend computes the same thing and
comparisons between them are like for like. flash hands them to the kernel, which skips the tiles they remove.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from flashgpt.attention_masks import dense_mask
from flashgpt.model.sparsity import (
    BlockSparseConfig,
    block_density,
    check_block_sparse_config,
    resolve_parameters,
)

if TYPE_CHECKING:  # importing the kernels defines them, which must wait for prepare_backend
    from flashgpt.kernels import FlashMask


@dataclass
class AttentionConfig:
    """The `attention:` node of the config tree: configs/attention/<name>.yaml plus overrides."""

    name: str  # naive | flash | sdpa
    # Sliding window: a token sees itself and the window_size - 1 tokens before it (Mistral, Gemma). null: no
    # window; a window of seq_len or more changes nothing (every earlier token of the context is inside it).
    window_size: int | None = None
    # A named block-sparse pattern (model/sparsity.py), e.g. attention.block_sparse.pattern=strided
    # attention.block_sparse.density=0.1; its pattern null (the default): dense.
    block_sparse: BlockSparseConfig = field(default_factory=BlockSparseConfig)
    # Tokens per block of the block-sparse pattern; with a multiple of 16 the kernel keeps or drops whole tiles.
    block_size: int = 128


@dataclass(frozen=True, eq=False)
class AttentionMask:
    """What each query of one call may see; the semantics are those of `flashgpt.attention_masks.dense_mask`."""

    causal: bool = True
    window_size: int | None = None
    document_ids: Tensor | None = None  # (B, Tk) integer: a query sees only keys of its own document
    block_mask: Tensor | None = None  # (H or 1, ceil(Tq / block_size), ceil(Tk / block_size)) bool
    block_size: int = 128
    # The same masks with the flash kernel's tile schedules, built once per forward (FlashAttention.prepare) and
    # shared by every layer; the other backends ignore it.
    kernel_mask: "FlashMask | None" = None

    @property
    def extra_masks(self) -> dict[str, object]:
        """The masks besides causal that are set, by the kernel's argument names (block_size with block_mask)."""
        masks = {"window_size": self.window_size, "document_ids": self.document_ids, "block_mask": self.block_mask}
        masks = {name: value for name, value in masks.items() if value is not None}
        if self.block_mask is not None:
            masks["block_size"] = self.block_size
        return masks

    def dense(self, seq_len_q: int, seq_len_k: int, device: torch.device) -> Tensor | None:
        """The boolean visibility (B or 1, H or 1, Tq, Tk), True = visible; None when every key is visible."""
        if not self.causal and not self.extra_masks:
            return None
        return dense_mask(seq_len_q, seq_len_k, causal=self.causal, **self.extra_masks, device=device)


CAUSAL = AttentionMask()


def check_attention_config(cfg: AttentionConfig) -> None:
    """Reject masks that cannot be built, naming the setting; raises ValueError. (A window of seq_len or more is
    allowed: it is the same as no window, which lets one sweep over seq_len keep one window.)"""
    if cfg.window_size is not None and cfg.window_size < 1:
        raise ValueError(f"attention.window_size={cfg.window_size} must be >= 1 (null: no window)")
    if cfg.block_size < 1:
        raise ValueError(f"attention.block_size={cfg.block_size} must be >= 1")
    check_block_sparse_config(cfg.block_sparse)


def describe_masks(cfg: AttentionConfig, layout: Tensor | None) -> str:
    """The masks in words, for the run log, with the block-sparse pattern's parameters and density as built
    (layout: the model's (1, n, n) block layout, or None): e.g. "causal, block-sparse strided(stride=11,
    local_blocks=2), blocks of 128 tokens, density 0.097"."""
    parts = ["causal"]
    if cfg.window_size is not None:
        parts.append(f"window {cfg.window_size}")
    if layout is not None:
        params = resolve_parameters(cfg.block_sparse, layout.size(-1))
        listed = ", ".join(f"{name}={value}" for name, value in params.items())
        parts.append(
            f"block-sparse {cfg.block_sparse.pattern}({listed}), blocks of {cfg.block_size} tokens, density "
            f"{block_density(layout.cpu()):.3f}"
        )
    return ", ".join(parts)


class InnerAttention(nn.Module):
    """softmax(q kᵀ · scale + mask) v, q (B, H, Tq, D), k and v (B, H, Tk, D), with dropout on the probabilities."""

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, *, mask: AttentionMask, dropout_p: float, scale: float
    ) -> Tensor:
        raise NotImplementedError

    def prepare(
        self,
        mask: AttentionMask,
        *,
        seq_len_q: int,
        seq_len_k: int,
        head_dim: int,
        dtype: torch.dtype,
        dropout_p: float,
    ) -> AttentionMask:
        """`mask` with whatever this backend precomputes from it for calls on queries of seq_len_q rows, head_dim
        and dtype and keys of seq_len_k rows: the model calls it once per forward and hands the result to every
        layer. Nothing, unless a backend overrides it."""
        return mask

    @classmethod
    def prepare_device(cls, device: torch.device) -> bool:
        """Whatever must happen before this backend first runs on `device` (and before the modules it uses are
        imported); True when it will run through an interpreter (slow). Nothing, unless a backend overrides it."""
        return False

    @classmethod
    def check_head_dim(cls, head_dim: int) -> None:
        """Raise ValueError if this backend cannot run heads of `head_dim`. Any, unless a backend overrides it."""
