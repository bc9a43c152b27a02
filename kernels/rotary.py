"""The gradient of rotary position embeddings (model/rotary.py), written into the qkv projection's gradient.

The forward turns each pair (x_i, x_{i⊕}), i⊕ = (i + D/2) mod D, as y_i = x_i c_i + x_{i⊕} s_i, with c the cosines
(repeated) and s the signed sines (−sin in the first half, +sin in the second) of `rotary_tables`. Its transpose:

    dx_i = dy_i c_i + dy_{i⊕} s_{i⊕}

One program takes a tile of BLOCK_T positions of one (batch, head) and writes dq and dk turned back, and dv as it
is, into the three slots of dqkv (B, T, 3, H, D): each gradient is read once and dqkv written once. Arithmetic in
float32, rounded once to dqkv's dtype.
"""

import triton
import triton.language as tl
from torch import Tensor

TILE_ELEMENTS = 4096  # BLOCK_T · BLOCK_D: 32 elements a thread at 4 warps, every load a whole row of D


@triton.jit
def _turned_back(grad, stride_t, rows, cols, partners, in_bounds, cos, sin_partners):
    """dy c + dy⊕ s⊕ of one (BLOCK_T, BLOCK_D) tile of a gradient, in float32; the second load hits the first's
    lines."""
    g = tl.load(grad + rows * stride_t + cols, mask=in_bounds, other=0.0).to(tl.float32)
    g_partner = tl.load(grad + rows * stride_t + partners, mask=in_bounds, other=0.0).to(tl.float32)
    return g * cos + g_partner * sin_partners


@triton.jit
def rotary_qkv_grad_kernel(
    dq, dk, dv, cos, sin, dqkv, seq_len, n_head,
    stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh,
    HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    b = (tl.program_id(1) // n_head).to(tl.int64)  # offsets in int64: B·T·3·H·D may pass 2^31
    h = tl.program_id(1) % n_head
    rows = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]).to(tl.int64)  # (BLOCK_T, 1): positions
    cols = tl.arange(0, BLOCK_D)[None, :]  # (1, BLOCK_D)
    partners = (cols + HEAD_DIM // 2) % HEAD_DIM  # i⊕
    in_bounds = (rows < seq_len) & (cols < HEAD_DIM)
    cos_tile = tl.load(cos + rows * HEAD_DIM + cols, mask=in_bounds, other=0.0)
    sin_partners = tl.load(sin + rows * HEAD_DIM + partners, mask=in_bounds, other=0.0)
    slot = n_head * HEAD_DIM  # dqkv (B, T, 3, H, D), contiguous
    out = dqkv + b * seq_len * 3 * slot + rows * (3 * slot) + h * HEAD_DIM + cols
    dq += b * stride_qb + h * stride_qh
    dk += b * stride_kb + h * stride_kh
    dv += b * stride_vb + h * stride_vh
    turned_q = _turned_back(dq, stride_qt, rows, cols, partners, in_bounds, cos_tile, sin_partners)
    tl.store(out, turned_q.to(dqkv.dtype.element_ty), mask=in_bounds)
    turned_k = _turned_back(dk, stride_kt, rows, cols, partners, in_bounds, cos_tile, sin_partners)
    tl.store(out + slot, turned_k.to(dqkv.dtype.element_ty), mask=in_bounds)
    tl.store(out + 2 * slot, tl.load(dv + rows * stride_vt + cols, mask=in_bounds), mask=in_bounds)


def rotary_qkv_grad(dq: Tensor, dk: Tensor, dv: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """dq, dk, dv (B, T, H, D), each with unit stride along D; cos, sin (T, D) float32 contiguous, the tables the
    forward turned q and k by -> dqkv (B, T, 3, H, D) contiguous, in dv's dtype."""
    batch, seq_len, n_head, head_dim = dv.shape
    dq, dk, dv = (g if g.stride(-1) == 1 else g.contiguous() for g in (dq, dk, dv))
    dqkv = dv.new_empty(batch, seq_len, 3, n_head, head_dim)
    block_d = triton.next_power_of_2(head_dim)
    block_t = max(16, TILE_ELEMENTS // block_d)
    grid = (triton.cdiv(seq_len, block_t), batch * n_head)
    rotary_qkv_grad_kernel[grid](
        dq, dk, dv, cos, sin, dqkv, seq_len, n_head,
        dq.stride(0), dq.stride(1), dq.stride(2), dk.stride(0), dk.stride(1), dk.stride(2),
        dv.stride(0), dv.stride(1), dv.stride(2),
        HEAD_DIM=head_dim, BLOCK_T=block_t, BLOCK_D=block_d, num_warps=4,
    )  # fmt: skip
    return dqkv
