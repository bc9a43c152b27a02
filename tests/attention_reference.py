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
    """‖a − b‖ / ‖b‖, or max |a| where b is exactly zero. With one key (T = 1) the score gradients are exactly 0
    and the kernel's are the rounding of dP − δ = dO·v − dO·o: a few ulps of a sum of D unit-size products per
    row, times scale·|q| per element, ~1e-6 in fp32 for D = 128. The norm of all of them grows with the element
    count (it reached 1.02e-5 over 256 elements), so an exactly-zero reference is compared element by element."""
    a, b = actual.double(), expected.double()
    norm = b.norm().item()
    return (a - b).norm().item() / norm if norm > 0 else a.abs().max().item()


def lse_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |a − b| / (|b| + 1) over the rows. A row's fp32 LSE error is a few ulps of the terms it is summed from
    (Σ|q_i·k_i|·scale, a few units for unit-variance inputs, and log l), not of the LSE itself, which can be ~0
    (T = 1: one score), where ‖a − b‖ / ‖b‖ is unbounded; relative to |b| + 1 it stays ~1e-7."""
    a, b = actual.double(), expected.double()
    return ((a - b).abs() / (b.abs() + 1)).max().item()
