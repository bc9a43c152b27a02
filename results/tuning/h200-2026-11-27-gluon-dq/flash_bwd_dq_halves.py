"""Not kept unless measured faster: the Gluon dQ pass with each key tile taken as two halves, so that a product
is in flight while each half's dS is computed."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from flashgpt.kernels.flash_bwd_dq_hopper import _producer, _row_stats  # unchanged
from flashgpt.kernels.gluon_common import LOG2E, head_desc, mma_layout


@gluon.jit
def _ds(s, dp, start_n, rows, qk_scale, CAUSAL: gl.constexpr, MASKED: gl.constexpr):
    """dS of one half tile from its S and dP (both retired)."""
    offs_m, lse2, delta, shift, seq_len_k = rows
    p = gl.exp2(s * qk_scale - lse2[:, None])
    if MASKED:
        offs_n = start_n + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))
        seen = offs_n[None, :] <= (offs_m + shift)[:, None] if CAUSAL else (offs_n < seq_len_k)[None, :]
        p = gl.where(seen, p, 0.0)
    return p * (dp - delta[:, None])


@gluon.jit
def _dq_step(
    dq, tile, qdo, ring, rows, n_tiles, qk_scale, CAUSAL: gl.constexpr, MASKED: gl.constexpr, FIRST: gl.constexpr
):
    """One key tile's share of dQ, as two halves of BLOCK_N / 2 keys: the second half's products run while the
    first half's dS is computed, and the first half's dQ product while the second's is."""
    q_smem, do_smem = qdo
    ready, empty, k_ring, v_ring = ring
    STAGES: gl.constexpr = k_ring.shape[0]
    BLOCK_N: gl.constexpr = k_ring.shape[1]
    HALF: gl.constexpr = BLOCK_N // 2
    HEAD_DIM: gl.constexpr = k_ring.shape[2]
    BLOCK_M: gl.constexpr = q_smem.shape[0]
    s_layout: gl.constexpr = mma_layout(gl.num_warps(), HALF)
    acc_layout: gl.constexpr = mma_layout(gl.num_warps(), HEAD_DIM)
    ds_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)

    slot = tile % STAGES
    mbarrier.wait(ready.index(slot), (tile // STAGES) & 1)
    k_a = k_ring.index(slot).slice(0, HALF)
    k_b = k_ring.index(slot).slice(HALF, HALF)
    v_a = v_ring.index(slot).slice(0, HALF)
    v_b = v_ring.index(slot).slice(HALF, HALF)
    zeros = gl.zeros([BLOCK_M, HALF], gl.float32, s_layout)
    s_a = warpgroup_mma(q_smem, k_a.permute((1, 0)), zeros, use_acc=False, is_async=True)
    s_b = warpgroup_mma(q_smem, k_b.permute((1, 0)), zeros, use_acc=False, is_async=True)
    dp_a = warpgroup_mma(do_smem, v_a.permute((1, 0)), zeros, use_acc=False, is_async=True)
    dp_b = warpgroup_mma(do_smem, v_b.permute((1, 0)), zeros, use_acc=False, is_async=True)
    if FIRST:
        s_a = warpgroup_mma_wait(num_outstanding=3, deps=(s_a,))
    else:
        s_a, dq = warpgroup_mma_wait(num_outstanding=3, deps=(s_a, dq))
        mbarrier.arrive(empty.index((tile - 1) % STAGES), count=1)
    start_n = (n_tiles - 1 - tile) * BLOCK_N
    s_b = warpgroup_mma_wait(num_outstanding=2, deps=(s_b,))
    dp_a = warpgroup_mma_wait(num_outstanding=1, deps=(dp_a,))
    ds_a = _ds(s_a, dp_a, start_n, rows, qk_scale, CAUSAL, MASKED)
    dq = warpgroup_mma(gl.convert_layout(ds_a.to(k_a.dtype), ds_layout), k_a, dq, use_acc=not FIRST, is_async=True)
    dp_b = warpgroup_mma_wait(num_outstanding=1, deps=(dp_b,))
    ds_b = _ds(s_b, dp_b, start_n + HALF, rows, qk_scale, CAUSAL, MASKED)
    dq = warpgroup_mma(gl.convert_layout(ds_b.to(k_b.dtype), ds_layout), k_b, dq, use_acc=True, is_async=True)
    return dq


@gluon.jit
def _consumer(
    qdo,
    qdo_ready,
    ring,
    stats,
    n_tiles,
    n_masked,
    outs,
    start_m,
    qk_scale,
    CAUSAL: gl.constexpr,
    HAS_DLSE: gl.constexpr,
):
    """δ and LSE of this query tile's rows, the walk over its key tiles, then dQ (times the softmax scale)."""
    q_smem = qdo[0]
    heads, row_ptrs, shift, seq_len_q, seq_len_k = stats
    dq_ptrs, stride_dqt, softmax_scale = outs
    BLOCK_M: gl.constexpr = q_smem.shape[0]
    HEAD_DIM: gl.constexpr = q_smem.shape[1]
    BLOCK_N: gl.constexpr = ring[2].shape[1]
    s_layout: gl.constexpr = mma_layout(gl.num_warps(), BLOCK_N // 2)  # the layout of a half tile
    acc_layout: gl.constexpr = mma_layout(gl.num_warps(), HEAD_DIM)
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    lse2, delta = _row_stats(heads, row_ptrs, offs_m, seq_len_q, HEAD_DIM, HAS_DLSE)
    rows = (offs_m, lse2, delta, shift, seq_len_k)
    zeros = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(qdo_ready, 0)
    # The first tile is peeled (see the module docstring: C7515). Every query tile sees at least one key tile.
    dq = _dq_step(zeros, 0, qdo, ring, rows, n_tiles, qk_scale, CAUSAL, True, True)
    for tile in range(1, n_masked):
        dq = _dq_step(dq, tile, qdo, ring, rows, n_tiles, qk_scale, CAUSAL, True, False)
    for tile in range(gl.maximum(n_masked, 1), n_tiles):
        dq = _dq_step(dq, tile, qdo, ring, rows, n_tiles, qk_scale, CAUSAL, False, False)
    dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))

    rows_out = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    row_ok = (rows_out < seq_len_q)[:, None]
    out = (dq * softmax_scale).to(q_smem.dtype)
    gl.store(dq_ptrs + rows_out[:, None] * stride_dqt + cols[None, :], out, mask=row_ok)


@gluon.jit
def flash_bwd_dq_hopper_kernel(
    Q,
    K,
    V,
    DO,
    O,  # noqa: E741
    LSE,
    DLSE,
    Delta,
    DQ,
    stride_qb,
    stride_qh,
    stride_qt,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    stride_dob,
    stride_doh,
    stride_dot,
    stride_ob,
    stride_oh,
    stride_ot,
    stride_dqb,
    stride_dqh,
    stride_dqt,
    n_heads,
    seq_len_q,
    seq_len_k,
    softmax_scale,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
):
    """dQ (B, H, Tq, D) and δ (B·H·Tq fp32) of the query tile program_id(0) of head program_id(1), from Q, dO, O
    (B, H, Tq, D), K, V (B, H, Tk, D), the forward's LSE and, if not None, its gradient DLSE (B·H·Tq fp32 each)."""
    dtype: gl.constexpr = Q.dtype.element_ty
    # Causal query tiles near the end see the most key tiles: launch them first.
    n_blocks_m = gl.cdiv(seq_len_q, BLOCK_M)
    pid_m = (n_blocks_m - 1 - gl.program_id(0)) if CAUSAL else gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    start_m = pid_m * BLOCK_M
    q_desc = head_desc(Q, b, h, stride_qb, stride_qh, stride_qt, seq_len_q, HEAD_DIM, BLOCK_M)
    do_desc = head_desc(DO, b, h, stride_dob, stride_doh, stride_dot, seq_len_q, HEAD_DIM, BLOCK_M)
    k_desc = head_desc(K, b, h, stride_kb, stride_kh, stride_kt, seq_len_k, HEAD_DIM, BLOCK_N)
    v_desc = head_desc(V, b, h, stride_vb, stride_vh, stride_vt, seq_len_k, HEAD_DIM, BLOCK_N)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], do_desc.layout)
    ring = (
        gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
        gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
        gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout),
        gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout),
    )
    qdo_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(qdo_ready, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ring[0].index(i), count=1)
        mbarrier.init(ring[1].index(i), count=1)
    fence_async_shared()

    # Key tiles [0, n_tiles) hold keys this tile's rows see; the top n_masked cross the diagonal (shift: Tk − Tq)
    # or the end of the keys, the others are seen whole by every row.
    shift = seq_len_k - seq_len_q
    if CAUSAL:
        n_tiles = gl.cdiv(gl.minimum(start_m + BLOCK_M + shift, seq_len_k), BLOCK_N)
        n_masked = n_tiles - (start_m + shift + 1) // BLOCK_N
    else:
        n_tiles = gl.cdiv(seq_len_k, BLOCK_N)
        n_masked = n_tiles - seq_len_k // BLOCK_N

    mbarrier.expect(qdo_ready, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [start_m, 0], qdo_ready, q_smem)
    tma.async_copy_global_to_shared(do_desc, [start_m, 0], qdo_ready, do_smem)

    row_start = bh.to(gl.int64) * seq_len_q
    heads = (
        O + b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh,
        DO + b.to(gl.int64) * stride_dob + h.to(gl.int64) * stride_doh,
        stride_ot,
        stride_dot,
    )
    HAS_DLSE: gl.constexpr = DLSE is not None
    dlse_row = DLSE + row_start if HAS_DLSE else LSE + row_start  # LSE: a placeholder (a tuple cannot hold None)
    stats = (heads, (LSE + row_start, dlse_row, Delta + row_start), shift, seq_len_q, seq_len_k)
    dq_ptrs = DQ + b.to(gl.int64) * stride_dqb + h.to(gl.int64) * stride_dqh
    outs = (dq_ptrs, stride_dqt, softmax_scale)
    qk_scale = softmax_scale * LOG2E
    gl.warp_specialize(
        [
            (
                _consumer,
                (
                    (q_smem, do_smem),
                    qdo_ready,
                    ring,
                    stats,
                    n_tiles,
                    n_masked,
                    outs,
                    start_m,
                    qk_scale,
                    CAUSAL,
                    HAS_DLSE,
                ),
            ),
            (_producer, ((k_desc, v_desc), ring, n_tiles, BLOCK_N)),
        ],
        [1],
        [24],
    )
