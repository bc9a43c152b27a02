"""Experiment: the 5-product backward in Gluon. The warp-specialised dK/dV pass, which also computes each tile's
dQ share dS·K (dSᵀ through shared memory) and adds it to an fp32 accumulator by a TMA bulk reduce-add."""

from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from flashgpt.kernels.flash_bwd_dkdv_hopper import _producer  # unchanged
from flashgpt.kernels.gluon_common import LOG2E, head_desc, mma_layout


@builtin
def _async_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Bulk tensor reduce-add of shared memory `src` into the tile of `tensor_desc` at `coord` (TMA; Hopper's
    cp.reduce.async.bulk.tensor). Triton 3.6 has the op but Gluon does not export it; like a TMA store, wait with
    `tma.store_wait` before `src` is written again."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _fused_step(dk, dv, tile, kv, ring, dq_out, lo, offs_n, shift, qk_scale, MASKED: gl.constexpr, FIRST: gl.constexpr):
    """One query tile's share of (dK, dV), with dK's product still in flight when it returns, and its dQ rows
    += dS·K sent to the fp32 accumulator by a TMA reduce-add."""
    k_smem, v_smem = kv
    ready, empty, q_ring, do_ring, lse_ring, delta_ring = ring
    ds_smem, dq_smem, dq_desc = dq_out
    STAGES: gl.constexpr = q_ring.shape[0]
    BLOCK_M: gl.constexpr = q_ring.shape[1]
    HEAD_DIM: gl.constexpr = q_ring.shape[2]
    BLOCK_N: gl.constexpr = k_smem.shape[0]
    s_layout: gl.constexpr = mma_layout(gl.num_warps(), BLOCK_M)
    acc_layout: gl.constexpr = mma_layout(gl.num_warps(), HEAD_DIM)
    row_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    dq_layout: gl.constexpr = mma_layout(gl.num_warps(), HEAD_DIM)

    slot = tile % STAGES
    mbarrier.wait(ready.index(slot), (tile // STAGES) & 1)
    q_tile = q_ring.index(slot)
    do_tile = do_ring.index(slot)
    zeros = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    sT = warpgroup_mma(k_smem, q_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
    dpT = warpgroup_mma(v_smem, do_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
    lse2 = lse_ring.index(slot).load(row_layout)
    delta = delta_ring.index(slot).load(row_layout)
    if FIRST:
        sT = warpgroup_mma_wait(num_outstanding=1, deps=(sT,))
    else:
        # Retires the previous tile's dK product with Sᵀ: its buffer goes back to the producer.
        sT, dk = warpgroup_mma_wait(num_outstanding=1, deps=(sT, dk))
        mbarrier.arrive(empty.index((tile - 1) % STAGES), count=1)

    pT = gl.exp2(sT * qk_scale - lse2[None, :])
    if MASKED:
        offs_m = lo + tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_layout)
        pT = gl.where((offs_m + shift)[None, :] >= offs_n[:, None], pT, 0.0)
    dv = warpgroup_mma(gl.convert_layout(pT.to(k_smem.dtype), p_layout), do_tile, dv, use_acc=not FIRST, is_async=True)
    dpT = warpgroup_mma_wait(num_outstanding=1, deps=(dpT,))
    dsT = (pT * (dpT - delta[None, :])).to(k_smem.dtype)
    ds_smem.store(dsT)
    fence_async_shared()
    dq_zeros = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
    dq = warpgroup_mma(ds_smem.permute((1, 0)), k_smem, dq_zeros, use_acc=False, is_async=True)
    dk = warpgroup_mma(gl.convert_layout(dsT, p_layout), q_tile, dk, use_acc=not FIRST, is_async=True)
    # Retires dV and dQ; dK runs on while dQ goes out.
    dq, dv = warpgroup_mma_wait(num_outstanding=1, deps=(dq, dv))
    DQ_BUFFERS: gl.constexpr = dq_smem.shape[0]
    tma.store_wait(DQ_BUFFERS - 1)  # the reduce-add that last read this buffer is done
    buffer = dq_smem.index(tile % DQ_BUFFERS)
    buffer.store(dq)
    fence_async_shared()
    _async_reduce_add(dq_desc, [lo + tile * BLOCK_M, 0], buffer)
    return dk, dv


@gluon.jit
def _consumer(kv, kv_ready, ring, dq_out, lo, n_tiles, n_masked, outs, start_n, shift, qk_scale, CAUSAL: gl.constexpr):
    """Walk the query tiles, then write this key tile's dK (times the softmax scale) and dV."""
    k_smem = kv[0]
    dk_ptrs, dv_ptrs, stride_dkt, stride_dvt, seq_len_k, softmax_scale = outs
    HEAD_DIM: gl.constexpr = k_smem.shape[1]
    BLOCK_N: gl.constexpr = k_smem.shape[0]
    s_layout: gl.constexpr = mma_layout(gl.num_warps(), ring[2].shape[1])
    acc_layout: gl.constexpr = mma_layout(gl.num_warps(), HEAD_DIM)
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    zeros = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(kv_ready, 0)
    # The first tile is peeled (see the module docstring: C7515). Every key tile meets at least one query tile.
    dk, dv = _fused_step(zeros, zeros, 0, kv, ring, dq_out, lo, offs_n, shift, qk_scale, CAUSAL, True)
    for tile in range(1, n_masked):
        dk, dv = _fused_step(dk, dv, tile, kv, ring, dq_out, lo, offs_n, shift, qk_scale, True, False)
    for tile in range(gl.maximum(n_masked, 1), n_tiles):
        dk, dv = _fused_step(dk, dv, tile, kv, ring, dq_out, lo, offs_n, shift, qk_scale, False, False)
    dk, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv))
    tma.store_wait(0)

    rows = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    row_ok = (rows < seq_len_k)[:, None]
    dtype: gl.constexpr = k_smem.dtype
    gl.store(dk_ptrs + rows[:, None] * stride_dkt + cols[None, :], (dk * softmax_scale).to(dtype), mask=row_ok)
    gl.store(dv_ptrs + rows[:, None] * stride_dvt + cols[None, :], dv.to(dtype), mask=row_ok)


@gluon.jit
def flash_bwd_dkdv_hopper_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    Delta,
    DK,
    DV,
    DQAcc,
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
    stride_dkb,
    stride_dkh,
    stride_dkt,
    stride_dvb,
    stride_dvh,
    stride_dvt,
    n_heads,
    seq_len_q,
    seq_len_k,
    softmax_scale,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
    DQ_BUFFERS: gl.constexpr = 1,
):
    """dK, dV (B, H, Tk, D) of the key tile program_id(0) of head program_id(1), from Q, dO (B, H, Tq, D), K, V
    (B, H, Tk, D), the forward's LSE and δ = rowsum(dO ∘ O) − dlse (B·H·Tq fp32 each, as the dQ pass leaves them)."""
    dtype: gl.constexpr = Q.dtype.element_ty
    bh = gl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    start_n = gl.program_id(0) * BLOCK_N
    q_desc = head_desc(Q, b, h, stride_qb, stride_qh, stride_qt, seq_len_q, HEAD_DIM, BLOCK_M)
    do_desc = head_desc(DO, b, h, stride_dob, stride_doh, stride_dot, seq_len_q, HEAD_DIM, BLOCK_M)
    k_desc = head_desc(K, b, h, stride_kb, stride_kh, stride_kt, seq_len_k, HEAD_DIM, BLOCK_N)
    v_desc = head_desc(V, b, h, stride_vb, stride_vh, stride_vt, seq_len_k, HEAD_DIM, BLOCK_N)

    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], v_desc.layout)
    stats_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    ring = (
        gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
        gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
        gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout),
        gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout),
        gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], stats_layout),
        gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], stats_layout),
    )
    # dQ: dS (as dSᵀ) and each tile's fp32 share, staged for the bulk reduce-add into DQAcc (B, H, Tq, D).
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)
    dq_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], gl.float32)
    dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_BUFFERS, BLOCK_M, HEAD_DIM], dq_layout)
    dq_head = DQAcc + bh.to(gl.int64) * seq_len_q * HEAD_DIM  # rows past Tq are clipped by the descriptor
    dq_desc = tma.make_tensor_descriptor(dq_head, [seq_len_q, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_M, HEAD_DIM], dq_layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ring[0].index(i), count=2)  # the expect (TMA bytes) and the LSE/δ stores
        mbarrier.init(ring[1].index(i), count=1)
    fence_async_shared()

    # Query tiles [lo, hi) see this key tile; those below `free` cross the diagonal (shift: Tk − Tq).
    shift = seq_len_k - seq_len_q
    hi = gl.cdiv(seq_len_q, BLOCK_M) * BLOCK_M
    if CAUSAL:
        lo = gl.maximum(start_n - shift, 0) // BLOCK_M * BLOCK_M
        free = gl.minimum(gl.cdiv(gl.maximum(start_n + BLOCK_N - 1 - shift, 0), BLOCK_M) * BLOCK_M, hi)
    else:
        lo = 0
        free = 0
    n_tiles = (hi - lo) // BLOCK_M
    n_masked = (free - lo) // BLOCK_M

    mbarrier.expect(kv_ready, 2 * k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [start_n, 0], kv_ready, k_smem)
    tma.async_copy_global_to_shared(v_desc, [start_n, 0], kv_ready, v_smem)

    row_start = bh.to(gl.int64) * seq_len_q
    rows = (LSE + row_start, Delta + row_start, seq_len_q)
    dk_ptrs = DK + b.to(gl.int64) * stride_dkb + h.to(gl.int64) * stride_dkh
    dv_ptrs = DV + b.to(gl.int64) * stride_dvb + h.to(gl.int64) * stride_dvh
    outs = (dk_ptrs, dv_ptrs, stride_dkt, stride_dvt, seq_len_k, softmax_scale)
    qk_scale = softmax_scale * LOG2E
    kv = (k_smem, v_smem)
    gl.warp_specialize(
        [
            (
                _consumer,
                (
                    kv,
                    kv_ready,
                    ring,
                    (ds_smem, dq_smem, dq_desc),
                    lo,
                    n_tiles,
                    n_masked,
                    outs,
                    start_n,
                    shift,
                    qk_scale,
                    CAUSAL,
                ),
            ),
            (_producer, ((q_desc, do_desc), ring, rows, lo, n_tiles, BLOCK_M)),
        ],
        [1],
        [24],
    )
