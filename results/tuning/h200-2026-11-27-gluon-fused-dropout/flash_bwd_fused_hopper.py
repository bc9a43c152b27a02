"""Experiment (prepared, not yet run on a GPU): the 5-product backward in Gluon, with dropout drawn once per tile
pair. The kept dK/dV pass (`kernels/flash_bwd_dkdv_hopper.py`: producer warp, one math warpgroup of 64 keys; K
read from shared memory, which here spills less than K in registers) plus a fifth product per query tile, as in
`../h200-2026-11-27-gluon-fused/`:

    dSᵀ → shared memory,  dQ_tile = dS·K (dSᵀ read transposed),  dQ_acc += dQ_tile by a TMA bulk reduce-add

and the dropout mask of `kernels/gluon_dropout.keep_mask_t`, drawn once for dV, dK and dQ (the split backward
draws it in both of its passes). δ and the zeroed fp32 accumulator come from `launch.launch_preprocess`, dQ's
scale and cast from `launch.launch_dq_convert`, as in the Triton fused backward.
"""

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

from flashgpt.kernels.flash_bwd_dkdv_hopper import _producer
from flashgpt.kernels.gluon_common import LOG2E, load_head_tile, mma_layout, store_head_tile, tile_layout
from flashgpt.kernels.gluon_dropout import keep_mask_t


@builtin
def _async_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Bulk tensor reduce-add of shared memory `src` into the tile of `tensor_desc` at `coord` (Hopper's
    cp.reduce.async.bulk.tensor). Triton 3.6 has the op but Gluon does not export it; wait with `tma.store_wait`
    before `src` is written again."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _fused_step(dk, dv, tile, kv, ring, dq_out, lo, keys, consts, MASKED: gl.constexpr, FIRST: gl.constexpr,
                DROPOUT: gl.constexpr):  # fmt: skip
    """One query tile's share of (dK, dV), dK's product still in flight when it returns, and its dQ rows += dS·K
    sent to the accumulator by a reduce-add."""
    start_n, offs_n, b, h = keys
    shift, qk_scale, rng, dropout_scale, seq_len_k = consts
    k_smem, v_smem = kv
    ready, empty, q_ring, do_ring, lse_ring, delta_ring = ring
    ds_smem, dq_smem, dq_desc = dq_out
    STAGES: gl.constexpr = q_ring.shape[0]
    BLOCK_M: gl.constexpr = q_ring.shape[1]
    HEAD_DIM: gl.constexpr = q_ring.shape[2]
    BLOCK_N: gl.constexpr = k_smem.shape[0]
    dtype: gl.constexpr = q_ring.dtype
    s_layout: gl.constexpr = mma_layout(gl.num_warps(), BLOCK_M)
    acc_layout: gl.constexpr = mma_layout(gl.num_warps(), HEAD_DIM)
    row_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)

    slot = tile % STAGES
    mbarrier.wait(ready.index(slot), (tile // STAGES) & 1)
    q_tile = q_ring.index(slot)
    do_tile = do_ring.index(slot)
    zeros = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    sT = warpgroup_mma(k_smem, q_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
    dpT = warpgroup_mma(v_smem, do_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
    lse2 = lse_ring.index(slot).load(row_layout)
    delta = delta_ring.index(slot).load(row_layout)
    start_m = lo + tile * BLOCK_M
    if DROPOUT:
        keep = keep_mask_t(rng, start_m, start_n, seq_len_k, BLOCK_N, BLOCK_M)
    if FIRST:
        sT = warpgroup_mma_wait(num_outstanding=1, deps=(sT,))
    else:
        # Retires the previous tile's dK product with Sᵀ: its buffer goes back to the producer.
        sT, dk = warpgroup_mma_wait(num_outstanding=1, deps=(sT, dk))
        mbarrier.arrive(empty.index((tile - 1) % STAGES), count=1)

    pT = gl.exp2(sT * qk_scale - lse2[None, :])
    if MASKED:
        offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_layout)
        pT = gl.where((offs_m + shift)[None, :] >= offs_n[:, None], pT, 0.0)
    if DROPOUT:  # from here the mask rides in pT's sign (dropped: −P), so its decisions need no registers
        pT = gl.where(keep, pT, -pT)
        pdT = gl.maximum(pT, 0.0)
    else:
        pdT = pT
    dv = warpgroup_mma(gl.convert_layout(pdT.to(dtype), p_layout), do_tile, dv, use_acc=not FIRST, is_async=True)
    dpT = warpgroup_mma_wait(num_outstanding=1, deps=(dpT,))
    if DROPOUT:  # kept: P·(c·dPᵀ − δ); dropped: −P·δ, i.e. the signed pT times δ
        dsT = gl.where(pT > 0.0, pT * (dpT * dropout_scale - delta[None, :]), pT * delta[None, :])
    else:
        dsT = pT * (dpT - delta[None, :])
    dsT = dsT.to(dtype)
    ds_smem.store(dsT)
    fence_async_shared()
    dq = warpgroup_mma(ds_smem.permute((1, 0)), k_smem, gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, acc_layout),
                       use_acc=False, is_async=True)  # fmt: skip
    dk = warpgroup_mma(gl.convert_layout(dsT, p_layout), q_tile, dk, use_acc=not FIRST, is_async=True)
    # Retires dV and dQ; dK runs on while dQ goes out.
    dq, dv = warpgroup_mma_wait(num_outstanding=1, deps=(dq, dv))
    tma.store_wait(0)  # the reduce-add that last read dq_smem is done
    dq_smem.store(dq)
    fence_async_shared()
    _async_reduce_add(dq_desc, [b, h, start_m, 0], dq_smem.reshape(dq_desc.block_type.shape))
    return dk, dv


@gluon.jit
def _consumer(kv, shared, start_n, CAUSAL: gl.constexpr, DROPOUT: gl.constexpr):
    """The walk over the query tiles that see this program's keys, then dK (times the softmax scale) and dV (times
    the dropout keep-scale) by TMA stores through K's and V's buffers."""
    kv_ready, ring, dq_out, tiles, outs, consts = shared
    k_smem, v_smem = kv
    lo, n_tiles, n_masked = tiles
    dk_desc, dv_desc, b, h, softmax_scale = outs
    HEAD_DIM: gl.constexpr = k_smem.shape[1]
    BLOCK_N: gl.constexpr = k_smem.shape[0]
    s_layout: gl.constexpr = mma_layout(gl.num_warps(), ring[2].shape[1])
    acc_layout: gl.constexpr = mma_layout(gl.num_warps(), HEAD_DIM)
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    zeros = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(kv_ready, 0)
    keys = (start_n, offs_n, b, h)
    # The first tile is peeled (C7515, as in the kept passes). Every key tile meets at least one query tile.
    dk, dv = _fused_step(zeros, zeros, 0, kv, ring, dq_out, lo, keys, consts, CAUSAL, True, DROPOUT)
    for tile in range(1, n_masked):
        dk, dv = _fused_step(dk, dv, tile, kv, ring, dq_out, lo, keys, consts, True, False, DROPOUT)
    for tile in range(gl.maximum(n_masked, 1), n_tiles):
        dk, dv = _fused_step(dk, dv, tile, kv, ring, dq_out, lo, keys, consts, False, False, DROPOUT)
    dk, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv))
    if DROPOUT:
        dv = dv * consts[3]
    tma.store_wait(0)
    k_smem.store((dk * softmax_scale).to(k_smem.dtype))
    v_smem.store(dv.to(v_smem.dtype))
    fence_async_shared()
    store_head_tile(dk_desc, b, h, start_n, k_smem)
    store_head_tile(dv_desc, b, h, start_n, v_smem)
    tma.store_wait(0)


