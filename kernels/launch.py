"""Kernel launches: grids, strides and scalars for each pass, given a launch configuration.

`interface.py` calls these with the tuned configurations; `scripts/tune_attention.py` calls them with
candidates. Inputs are assumed valid (checked once in `interface.py`).
"""

import functools
import math
import os
from dataclasses import dataclass

import torch
import triton

from .dropout import keep_scale, keep_threshold
from .flash_bwd import flash_bwd_dkdv_kernel, flash_bwd_dq_kernel, flash_bwd_preprocess_kernel
from .flash_fwd import flash_fwd_kernel
from .tuning import LaunchConfig, launch_config

LOG2E = math.log2(math.e)
PREPROCESS_BLOCK_M = 128


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@dataclass(frozen=True)
class AttentionParams:
    """What every pass needs besides the tensors."""

    causal: bool
    dropout_p: float
    softmax_scale: float
    seed: int = 0
    offset: int = 0

    @property
    def dropout(self) -> bool:
        return self.dropout_p > 0

    def scalars(self) -> tuple:
        """(qk_scale, seed, offset_lo, offset_hi, dropout_threshold, dropout_scale) as the kernels take them.

        An element is kept when its 16-bit random number is >= threshold, i.e. with probability exactly
        1 − threshold/2¹⁶; kept values are scaled by the inverse of that probability (unbiased)."""
        offset_lo, offset_hi = self.offset & 0xFFFFFFFF, self.offset >> 32
        threshold, scale = keep_threshold(self.dropout_p), keep_scale(self.dropout_p)
        return self.softmax_scale * LOG2E, self.seed, offset_lo, offset_hi, threshold, scale


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@functools.cache
def _is_hopper(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] == 9


def tuned_config(kernel_pass: str, q: torch.Tensor, params: AttentionParams) -> LaunchConfig:
    hopper = q.is_cuda and _is_hopper(q.device.index if q.device.index is not None else torch.cuda.current_device())
    cfg = launch_config(
        kernel_pass,
        q.shape[-1],
        dtype_name(q.dtype),
        params.causal,
        params.dropout,
        q.shape[2],
        interpreting=interpreting(),
        hopper=hopper,
    )
    cfg.validate(kernel_pass)
    return cfg


def _flags(q: torch.Tensor, params: AttentionParams, cfg: LaunchConfig) -> dict:
    """Constexprs shared by all passes. The interpreter computes bf16 tl.dot wrongly (triton#11584), so bf16
    tiles are upcast to fp32 there; fp32 inputs get IEEE products (Triton's fp32 default on GPUs is TF32)."""
    return dict(
        HEAD_DIM=q.shape[-1],
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        CAUSAL=params.causal,
        DROPOUT=params.dropout,
        UPCAST=interpreting() and q.dtype == torch.bfloat16,
        INPUT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


def launch_forward(q, k, v, o, lse, params: AttentionParams, cfg: LaunchConfig) -> None:
    """o (B, H, T, D) and lse (B, H, T) fp32 from q, k, v."""
    batch, heads, seq_len, _ = q.shape
    qk_scale, *rng = params.scalars()
    flash_fwd_kernel[(triton.cdiv(seq_len, cfg.block_m), batch * heads)](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        heads, seq_len, qk_scale, *rng, **_flags(q, params, cfg),
    )  # fmt: skip


def launch_preprocess(o, do, delta) -> None:
    """delta (B, H, T) fp32 = rowsum(dO ∘ O)."""
    batch, heads, seq_len, head_dim = o.shape
    flash_bwd_preprocess_kernel[(triton.cdiv(seq_len, PREPROCESS_BLOCK_M), batch * heads)](
        o, do, delta, *o.stride(), *do.stride(), heads, seq_len, HEAD_DIM=head_dim, BLOCK_M=PREPROCESS_BLOCK_M
    )


def launch_dkdv(q, k, v, do, lse, delta, dk, dv, params: AttentionParams, cfg: LaunchConfig) -> None:
    batch, heads, seq_len, _ = q.shape
    flash_bwd_dkdv_kernel[(triton.cdiv(seq_len, cfg.block_n), batch * heads)](
        q, k, v, do, lse, delta, dk, dv,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(),
        heads, seq_len, params.softmax_scale, *params.scalars(), **_flags(q, params, cfg),
    )  # fmt: skip


def launch_dq(q, k, v, do, lse, delta, dq, params: AttentionParams, cfg: LaunchConfig) -> None:
    batch, heads, seq_len, _ = q.shape
    flash_bwd_dq_kernel[(triton.cdiv(seq_len, cfg.block_m), batch * heads)](
        q, k, v, do, lse, delta, dq,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
        heads, seq_len, params.softmax_scale, *params.scalars(), **_flags(q, params, cfg),
    )  # fmt: skip
