"""The float64 attention reference every kernel test compares with, and the error measure they share."""

import math

import torch

from flashgpt.attention_masks import dense_mask
from flashgpt.kernels.dropout import keep_scale


def reference_attention(q, k, v, visible=None, *, causal: bool = False, scale: float | None = None,
                        keep: torch.Tensor | None = None, dropout_p: float = 0.0):  # fmt: skip
    """softmax(q·kᵀ·scale over visible keys)·v in float64, with `keep` as a given dropout mask. Returns (o, lse).

    `visible` is a boolean mask broadcastable to (B, H, Tq, Tk) (`dense_mask`); without it, `causal` builds one.
    Rows with no visible key give o = 0 and lse = −inf."""
    q, k, v = (t.double() for t in (q, k, v))
    if visible is None:
        visible = dense_mask(q.shape[2], k.shape[2], causal=causal)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    # exp(s − lse) with lse = 0 on empty rows: exp(−inf) = 0, so no NaN reaches the gradients.
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    if keep is not None:
        p = p * keep * keep_scale(dropout_p)
    return p @ v, lse


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖, or ‖a‖ where b is exactly zero (T = 1 has zero score gradients)."""
    diff = (actual.double() - expected.double()).norm().item()
    norm = expected.double().norm().item()
    return diff / norm if norm > 0 else diff


def lse_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |a − b| / (|b| + 1) over the rows. A row's fp32 LSE error is a few ulps of the terms it is summed from
    (Σ|q_i·k_i|·scale, a few units for unit-variance inputs, and log l), not of the LSE itself, which can be ~0
    (T = 1: one score), where ‖a − b‖ / ‖b‖ is unbounded; relative to |b| + 1 it stays ~1e-7."""
    a, b = actual.double(), expected.double()
    return ((a - b).abs() / (b.abs() + 1)).max().item()
