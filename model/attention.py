"""Inner attention: one interface, three interchangeable backends, chosen by name.

Every backend maps q, k, v of shape (B, H, T, D) (any strides) to the output (B, H, T, D). The model owns the
projections around it; a backend only decides how softmax(q kᵀ · scale) v is computed. Attention dropout is
applied by the backend itself (inside the kernel for flash and sdpa); callers pass dropout_p=0 in eval mode.
"""

import os
import sys

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class InnerAttention(nn.Module):
    """softmax(q kᵀ · scale) v over (B, H, T, D) tensors, optionally causal, with dropout on the probabilities."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, dropout_p: float, scale: float) -> Tensor:
        raise NotImplementedError


class NaiveAttention(InnerAttention):
    """The textbook reference: materialises the (T, T) score matrix, so memory grows as T²."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, dropout_p: float, scale: float) -> Tensor:
        T = q.size(-2)
        scores = (q @ k.transpose(-2, -1)).float() * scale  # (B, H, T, T), fp32 even under bf16 autocast
        if causal:
            future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
            scores = scores.masked_fill(future, float("-inf"))
        probs = F.dropout(scores.softmax(dim=-1), p=dropout_p).to(v.dtype)
        return probs @ v  # (B, H, T, D)


class FlashAttention(InnerAttention):
    """The project's fused Triton kernel (kernels/): tiled online softmax, O(T) memory, dropout in-kernel."""

    def __init__(self) -> None:
        super().__init__()
        # Imported here rather than at the top so that prepare_backend can switch the Triton interpreter on
        # (for CPU runs) before the kernels are defined.
        from flashgpt.kernels import flash_attention

        self.flash_attention = flash_attention

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, dropout_p: float, scale: float) -> Tensor:
        return self.flash_attention(q, k, v, causal=causal, dropout_p=dropout_p, softmax_scale=scale)


class SdpaAttention(InnerAttention):
    """PyTorch's F.scaled_dot_product_attention, which dispatches to its own fused kernels (cuDNN, FA2, ...)."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, dropout_p: float, scale: float) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal, scale=scale)


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
