"""The fused backward for Hopper, in Gluon: 5 products per tile pair, the dropout mask drawn once.

The dK/dV pass of `flash_bwd_dkdv_hopper.py` (its producer warp and ring of Q/dO tiles, one math warpgroup of 64
keys, every product asynchronous) plus a fifth product that adds this key tile's share of dQ into an fp32
accumulator, as FlashAttention-2/3 and cuDNN do:

    Sᵀ = K·Qᵀ,  Pᵀ = exp2(Sᵀ·scale·log2 e − LSE·log2 e),  dPᵀ = V·dOᵀ,
    dV += (Z ∘ Pᵀ)·dO,  dSᵀ = Pᵀ ∘ (c·Z ∘ dPᵀ − δ),  dK += dSᵀ·Q,
    dQ_acc[query tile] += dS·K                          (dK scaled by `scale` at the end, dQ by `launch_dq_convert`)

with keep-mask Z and keep-scale c (Z = 1, c = 1 without dropout). The split backward recomputes Sᵀ and dPᵀ in its
dQ pass and draws the mask there again; here each Philox number is drawn once for dV, dK and dQ.

    issue Sᵀ_j, dPᵀ_j │ draw Z_j │ wait Sᵀ_j (dK_{j−1} retires; its buffer goes back) │ Pᵀ_j ‖ dPᵀ_j runs
    issue dV_j        │ wait dPᵀ_j                                                    │ dSᵀ_j ‖ dV_j runs
    dSᵀ_j → shared memory; issue dQ_j = dS_j·K (dSᵀ read transposed), issue dK_j
    wait dQ_j, dV_j   │ dQ_j → shared memory → TMA reduce-add into dQ_acc            ‖ dK_j runs

- The reduce-add is Hopper's `cp.reduce.async.bulk.tensor.add` (`gluon_common.reduce_add_head_tile`): one bulk
  operation a tile, not 64 · D element-wise atomics. Sums land in an order that varies between runs, so
  `deterministic=True` takes the split backward.
- K is read from shared memory for both of its products: in registers for Sᵀ, as the dK/dV pass holds it at
  D = 64, the kernel spilled 200 bytes with dropout, beside the fifth product's accumulator.
- With dropout the mask rides in Pᵀ's sign once Pᵀ is computed (a dropped element becomes −P), so its decisions
  need no registers through dV's and dS's products: that took the spills from 80 bytes to a few.

Against the split backward the table takes (Gluon dQ and dK/dV passes) with dropout 0.1 at D = 64, causal,
16K tokens a call, this pass ran 1.04 / 1.20 / 1.23 / 1.22 / 1.27× faster at 1K-16K, and 1.16-1.31× the fused
Triton backward (`results/tuning/h200-2026-11-27-gluon-fused-dropout/`). Without dropout the split backward is
4-10% faster (its dQ pass owns its rows, no reduce), so the table takes this pass only with dropout; at D = 128
the three accumulators do not fit one warpgroup's registers.

Dense, bf16 or fp16, Tq ≤ Tk (causal: aligned to the bottom right), any T; the tensors must suit tensor
descriptors (`launch.hopper_launch_config` checks) and dQ_acc (B, H, Tq, D) fp32 is contiguous and zeroed
(`launch.launch_preprocess`, which also writes δ). Gluon has no interpreter path: the CPU tests compile this pass
for sm_90a (`tests/test_kernel_codegen.py`) and `scripts/bench_attention.py --check-only` checks it on the GPU.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .flash_bwd_dkdv_hopper import _producer, init_ring, query_ring
from .gluon_common import LOG2E, load_head_tile, mma_layout, reduce_add_head_tile, store_head_tile, tile_layout
from .gluon_dropout import keep_mask_t


@gluon.jit
def _fused_step(dk, dv, tile, kv, ring, dq_out, lo, keys, consts, MASKED: gl.constexpr, FIRST: gl.constexpr,
                DROPOUT: gl.constexpr):  # fmt: skip
    """One query tile's share of (dK, dV), dK's product still in flight when it returns, and its dQ rows += dS·K
    sent to the accumulator. MASKED: the tile crosses the causal diagonal. FIRST: the walk's first tile, whose
    products start dK and dV."""
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
    if DROPOUT:  # from here a dropped element is −P, so the decisions need no registers
        pT = gl.where(keep, pT, -pT)
        pdT = gl.maximum(pT, 0.0)
    else:
        pdT = pT
    dv = warpgroup_mma(gl.convert_layout(pdT.to(dtype), p_layout), do_tile, dv, use_acc=not FIRST, is_async=True)
    dpT = warpgroup_mma_wait(num_outstanding=1, deps=(dpT,))
    if DROPOUT:  # kept: P·(c·dPᵀ − δ); dropped: −P·δ, which is the signed Pᵀ times δ
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
    reduce_add_head_tile(dq_desc, b, h, start_m, dq_smem)
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
    # The first tile is peeled so that products, not zeros written by the warps, start dK and dV (an accumulator
    # written by plain instructions where paths merge makes ptxas serialise every product, C7515). Every key tile
    # meets at least one query tile.
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
    """dK, dV (B, H, Tk, D) of the 64-key tile program_id(0) of head program_id(1), and this tile's share of
    dQ/scale added into the fp32 accumulator (B, H, Tq, D), from Q, dO, K, V, the forward's LSE and δ. Descriptors
    as the dK/dV pass takes them (Q and dO in tiles of (1, 1, BLOCK_M, D), K, V, dK and dV of (1, 1, 64, D)), and
    dq_acc_desc in Q's tiles, all made on the host (`launch.launch_fused_hopper`)."""
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
    ring = query_ring(STAGES, BLOCK_M, HEAD_DIM, dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], tile_layout(BLOCK_N, BLOCK_M, dtype))
    dq_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M, HEAD_DIM], tile_layout(BLOCK_M, HEAD_DIM, gl.float32))
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    init_ring(ring, 1)
    fence_async_shared()

    # Query tiles [lo, hi) see this key tile; those below `free` cross its diagonal (causal: shift = Tk − Tq aligns
    # them to the bottom right).
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
    rng = (seed, offset_lo, offset_hi, bh, dropout_threshold)  # this head's dropout stream (`gluon_dropout.py`)
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
