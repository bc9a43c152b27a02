"""Linear + cross-entropy over the vocabulary in chunks of tokens, so the (N, V) logits never exist at once.

For N = B·T tokens with final hidden states x (N, C), the tied output matrix W (V, C) and targets t (N,):

    loss_i = logsumexp_v(x_i · W_v) - x_i · W_{t_i}
    d loss_i / d logits_i = softmax(logits_i) - onehot(t_i)              (N, V): the only large tensor

`linear_cross_entropy` takes the mean over tokens. Rows go through in chunks of `chunk_tokens`: each chunk's
logits are computed by one matmul (bf16 under autocast, as lm_head would), upcast to fp32 for the log-sum-exp, and
turned straight into that chunk's share of dx = dlogits · W and dW = dlogitsᵀ · x, before the next chunk starts.
The backward pass is then only a multiplication by the incoming scalar gradient: no matmul is recomputed, and
what autograd keeps is dx (N, C) and dW (V, C), not (N, V) logits. In fp32 the result equals
F.cross_entropy(x @ Wᵀ, t) to rounding (tests/test_step.py).

`per_token_cross_entropy` keeps one loss per token (evaluation's loss by position); its backward, rarely needed,
recomputes each chunk's logits through activation checkpointing.
"""

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

# 4096 rows x 50,304 logits: 0.4 GB in bf16 per chunk. Large enough that the matmuls run at full speed, small
# enough that the chunk's temporaries stay far below the model's activations at GPT-2's 32K tokens per step.
CHUNK_TOKENS = 4096


def _compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype autocast would run the output matmul in (bf16 under CUDA autocast), else x's own."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def _at_least_fp32(t: Tensor) -> Tensor:
    """bf16/fp16 logits upcast for the softmax; fp32 and fp64 stay as they are."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of softmax(x Wᵀ) against t, with both gradients computed chunk by chunk in forward."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, targets: Tensor, chunk_tokens: int, needs_grad: bool) -> Tensor:
        dtype = _compute_dtype(x)
        w = weight.to(dtype)  # (V, C), cast once rather than once per chunk
        n_tokens = x.size(0)
        accumulate = torch.promote_types(dtype, torch.float32)
        loss_sum = torch.zeros((), dtype=accumulate, device=x.device)
        dx_chunks = []
        dw = torch.zeros(weight.shape, dtype=accumulate, device=x.device) if needs_grad else None
        vocab_ids = torch.arange(weight.size(0), device=x.device)  # (V,)
        for start in range(0, n_tokens, chunk_tokens):
            x_chunk = x[start : start + chunk_tokens].to(dtype)  # (n, C)
            t_chunk = targets[start : start + chunk_tokens, None]  # (n, 1)
            logits = _at_least_fp32(x_chunk @ w.t())  # (n, V), fp32 under autocast
            lse = torch.logsumexp(logits, dim=1, keepdim=True)  # (n, 1)
            loss_sum = loss_sum + (lse - logits.gather(1, t_chunk)).sum()
            if needs_grad:
                # d mean_loss / d logits = (softmax - onehot) / N, rounded to the matmul dtype only at the end.
                # One elementwise expression (the one-hot as a comparison, not a scatter), so that the compiler
                # fuses it into a single pass over the chunk's logits.
                onehot = vocab_ids == t_chunk  # (n, V) bool
                dlogits = (((logits - lse).exp() - onehot.to(logits.dtype)) / n_tokens).to(dtype)  # (n, V)
                dx_chunks.append(dlogits @ w)  # (n, C)
                dw = dw + dlogits.t() @ x_chunk  # (V, C), summed over chunks in (at least) fp32
        if needs_grad:
            ctx.save_for_backward(torch.cat(dx_chunks).to(x.dtype), dw.to(weight.dtype))
        return loss_sum / n_tokens

    @staticmethod
    def backward(ctx, grad_loss: Tensor) -> tuple[Tensor, Tensor, None, None, None]:
        dx, dw = ctx.saved_tensors
        return dx * grad_loss, dw * grad_loss, None, None, None


def linear_cross_entropy(x: Tensor, weight: Tensor, targets: Tensor, chunk_tokens: int = CHUNK_TOKENS) -> Tensor:
    """mean_i cross_entropy(x_i Wᵀ, t_i) for x (N, C), weight (V, C), targets (N,) int64 -> a scalar fp32 loss."""
    _check(x, weight, targets, chunk_tokens)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    return _LinearCrossEntropy.apply(x, weight, targets, chunk_tokens, needs_grad)


def _chunk_losses(x_chunk: Tensor, weight: Tensor, t_chunk: Tensor) -> Tensor:
    return F.cross_entropy(_at_least_fp32(F.linear(x_chunk, weight)), t_chunk, reduction="none")


def per_token_cross_entropy(x: Tensor, weight: Tensor, targets: Tensor, chunk_tokens: int = CHUNK_TOKENS) -> Tensor:
    """cross_entropy(x_i Wᵀ, t_i) for every i: (N,) fp32, computed chunk by chunk."""
    _check(x, weight, targets, chunk_tokens)
    chunks = zip(x.split(chunk_tokens), targets.split(chunk_tokens), strict=True)
    return torch.cat([checkpoint(_chunk_losses, xc, weight, tc, use_reentrant=False) for xc, tc in chunks])


def _check(x: Tensor, weight: Tensor, targets: Tensor, chunk_tokens: int) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.size(1) != weight.size(1):
        raise ValueError(f"x must be (N, C) and weight (V, C); got {tuple(x.shape)} and {tuple(weight.shape)}")
    if targets.shape != x.shape[:1] or targets.dtype != torch.int64:
        raise ValueError(f"targets must be int64 of shape ({x.size(0)},); got {targets.dtype} {tuple(targets.shape)}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens} must be positive")
