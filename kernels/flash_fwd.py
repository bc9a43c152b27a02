"""FlashAttention forward: O = softmax(Q·Kᵀ·scale + mask)·V, tiled, with the T×T matrix never materialised.

Each program owns BLOCK_M query rows of one (batch, head) and streams over key/value tiles of BLOCK_N columns,
keeping an online softmax in registers. In base 2 (log2(e) is folded into the scale, so exp2 is one MUFU op):

    s    = q·kᵀ · scale·log2(e)                  scores of this tile, (BLOCK_M, BLOCK_N)
    m'   = max(m, rowmax(s))                     running row max
    p    = exp2(s − m')                          unnormalised probabilities
    α    = exp2(m − m')                          rescales what was accumulated under the old max
    l'   = α·l + rowsum(p)                       running softmax denominator (before dropout)
    acc' = α·acc + (p ∘ keep)·v                  running numerator

At the end O = acc / l / (1 − p_drop) and LSE = (m + log2 l)·ln 2, the natural log-sum-exp of each row of the
scaled scores, which is all the backward needs to rebuild the probabilities: P = exp(S·scale − LSE).
"""

import triton
import triton.language as tl

from .addressing import head_start
from .dropout import dropout_keep_mask

LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _forward_tiles(
    acc,
    l_i,
    m_i,
    q,
    k_head,
    v_head,
    stride_kt,
    stride_kd,
    stride_vt,
    stride_vd,
    offs_m,
    offs_d,
    lo,
    hi,
    seq_len,
    qk_scale,
    bh,
    seed,
    offset_lo,
    offset_hi,
    dropout_threshold,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    DROPOUT: tl.constexpr,
    UPCAST: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """Online-softmax update over key tiles [lo, hi). MASKED tiles apply the causal and length masks."""
    offs_n = lo + tl.arange(0, BLOCK_N)
    kT_ptrs = k_head + offs_n[None, :] * stride_kt + offs_d[:, None] * stride_kd  # (D, BLOCK_N)
    v_ptrs = v_head + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd  # (BLOCK_N, D)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if MASKED:
            in_bounds = offs_n < seq_len
            kT = tl.load(kT_ptrs, mask=in_bounds[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=in_bounds[:, None], other=0.0)
        else:
            kT = tl.load(kT_ptrs)
            v = tl.load(v_ptrs)
        if UPCAST:
            kT = kT.to(tl.float32)
            v = v.to(tl.float32)

        if DROPOUT:  # independent of the products below, so it can overlap with them
            keep = dropout_keep_mask(
                seed, offset_lo, offset_hi, bh, offs_m, start_n, seq_len, dropout_threshold, BLOCK_M, BLOCK_N
            )
        s = tl.dot(q, kT, input_precision=INPUT_PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N)
        if MASKED:
            visible = in_bounds[None, :]
            if CAUSAL:
                visible = visible & (offs_m[:, None] >= offs_n[None, :])
            s = tl.where(visible, s, float("-inf"))

        # Every row has seen at least one visible column by now, so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:
            p = tl.where(keep, p, 0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
        m_i = m_new

        kT_ptrs += BLOCK_N * stride_kt
        v_ptrs += BLOCK_N * stride_vt
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["seed", "offset_lo", "offset_hi", "dropout_threshold"])
def flash_fwd_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    stride_qb,
    stride_qh,
    stride_qt,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vt,
    stride_vd,
    stride_ob,
    stride_oh,
    stride_ot,
    stride_od,
    n_heads,
    seq_len,
    qk_scale,
    seed,
    offset_lo,
    offset_hi,
    dropout_threshold,
    dropout_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    DROPOUT: tl.constexpr,
    UPCAST: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    # Scalars may arrive as Python floats baked in as fp64 constants (torch.compile does this); the math is fp32.
    qk_scale = tl.cast(qk_scale, tl.float32)
    dropout_scale = tl.cast(dropout_scale, tl.float32)
    # Causal row blocks near the end do the most work: launch them first so the tail of the grid is short.
    n_blocks_m = tl.cdiv(seq_len, BLOCK_M)
    pid_m = (n_blocks_m - 1 - tl.program_id(0)) if CAUSAL else tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads

    q_head = head_start(Q, b, h, stride_qb, stride_qh)
    k_head = head_start(K, b, h, stride_kb, stride_kh)
    v_head = head_start(V, b, h, stride_vb, stride_vh)
    o_head = head_start(O, b, h, stride_ob, stride_oh)

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len

    q = tl.load(q_head + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)

    # Key tiles split into a mask-free bulk and a masked remainder: with causal masking the remainder is the
    # diagonal band [start_m, start_m + BLOCK_M) and tiles above it are skipped; otherwise it is the ragged
    # last tile when T is not a multiple of BLOCK_N.
    if CAUSAL:
        unmasked_hi = start_m
        masked_hi = tl.minimum(start_m + BLOCK_M, seq_len)
    else:
        unmasked_hi = (seq_len // BLOCK_N) * BLOCK_N
        masked_hi = seq_len
    acc, l_i, m_i = _forward_tiles(
        acc, l_i, m_i, q, k_head, v_head, stride_kt, stride_kd, stride_vt, stride_vd, offs_m, offs_d,
        0, unmasked_hi, seq_len, qk_scale, bh, seed, offset_lo, offset_hi, dropout_threshold,
        BLOCK_M, BLOCK_N, False, CAUSAL, DROPOUT, UPCAST, INPUT_PRECISION,
    )  # fmt: skip
    acc, l_i, m_i = _forward_tiles(
        acc, l_i, m_i, q, k_head, v_head, stride_kt, stride_kd, stride_vt, stride_vd, offs_m, offs_d,
        unmasked_hi, masked_hi, seq_len, qk_scale, bh, seed, offset_lo, offset_hi, dropout_threshold,
        BLOCK_M, BLOCK_N, True, CAUSAL, DROPOUT, UPCAST, INPUT_PRECISION,
    )  # fmt: skip

    o = acc * (dropout_scale / l_i)[:, None]
    tl.store(
        o_head + offs_m[:, None] * stride_ot + offs_d[None, :] * stride_od,
        o.to(O.dtype.element_ty),
        mask=row_ok[:, None],
    )
    lse = (m_i + tl.log2(l_i)) * LN2
    tl.store(LSE + bh.to(tl.int64) * seq_len + offs_m, lse, mask=row_ok)
