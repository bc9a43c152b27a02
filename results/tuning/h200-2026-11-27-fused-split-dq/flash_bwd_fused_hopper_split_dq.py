"""The fused backward for Hopper, in Gluon: 5 products per tile pair, the dropout mask drawn once.

The dK/dV pass of `flash_bwd_dkdv_hopper.py` (its producer warp and ring of Q/dO tiles, math warpgroups of 64 keys,
every product asynchronous) plus a fifth product that adds the program's share of dQ into an fp32 accumulator, as
FlashAttention-2/3 and cuDNN do:

    Sᵀ = K·Qᵀ,  Pᵀ = exp2(Sᵀ·scale·log2 e − LSE·log2 e),  dPᵀ = V·dOᵀ,
    dV += (Z ∘ Pᵀ)·dO,  dSᵀ = Pᵀ ∘ (c·Z ∘ dPᵀ − δ),  dK += dSᵀ·Q,
    dQ_acc[query tile] += dS·K                          (dK scaled by `scale` at the end, dQ by `launch_dq_convert`)

with keep-mask Z and keep-scale c (Z = 1, c = 1 without dropout). The split backward recomputes Sᵀ and dPᵀ in its
dQ pass and draws the mask there again; here each Philox number is drawn once for dV, dK and dQ.

D = 64, one math warpgroup, 64-query tiles:

    issue Sᵀ_j, dPᵀ_j │ draw Z_j │ wait Sᵀ_j (dK_{j−1} retires; its buffer goes back) │ Pᵀ_j ‖ dPᵀ_j runs
    issue dV_j        │ wait dPᵀ_j                                                    │ dSᵀ_j ‖ dV_j runs
    dSᵀ_j → shared memory; issue dQ_j = dS_j·K (dSᵀ read transposed), issue dK_j
    wait dQ_j, dV_j   │ dQ_j → shared memory → TMA reduce-add into dQ_acc            ‖ dK_j runs

D = 128, two math warpgroups (128 keys), 32-query tiles: dK and dV take 128 registers a thread, so, as in the dK/dV
pass, dPᵀ is issued after dV's product and Sᵀ and dPᵀ are never in flight together; dQ is computed transposed,
dQᵀ (D, 32) = Kᵀ·dSᵀ, so that its accumulator takes 32 registers (a product's rows come in 64s: dS·K would need
64-query tiles), and dK's left operand dSᵀ is read from shared memory like dQᵀ's (from registers, beside the
stores that put it there, ptxas serialised every product of the kernel, C7512).

- The reduce-add is Hopper's `cp.reduce.async.bulk.tensor.add` (`gluon_common.reduce_add_head_tile`): one bulk
  operation a tile, not 64 · D element-wise atomics. Sums land in an order that varies between runs, so
  `deterministic=True` takes the split backward.
- K is read from shared memory for both of its products: in registers for Sᵀ, as the dK/dV pass holds it at
  D = 64, the kernel spilled 200 bytes with dropout, beside the fifth product's accumulator.
- With dropout the mask rides in Pᵀ's sign once Pᵀ is computed (a dropped element becomes −P), so its decisions
  need no registers through dV's and dS's products: that took the spills from 80 bytes to a few.

With dropout 0.1, causal, 16K tokens a call, against the split backward (Gluon dQ and dK/dV passes) this pass ran
1.04 / 1.20 / 1.23 / 1.22 / 1.27× faster at D = 64 and 1.05 / 1.15 / 1.18 / 1.21 / 1.20× at D = 128, 1K-16K
(`results/tuning/h200-2026-11-27-gluon-fused-dropout/`, `results/tuning/h200-2026-11-27-gluon-fused-d128/`).
Without dropout the split backward is as fast or faster (by up to 7% at D = 64 and 7-13% at D = 128: its dQ pass
owns its rows and needs no reduce), so the table takes this pass only with dropout.

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

from .flash_bwd_dkdv_hopper import _producer, init_ring, query_ring, skip_unseen_tiles, store_dk_dv
from .gluon_common import LOG2E, load_head_tile, mma_layout, reduce_add_head_tile, tile_layout
from .gluon_dropout import keep_mask_t


@gluon.jit
def _fused_step(dk, dv, tile, step, kv, ring, dq_out, lo, keys, consts, MASKED: gl.constexpr, FIRST: gl.constexpr,
                DROPOUT: gl.constexpr, WG: gl.constexpr):  # fmt: skip
    """One query tile's share of (dK, dV), dK's product still in flight when it returns, and its dQ rows += dS·K
    sent to the accumulator. MASKED: the tile crosses the causal diagonal. FIRST: the warpgroup's first tile, whose
    products start dK and dV. At D > 64 (dK and dV take 128 registers a thread) dPᵀ is issued after dV's product,
    so that Sᵀ and dPᵀ are never in flight together, and dQ is computed transposed, dQᵀ = Kᵀ·dSᵀ, so that a query
    tile of 32 rows (a product's rows are 64) keeps its accumulator at 32 registers."""
    start_n, offs_n, b, h = keys
    shift, qk_scale, rng, dropout_scale, seq_len_k = consts
    k_smem, v_smem = kv
    ready, empty, q_ring, do_ring, lse_ring, delta_ring = ring
    ds_smem, dq_smem, dq_desc, pair = dq_out
    STAGES: gl.constexpr = q_ring.shape[0]
    BLOCK_M: gl.constexpr = q_ring.shape[1]
    HEAD_DIM: gl.constexpr = q_ring.shape[2]
    BLOCK_N: gl.constexpr = k_smem.shape[0]
    LATE: gl.constexpr = HEAD_DIM > 64
    HALF: gl.constexpr = dq_desc.block_type.shape[3]
    SPLIT: gl.constexpr = HALF < HEAD_DIM  # the two warpgroups sum dQ's halves of D together
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
    if not LATE:
        dpT = warpgroup_mma(v_smem, do_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
    lse2 = lse_ring.index(slot).load(row_layout)
    delta = delta_ring.index(slot).load(row_layout)
    start_m = lo + tile * BLOCK_M
    if DROPOUT:
        keep = keep_mask_t(rng, start_m, start_n, seq_len_k, BLOCK_N, BLOCK_M)
    if FIRST:
        sT = warpgroup_mma_wait(num_outstanding=0 if LATE else 1, deps=(sT,))
    else:
        # Retires the previous tile's dK product with Sᵀ: its buffer goes back to the producer.
        sT, dk = warpgroup_mma_wait(num_outstanding=0 if LATE else 1, deps=(sT, dk))
        mbarrier.arrive(empty.index((tile - 1) % STAGES), count=1)
        if SPLIT:  # and the previous step's dSᵀ buffer, which dK read last, goes back too
            mbarrier.arrive(pair[2].index((step - 1) % 2), count=1)

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
    if LATE:
        dpT = warpgroup_mma(v_smem, do_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
        dpT, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dpT, dv))
    else:
        dpT = warpgroup_mma_wait(num_outstanding=1, deps=(dpT,))
    if DROPOUT:  # kept: P·(c·dPᵀ − δ); dropped: −P·δ, which is the signed Pᵀ times δ
        dsT = gl.where(pT > 0.0, pT * (dpT * dropout_scale - delta[None, :]), pT * delta[None, :])
    else:
        dsT = pT * (dpT - delta[None, :])
    dsT = dsT.to(dtype)
    if SPLIT:
        dk = _split_dq_step(dk, dsT, step, q_tile, dq_out, keys, start_m, FIRST, WG)
    else:
        ds_smem.store(dsT)
        fence_async_shared()
        if LATE:  # dQᵀ (D, BLOCK_M) = Kᵀ·dSᵀ, both read from shared memory
            dq_layout: gl.constexpr = mma_layout(gl.num_warps(), BLOCK_M)
            dq = warpgroup_mma(k_smem.permute((1, 0)), ds_smem, gl.zeros([HEAD_DIM, BLOCK_M], gl.float32, dq_layout),
                               use_acc=False, is_async=True)  # fmt: skip
        else:  # dQ (BLOCK_M, D) = dS·K, dS read transposed from dSᵀ's buffer
            dq = warpgroup_mma(ds_smem.permute((1, 0)), k_smem, gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, acc_layout),
                               use_acc=False, is_async=True)  # fmt: skip
        if LATE:  # dK's left operand from shared memory too: from registers, ptxas serialises every product (C7512)
            dk = warpgroup_mma(ds_smem, q_tile, dk, use_acc=not FIRST, is_async=True)
        else:
            dk = warpgroup_mma(gl.convert_layout(dsT, p_layout), q_tile, dk, use_acc=not FIRST, is_async=True)
        # Retires dQ (and dV, where it is still in flight); dK runs on while dQ goes out.
        if LATE:
            dq = warpgroup_mma_wait(num_outstanding=1, deps=(dq,))
        else:
            dq, dv = warpgroup_mma_wait(num_outstanding=1, deps=(dq, dv))
        tma.store_wait(0)  # the reduce-add that last read dq_smem is done
        if LATE:
            dq_smem.permute((1, 0)).store(dq)
        else:
            dq_smem.store(dq)
        fence_async_shared()
        reduce_add_head_tile(dq_desc, b, h, start_m, dq_smem)
    return dk, dv


