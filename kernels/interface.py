"""`flash_attention`: argument checks and the autograd wiring around the kernel launches."""

import math

import torch

from .launch import (
    AttentionParams,
    interpreting,
    launch_dkdv,
    launch_dq,
    launch_forward,
    launch_preprocess,
    tuned_config,
)

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Dropout counters are 32-bit: row · ⌈T/8⌉ + col/8 must stay below 2³².
MAX_DROPOUT_SEQ_LEN = 131_072


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flash_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"flash_attention: {name} must have shape (B, H, T, D), got {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"flash_attention: {name} has dtype {t.dtype}; supported: float16, bfloat16 (GPU) and float32"
            )
    if not (q.shape == k.shape == v.shape):
        raise ValueError(
            f"flash_attention: q, k, v must have the same shape, got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"flash_attention: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"flash_attention: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.device.type == "cpu" and not interpreting():
        raise ValueError(
            "flash_attention: q is a CPU tensor; the kernel needs CUDA tensors, or TRITON_INTERPRET=1 set before "
            "`flashgpt.kernels` is first imported to run through the Triton interpreter"
        )
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"flash_attention: unsupported device {q.device}; use CUDA (or CPU when interpreting)")
    batch, heads, seq_len, head_dim = q.shape
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"flash_attention: head dim {head_dim} is not supported; supported: {SUPPORTED_HEAD_DIMS}")
    if seq_len < 1 or batch < 1 or heads < 1:
        raise ValueError(f"flash_attention: empty input of shape {tuple(q.shape)}")
    if not (isinstance(dropout_p, (int, float)) and 0.0 <= dropout_p < 1.0):
        raise ValueError(f"flash_attention: dropout_p must be in [0, 1), got {dropout_p!r}")
    if dropout_p > 0 and seq_len > MAX_DROPOUT_SEQ_LEN:
        raise ValueError(
            f"flash_attention: dropout supports sequences up to {MAX_DROPOUT_SEQ_LEN} tokens, got {seq_len}"
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        # Offsets inside one (batch, head) are 32-bit in the kernels; batch and head offsets are 64-bit.
        if (seq_len - 1) * t.stride(2) + (head_dim - 1) * t.stride(3) >= 2**31:
            raise ValueError(f"flash_attention: {name} spans more than 2³¹ elements within one head")


def _rng_seed_and_offset(device: torch.device) -> tuple[int, int]:
    """Key and counter offset for this call's dropout mask, drawn from PyTorch's default generator.

    On CUDA we take the generator's Philox seed and advance its offset by 4 (its granularity), as PyTorch's own
    dropout does, without a device sync; on the CPU we draw both from the CPU generator. Either way
    `torch.manual_seed` and the generator's saved state make the mask reproducible.
    """
    if device.type == "cuda":
        gen = torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
        offset = gen.get_offset()
        gen.set_offset(offset + 4)
        return gen.initial_seed(), offset
    seed, offset = torch.randint(0, 2**62, (2,), dtype=torch.int64).tolist()
    return seed, offset


class FlashAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal: bool, dropout_p: float, softmax_scale: float):
        seed, offset = _rng_seed_and_offset(q.device) if dropout_p > 0 else (0, 0)
        params = AttentionParams(causal, dropout_p, softmax_scale, seed, offset)
        batch, heads, seq_len, _ = q.shape
        o = torch.empty_like(q)
        lse = torch.empty((batch, heads, seq_len), device=q.device, dtype=torch.float32)
        launch_forward(q, k, v, o, lse, params, tuned_config("fwd", q, params))
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.params = params
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        params = ctx.params
        delta = torch.empty_like(lse)
        launch_preprocess(o, do, delta)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, tuned_config("bwd_dkdv", q, params))
        launch_dq(q, k, v, do, lse, delta, dq, params, tuned_config("bwd_dq", q, params))
        return dq, dk, dv, None, None, None


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Exact attention softmax(q·kᵀ·scale + causal mask)·v with dropout on the probabilities, fused in Triton.

    q, k, v: (B, H, T, D) with any strides; float16/bfloat16 on CUDA, float32 anywhere (CPU tensors need
    TRITON_INTERPRET=1). Returns o (B, H, T, D), and with `return_lse` also the float32 log-sum-exp (B, H, T)
    of each row of the scaled, masked scores. Differentiable in q, k and v; dropout draws its seed from PyTorch's
    default generator, so `torch.manual_seed` makes it reproducible.
    """
    _check_inputs(q, k, v, dropout_p)
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    o, lse = FlashAttentionFunction.apply(q, k, v, bool(causal), float(dropout_p), scale)
    return (o, lse) if return_lse else o