@gluon.jit(do_not_specialize=["seed", "offset_lo", "offset_hi", "dropout_threshold"])
def flash_bwd_fused_hopper_kernel(
    q_desc,
    k_desc,
    v_desc,
    do_desc,
    LSE,
    Delta,
    dk_desc,
    dv_desc,
    dq_acc_desc,
    n_heads,
    seq_len_q,
    seq_len_k,
    softmax_scale,
    seed,
    offset_lo,
    offset_hi,
    dropout_threshold,
    dropout_scale,
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
    DROPOUT: gl.constexpr,
):
    """dK, dV (B, H, Tk, D) of the 64-key tile program_id(0) of head program_id(1), and this tile's share of dQ
    added into the fp32 accumulator (B, H, Tq, D), from Q, dO, K, V, the forward's LSE and δ (`launch_preprocess`).
    Descriptors as the kept dK/dV pass takes them, plus dq_acc_desc in tiles of (1, 1, BLOCK_M, D) fp32."""
    dtype: gl.constexpr = q_desc.dtype
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    bh = gl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    start_n = gl.program_id(0) * BLOCK_N

    kv_layout: gl.constexpr = tile_layout(BLOCK_N, HEAD_DIM, dtype)
    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], kv_layout)
    stats_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    ring = (
        gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
        gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
        gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], tile_layout(BLOCK_M, HEAD_DIM, dtype)),
        gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], tile_layout(BLOCK_M, HEAD_DIM, dtype)),
        gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], stats_layout),
        gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], stats_layout),
    )
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], tile_layout(BLOCK_N, BLOCK_M, dtype))
    dq_smem = gl.allocate_shared_memory(
        gl.float32, [BLOCK_M, HEAD_DIM], gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], gl.float32)
    )
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
    load_head_tile(k_desc, b, h, start_n, kv_ready, k_smem)
    load_head_tile(v_desc, b, h, start_n, kv_ready, v_smem)

    row_start = bh.to(gl.int64) * seq_len_q
    rows = (LSE + row_start, Delta + row_start, seq_len_q)
    outs = (dk_desc, dv_desc, b, h, softmax_scale)
    rng = (seed, offset_lo, offset_hi, bh, dropout_threshold)
    consts = (shift, softmax_scale * LOG2E, rng, dropout_scale, seq_len_k)
    shared = (kv_ready, ring, (ds_smem, dq_smem, dq_acc_desc), (lo, n_tiles, n_masked), outs, consts)
    gl.warp_specialize(
        [
            (_consumer, ((k_smem, v_smem), shared, start_n, CAUSAL, DROPOUT)),
            (_producer, ((q_desc, do_desc), ring, rows, lo, n_tiles, b, h)),
        ],
        [1],
        [24],
    )