@gluon.jit
def _split_dq_step(dk, dsT, step, q_tile, dq_out, keys, start_m, FIRST: gl.constexpr, WG: gl.constexpr):
    """The end of a step at D = 128 on 64-query tiles (FlashAttention-3's 64 × 128 tile): both warpgroups put
    their dSᵀ in shared memory, then each computes one half of D of the tile's dQ over all 128 keys,
    dQ[:, half] = dS₀·K₀[:, half] + dS₁·K₁[:, half], so the pair sends one 64 × D sum per step rather than two.
    The dSᵀ buffers alternate between steps: `ds_ready` (both stored) and `ds_free` (both dK products that read
    them retired) say when each may be read and rewritten."""
    b, h = keys[2], keys[3]
    ds_smem, dq_smem, dq_desc, pair = dq_out
    k_all, ds_ready, ds_free = pair[0], pair[1], pair[2]
    HALF: gl.constexpr = dq_desc.block_type.shape[3]
    BLOCK_M: gl.constexpr = q_tile.shape[0]
    buf = step % 2
    mbarrier.wait(ds_free.index(buf), ((step // 2) & 1) ^ 1)  # a fresh barrier reads as handed back
    ds_smem.index(2 * buf + WG).store(dsT)
    fence_async_shared()
    gl.thread_barrier()  # every thread's part of dSᵀ is written before the other warpgroup hears of it
    mbarrier.arrive(ds_ready.index(buf), count=1)
    mbarrier.wait(ds_ready.index(buf), (step // 2) & 1)
    dq_layout: gl.constexpr = mma_layout(gl.num_warps(), HALF)
    dq = warpgroup_mma(ds_smem.index(2 * buf).permute((1, 0)), k_all.index(0).slice(WG * HALF, HALF, dim=1),
                       gl.zeros([BLOCK_M, HALF], gl.float32, dq_layout), use_acc=False, is_async=True)  # fmt: skip
    dq = warpgroup_mma(ds_smem.index(2 * buf + 1).permute((1, 0)), k_all.index(1).slice(WG * HALF, HALF, dim=1), dq,
                       is_async=True)  # fmt: skip
    dk = warpgroup_mma(ds_smem.index(2 * buf + WG), q_tile, dk, use_acc=not FIRST, is_async=True)
    dq = warpgroup_mma_wait(num_outstanding=1, deps=(dq,))  # dK runs on while dQ goes out
    tma.store_wait(0)  # the reduce-add that last read dq_smem is done
    dq_smem.store(dq)
    fence_async_shared()
    reduce_add_head_tile(dq_desc, b, h, start_m, dq_smem, WG * HALF)
    return dk


@gluon.jit
def _consumer(kv, shared, start_n, CAUSAL: gl.constexpr, DROPOUT: gl.constexpr, WG: gl.constexpr):
    """One warpgroup's 64 keys: walk the query tiles that see them, then store their dK (times the softmax scale)
    and dV (times the dropout keep-scale) by TMA through K's and V's buffers."""
    kv_ready, ring, dq_out, tiles, outs, consts = shared
    k_smem = kv[0]
    lo, n_tiles, _ = tiles
    b, h = outs[2], outs[3]
    HEAD_DIM: gl.constexpr = k_smem.shape[1]
    BLOCK_N: gl.constexpr = k_smem.shape[0]
    BLOCK_M: gl.constexpr = ring[2].shape[1]
    s_layout: gl.constexpr = mma_layout(gl.num_warps(), BLOCK_M)
    acc_layout: gl.constexpr = mma_layout(gl.num_warps(), HEAD_DIM)
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    if dq_out[2].block_type.shape[3] < HEAD_DIM:  # split dQ: both warpgroups walk all the program's query tiles
        mine, masked_end = skip_unseen_tiles(start_n - WG * BLOCK_N, tiles, consts[0], ring, 2 * BLOCK_N, CAUSAL)
    else:
        mine, masked_end = skip_unseen_tiles(start_n, tiles, consts[0], ring, BLOCK_N, CAUSAL)
    zeros = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(kv_ready, 0)
    keys = (start_n, offs_n, b, h)
    # The first tile is peeled so that products, not zeros written by the warps, start dK and dV (an accumulator
    # written by plain instructions where paths merge makes ptxas serialise every product, C7515).
    dk, dv = _fused_step(zeros, zeros, mine, 0, kv, ring, dq_out, lo, keys, consts, CAUSAL, True, DROPOUT, WG)
    for tile in range(mine + 1, masked_end):
        dk, dv = _fused_step(dk, dv, tile, tile - mine, kv, ring, dq_out, lo, keys, consts, True, False, DROPOUT, WG)
    for tile in range(masked_end, n_tiles):
        dk, dv = _fused_step(dk, dv, tile, tile - mine, kv, ring, dq_out, lo, keys, consts, False, False, DROPOUT,
                             WG)  # fmt: skip
    dk, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv))
    if DROPOUT:
        dv = dv * consts[3]
    tma.store_wait(0)
    store_dk_dv(dk, dv, kv, outs, start_n)


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
    CONSUMERS: gl.constexpr,
    CAUSAL: gl.constexpr,
    DROPOUT: gl.constexpr,
):
    """dK, dV (B, H, Tk, D) of the key tile program_id(0) (64 · CONSUMERS keys) of head program_id(1), and its
    share of dQ/scale added into the fp32 accumulator (B, H, Tq, D), from Q, dO, K, V, the forward's LSE and δ.
    Descriptors as the dK/dV pass takes them (Q and dO in tiles of (1, 1, BLOCK_M, D), K, V, dK and dV of
    (1, 1, 64, D)), and dq_acc_desc in Q's tiles, all made on the host (`launch.launch_fused_hopper`)."""
    dtype: gl.constexpr = q_desc.dtype
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    KEYS: gl.constexpr = k_desc.block_type.shape[2]  # a warpgroup's
    BLOCK_N: gl.constexpr = KEYS * CONSUMERS
    gl.static_assert(CONSUMERS <= 2, "one or two math warpgroups")
    bh = gl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    start_n = gl.program_id(0) * BLOCK_N

    kv_layout: gl.constexpr = tile_layout(KEYS, HEAD_DIM, dtype)
    k_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, KEYS, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, KEYS, HEAD_DIM], kv_layout)
    ring = query_ring(STAGES, BLOCK_M, HEAD_DIM, dtype)
    DQ_COLUMNS: gl.constexpr = dq_acc_desc.block_type.shape[3]
    SPLIT: gl.constexpr = DQ_COLUMNS < HEAD_DIM  # each of two warpgroups sends one half of D of the pair's dQ
    gl.static_assert(not SPLIT or CONSUMERS == 2, "dQ split between two math warpgroups")
    ds_layout: gl.constexpr = tile_layout(KEYS, BLOCK_M, dtype)
    if SPLIT:  # two buffers a warpgroup (2 · step parity + warpgroup), alternating between steps (`_split_dq_step`)
        ds_smem = gl.allocate_shared_memory(dtype, [2 * CONSUMERS, KEYS, BLOCK_M], ds_layout)
        ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(ds_ready.index(i), count=2)
            mbarrier.init(ds_free.index(i), count=2)
    else:
        ds_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, KEYS, BLOCK_M], ds_layout)
    dq_layout: gl.constexpr = tile_layout(BLOCK_M, DQ_COLUMNS, gl.float32)
    dq_smem = gl.allocate_shared_memory(gl.float32, [CONSUMERS, BLOCK_M, DQ_COLUMNS], dq_layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    init_ring(ring, CONSUMERS)
    fence_async_shared()

    # Query tiles [lo, hi) see some key of this program (causal: shift = Tk − Tq aligns them to the bottom right).
    shift = seq_len_k - seq_len_q
    hi = gl.cdiv(seq_len_q, BLOCK_M) * BLOCK_M
    lo = gl.maximum(start_n - shift, 0) // BLOCK_M * BLOCK_M if CAUSAL else 0
    n_tiles = (hi - lo) // BLOCK_M

    mbarrier.expect(kv_ready, 2 * CONSUMERS * k_desc.block_type.nbytes)
    for c in gl.static_range(CONSUMERS):
        load_head_tile(k_desc, b, h, start_n + c * KEYS, kv_ready, k_smem.index(c))
        load_head_tile(v_desc, b, h, start_n + c * KEYS, kv_ready, v_smem.index(c))

    row_start = bh.to(gl.int64) * seq_len_q
    rows = (LSE + row_start, Delta + row_start, seq_len_q)
    outs = (dk_desc, dv_desc, b, h, softmax_scale)
    rng = (seed, offset_lo, offset_hi, bh, dropout_threshold)  # this head's dropout stream (`gluon_dropout.py`)
    consts = (shift, softmax_scale * LOG2E, rng, dropout_scale, seq_len_k)
    # Constexprs go into each partition's argument tuple directly (a tuple bound to a name makes them run-time).
    tiles = (lo, n_tiles, hi)
    if SPLIT:  # both warpgroups read both dSᵀ buffers and both K tiles
        pair = (k_smem, ds_ready, ds_free)
        dq_out0 = (ds_smem, dq_smem.index(0), dq_acc_desc, pair)
        dq_out1 = (ds_smem, dq_smem.index(1), dq_acc_desc, pair)
    else:
        dq_out0 = (ds_smem.index(0), dq_smem.index(0), dq_acc_desc, 0)
        dq_out1 = (ds_smem.index(CONSUMERS - 1), dq_smem.index(CONSUMERS - 1), dq_acc_desc, 0)
    walk = (lo, n_tiles, (0, 0, 0))  # the producer's: every query tile from lo
    if CONSUMERS == 1:
        gl.warp_specialize(
            [
                (_consumer, ((k_smem.index(0), v_smem.index(0)), (kv_ready, ring, dq_out0, tiles, outs, consts),
                             start_n, CAUSAL, DROPOUT, 0)),
                (_producer, ((q_desc, do_desc), ring, rows, walk, b, h, False)),
            ],
            [1],
            [24],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (_consumer, ((k_smem.index(0), v_smem.index(0)), (kv_ready, ring, dq_out0, tiles, outs, consts),
                             start_n, CAUSAL, DROPOUT, 0)),
                (_consumer, ((k_smem.index(1), v_smem.index(1)), (kv_ready, ring, dq_out1, tiles, outs, consts),
                             start_n + KEYS, CAUSAL, DROPOUT, 1)),
                (_producer, ((q_desc, do_desc), ring, rows, walk, b, h, False)),
            ],
            [4, 1],
            [240 if SPLIT else 232, 24],  # split: 240 each (the default warpgroup gets what the others leave)
        )  # fmt: skip
