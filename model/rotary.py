"""Rotary position embeddings (RoPE, Su et al. 2021) for model.position_embedding=rope: the tables, the rotation,
and q, k, v taken from the qkv projection with q and k turned.

Shapes: B batch, T positions, H heads, D head dim.
"""

import torch
from torch import Tensor


def rotary_tables(n_positions: int, head_dim: int, base: float) -> tuple[Tensor, Tensor]:
    """The cos and signed sin tables of `apply_rotary`, 2 x (n_positions, head_dim) float32: position p turns the
    pair of dims (i, i + D/2) by p · base^(-2i / D). cos repeats the D/2 angles' cosines; sin holds −sin in its
    first half and +sin in its second. Computed in float64, so that even at 64K positions every value is exact to
    float32 rounding (a float32 product p · θ would be off by up to p · 2^-24 radians)."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (D/2,)
    angles = torch.outer(torch.arange(n_positions, dtype=torch.float64), inv_freq)  # (T, D/2)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([cos, cos], dim=-1).float(), torch.cat([-sin, sin], dim=-1).float()  # 2 x (T, D)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (..., D) with each pair (x_i, x_{i+D/2}) turned by its angle: x_i cos − x_{i+D/2} sin and
    x_{i+D/2} cos + x_i sin, with cos and sin from `rotary_tables` (broadcastable to x). This half-split pairing
    (GPT-NeoX, Llama) rotates contiguous halves; RoFormer's adjacent pairs are the same up to a fixed permutation of
    the head dims, which q and k's projection absorbs. Written as x · cos + roll(x, D/2) · sin, with no split and
    concatenation: one elementwise expression, which torch.compile fuses into one kernel. Computed in float32 at least;
    bf16 activations are rounded once, at the end."""
    wide = x.to(torch.promote_types(x.dtype, cos.dtype))
    return (wide * cos + wide.roll(x.size(-1) // 2, dims=-1) * sin).to(x.dtype)


def _turn_back(grad: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The gradient of `apply_rotary` with respect to x, in autograd's own operations and order (so the same bits):
    dx = dy · cos + roll(dy · sin, −D/2), float32 at least, rounded to dy's dtype."""
    wide = grad.to(torch.promote_types(grad.dtype, cos.dtype))
    return (wide * cos + (wide * sin).roll(-(grad.size(-1) // 2), dims=-1)).to(grad.dtype)


@torch.library.custom_op("flashgpt::rotary_qkv_grad", mutates_args=())
def rotary_qkv_grad(dq: Tensor, dk: Tensor, dv: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """dq, dk, dv (B, T, H, D), the gradients of `rotary_qkv`'s outputs; cos, sin (T, D) -> the qkv projection's
    gradient (B, T, 3, H, D). On CUDA one Triton kernel (kernels/rotary.py); elsewhere these tensor operations."""
    cos, sin = cos[:, None, :], sin[:, None, :]  # (T, 1, D): every head alike
    return torch.stack([_turn_back(dq, cos, sin), _turn_back(dk, cos, sin), dv], dim=2)


@rotary_qkv_grad.register_kernel("cuda")
def _(dq: Tensor, dk: Tensor, dv: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    from flashgpt.kernels.rotary import rotary_qkv_grad as fused  # imported on first use: CPU runs never need it

    return fused(dq, dk, dv, cos.float().contiguous(), sin.float().contiguous())


@rotary_qkv_grad.register_fake
def _(dq: Tensor, dk: Tensor, dv: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    batch, seq_len, n_head, head_dim = dv.shape
    return dv.new_empty(batch, seq_len, 3, n_head, head_dim)


class _RotaryQKV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        ctx.save_for_backward(cos, sin)
        cos_h, sin_h = cos[:, None, :], sin[:, None, :]  # (T, 1, D): every head alike
        return apply_rotary(qkv[:, :, 0], cos_h, sin_h), apply_rotary(qkv[:, :, 1], cos_h, sin_h), qkv[:, :, 2]

    @staticmethod
    def backward(ctx, dq: Tensor, dk: Tensor, dv: Tensor) -> tuple[Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        return rotary_qkv_grad(dq, dk, dv, cos, sin), None, None


def rotary_qkv(qkv: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """qkv (B, T, 3, H, D), the attention's projection; cos, sin (T, D) of its positions (`rotary_tables`) -> q and
    k turned (B, T, H, D), new tensors, and v, a view of qkv.

    The same values as `apply_rotary` on qkv[:, :, 0] and qkv[:, :, 1], with a backward of its own: autograd would
    assemble qkv's gradient as a sum of three select_backward terms, which inductor compiles into one kernel that
    loads dq, dk, dv (and the rolled dq, dk) for every element it writes. `rotary_qkv_grad` reads each gradient
    once: for GPT-2 124M at 1K, 0.94 ms a step against inductor's 1.93, and rope's cost to the compiled step fell from
    2.6% to 1.1% (H200, results/tuning/h200-2026-11-28-rope-cost/)."""
    return _RotaryQKV.apply(qkv, cos, sin)
