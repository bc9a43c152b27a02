"""Exact attention to check the kernels against, shared by the tests and the benchmarks' GPU checks.

- `reference_attention`: softmax(q·kᵀ·scale over the visible keys)·v, dense, in float64 (the CPU tests) or float32
  (the GPU checks at a thousand tokens and more), with an optional dropout keep-mask;
- `rel_err` and `lse_err`: the error measures the tolerances are set in;
- `recover_keep_mask`: the dropout mask a kernel drew, read back through the kernel itself;
- `reference_rotary_grad`: rotary positions' gradient (`flashgpt::rotary_qkv_grad`'s dq, dk slots) in float64.
"""

import math
from collections.abc import Callable

import torch

from flashgpt.attention_masks import dense_mask


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor | None = None,
    *,
    causal: bool = False,
    scale: float | None = None,
    keep: torch.Tensor | None = None,
    keep_scale: float = 1.0,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse) of q (..., Tq, D) against k, v (..., Tk, D) in `dtype`, queries aligned to the last keys.

    `visible` is a boolean mask broadcastable to (..., Tq, Tk) (`dense_mask`); without it, `causal` builds one. With
    it, the causal rule must be in it: `causal=True` beside `visible` is refused rather than silently ignored.
    `keep` is a dropout keep-mask of the same shape, and kept probabilities are multiplied by keep_scale (the
    kernel's 1 / (1 − p), `kernels.dropout.keep_scale`). Rows with no visible key give o = 0 and lse = −inf."""
    if visible is not None and causal:
        raise ValueError(
            "reference_attention: pass the causal rule inside `visible` (dense_mask(..., causal=True)) or causal=True "
            "without `visible`, not both"
        )
    q, k, v = (t.to(dtype) for t in (q, k, v))
    if visible is None:
        visible = dense_mask(q.shape[-2], k.shape[-2], causal=causal, device=q.device)[0, 0]  # (Tq, Tk)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    # exp(s − lse) with lse = 0 on empty rows: exp(−inf) = 0, so no NaN reaches the gradients.
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    if keep is not None:
        p = p * keep * keep_scale
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


def recover_keep_mask(
    attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    shape: tuple[int, int, int, int],
    seq_len_k: int,
    seed: int,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The (B, H, Tq, Tk) keep-mask a dropout kernel draws for `seed` (True = kept), read back through the kernel:
    with q = k = 0 every visible probability is equal and nonzero, and a one-hot v reads D key columns of the
    dropped probability matrix per call. `attend(q, k, v)` runs the kernel, with its masks and dropout rate, on q of
    `shape` = (B, H, Tq, D) and k, v of Tk rows; torch's generator, from which it draws its dropout seed, is seeded
    before each call. Valid because the mask depends on the seed and the positions only, not on the inputs; masked
    pairs read as not kept."""
    batch, heads, seq_len_q, head_dim = shape
    q = torch.zeros(shape, device=device, dtype=dtype)
    k = torch.zeros(batch, heads, seq_len_k, head_dim, device=device, dtype=dtype)
    keep = torch.zeros(batch, heads, seq_len_q, seq_len_k, dtype=torch.bool, device=device)
    for start in range(0, seq_len_k, head_dim):
        width = min(head_dim, seq_len_k - start)
        v = torch.zeros_like(k)
        v[:, :, start : start + width, :width] = torch.eye(width, device=device, dtype=dtype)
        torch.manual_seed(seed)
        o = attend(q, k, v)
        keep[..., start : start + width] = o[..., :width] != 0
    return keep


def reference_rotary_grad(
    grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """dx = dy·cos + roll(dy·sin, −D/2), the gradient of `model/rotary.py`'s rotation, in float64, for grad
    (B, T, H, D) and the tables cos, sin (T, D); and beside it |dy·cos| + |roll(dy·sin, −D/2)|, the magnitude a float32
    computation's rounding error scales with (two products and their sum: within 2^-23 of it)."""
    g = grad.double()
    cos, sin = cos.double()[:, None, :], sin.double()[:, None, :]  # (T, 1, D): every head alike
    turned = (g * sin).roll(-(grad.size(-1) // 2), dims=-1)  # dy_(i+D/2) s_(i+D/2)
    return g * cos + turned, (g * cos).abs() + turned.abs()
