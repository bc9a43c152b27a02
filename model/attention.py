"""Inner attention: one interface, three interchangeable backends, chosen by name, and the masks they apply.

Every backend maps q (B, H, Tq, D) and k, v (B, H, Tk, D), Tq <= Tk, any strides, to the output (B, H, Tq, D). The
model owns the projections around it; a backend only decides how softmax(q kᵀ · scale + mask) v is computed.
Attention dropout is applied by the backend itself (inside the kernel for flash and sdpa); callers pass
dropout_p=0 in eval mode.

What each query may see is one `AttentionMask`: causal (bottom-right aligned when Tq < Tk: the last query is the
last key), a sliding window, document ids and a block-sparse block mask, combined by AND. `flashgpt.attention_masks`
defines them; naive and sdpa apply them as its dense boolean mask, so every backend computes the same thing and
comparisons between them are like for like. flash hands them to the kernel, which skips the tiles they remove.
"""

import os
import sys
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
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


class FlashAttention(InnerAttention):
    """The project's fused Triton kernel (kernels/): tiled online softmax, O(T) memory, dropout in-kernel; the
    masks skip the tiles they remove."""

    def __init__(self) -> None:
        super().__init__()
        # Imported here rather than at the top so that prepare_backend can switch the Triton interpreter on
        # (for CPU runs) before the kernels are defined.
        from flashgpt.kernels import flash_attention, flash_mask

        self.flash_attention, self.flash_mask = flash_attention, flash_mask

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, *, mask: AttentionMask, dropout_p: float, scale: float
    ) -> Tensor:
        masks = mask.extra_masks if mask.kernel_mask is None else {"mask": mask.kernel_mask}
        return self.flash_attention(q, k, v, causal=mask.causal, dropout_p=dropout_p, softmax_scale=scale, **masks)

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
        """The tile schedules of document ids and block masks (causal and windows need none), built once for every
        layer's forward and backward instead of twice in each layer."""
        if mask.document_ids is None and mask.block_mask is None:
            return mask
        kernel_mask = self.flash_mask(
            seq_len_q, seq_len_k, head_dim=head_dim, dtype=dtype, causal=mask.causal, dropout_p=dropout_p,
            backward=torch.is_grad_enabled(), **mask.extra_masks,
        )  # fmt: skip
        return replace(mask, kernel_mask=kernel_mask)


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


ATTENTION_BACKENDS: dict[str, type[InnerAttention]] = {
    "naive": NaiveAttention,
    "flash": FlashAttention,
    "sdpa": SdpaAttention,
}


def build_attention(name: str) -> InnerAttention:
    """A fresh backend by its config name (attention.name)."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of: {', '.join(ATTENTION_BACKENDS)}")
    return ATTENTION_BACKENDS[name]()


def prepare_backend(name: str, device: torch.device) -> bool:
    """Make `name` runnable on `device`; returns True when flash will run through the (slow) Triton interpreter.

    Triton reads TRITON_INTERPRET when a kernel is defined, i.e. when `flashgpt.kernels` is imported, so the
    variable has to be set before that first import, which FlashAttention makes when it is built.
    """
    if name != "flash" or device.type == "cuda":
        return False
    if "flashgpt.kernels" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("`flashgpt.kernels` was imported before TRITON_INTERPRET=1 was set; flash cannot run on CPU")
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def check_head_dim(name: str, head_dim: int) -> None:
    """Raise ValueError at start-up if backend `name` cannot run heads of `head_dim` (model.d_model / model.n_head),
    rather than at the first training step. For flash this imports the kernel: call it after prepare_backend."""
    if name != "flash":
        return
    from flashgpt.kernels.attention_op import HEAD_DIM_MULTIPLE, MAX_HEAD_DIM, NATIVE_HEAD_DIMS

    if head_dim % HEAD_DIM_MULTIPLE or not NATIVE_HEAD_DIMS[0] <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"attention=flash runs head dims (model.d_model / model.n_head) that are multiples of {HEAD_DIM_MULTIPLE} "
            f"from {NATIVE_HEAD_DIMS[0]} to {MAX_HEAD_DIM}; this model's is {head_dim}. Change model.n_head or "
            "model.d_model, or use attention=sdpa"
        )
