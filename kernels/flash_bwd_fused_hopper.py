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
stores that put it there, ptxas serialised every product of the kernel, C7512). Under masks at D = 64 the pass
also runs 32-query tiles, dQ transposed the same way: on 64-query tiles the masked steps spill.

**A dQ warpgroup** (`_dq_warpgroup`; PAIRED_DQ, `launch.has_dq_warpgroup`: at D = 64 on 64 × 128 tiles, dense calls and
masked calls without dropout, and on 32 × 128 tiles masked calls with dropout; at D = 128 on 32 × 128 tiles, dense calls
without dropout; on 32-query tiles dQᵀ as above): the two math warpgroups walk the program's query tiles in step and,
rather than each sending its own dS·K, hand their dSᵀ to a third warpgroup through a ring of shared buffers; it computes
the tile's dQ over the program's 128 keys, dS₀·K₀ + dS₁·K₁, and sends it with one reduce-add:

    math warpgroup w:  … dSᵀ_j → buffer (j mod 2, w), arrive ds_ready │ issue dK_j (dSᵀ from that buffer) │ next tile
    dQ warpgroup:      wait ds_ready_j │ dQ_j = dS₀·K₀ + dS₁·K₁ │ arrive ds_free_j │ dQ_j → TMA reduce-add

Per key, each step sends half the fp32 traffic of a one-warpgroup program, and shares each Q/dO tile between two
warpgroups; a math warpgroup waits for nobody but the dQ warpgroup, and only when it is two steps behind. At the GPU's
power limit that is what wins: fewer joules a backward. Against the split backward (7 products, no reduce) the backward
at D = 64 ran 1.03× faster at 4K, 1.04–1.07× at 8K and 1.07–1.11× at 16K, with 3–9% less energy a call; at 1K–2K it lost
(0.94–0.98×) and the table keeps the split backward there. At D = 128: 1.00× at 4K, 1.04× at 8K, 1.06–1.07× at 16K. With
dropout at D = 64, against one math warpgroup of 64 keys that sends its own dQ: 1.02–1.03× at 4K, 1.08× at 8K, 1.11× at
16K. Without dropout under a 4K window, 1.12× at 8K and 16K and 1.16× at 64K against the split passes; under a 1K window
0.98–1.05×; under documents 0.87× at 4K, 0.95× at 8K, 1.00× at 16K and 1.13× at 64K; under block masks 0.95–0.98× at 16K
(fwd+bwd 0.99–1.02×) and 1.03–1.07× at 64K; so masked calls take it from 8K under a window and from 16K under documents
or block masks, `launch.gluon_config`. With dropout under masks, on 32 × 128 tiles against one math warpgroup's 32 × 64:
0.90–0.98× at 4K, 0.98–1.08× at 16K and 1.02–1.13× at 64K, so from 16K (`launch.fit_gluon_to_masks`). Registers: 200 for
each math warpgroup and 88 for the dQ one at D = 64, 208 and 72 at D = 128 and under masks (maxnreg 128 over 16 warps);
under documents it keeps 24 bytes on the stack, with dropout under a block mask 16. Before it, two math warpgroups that
summed dQ themselves, the owner alternating step by step, tied the split backward (1.00× at 16K, 0.98× at 8K): each
waited for the other every second step (`results/tuning/h200-2026-11-28-paired-dq/`, `../h200-2026-11-28-fused-reduce/`,
`../h200-2026-11-28-dq-warpgroup-all/`, `../h200-2026-11-28-masked-dq-warpgroup/`).

- The reduce-add is Hopper's `cp.reduce.async.bulk.tensor.add` (`gluon_common.reduce_add_head_tile`): one bulk
  operation a tile, not 64 · D element-wise atomics. Sums land in an order that varies between runs, so
  `deterministic=True` takes the split backward.
- K is read from shared memory for both of its products: in registers for Sᵀ, as the dK/dV pass holds it at
  D = 64, the kernel spilled 200 bytes with dropout, beside the fifth product's accumulator.
- With dropout the mask rides in Pᵀ's sign once Pᵀ is computed (a dropped element becomes −P), so its decisions
  need no registers through dV's and dS's products: that took the spills from 80 bytes to a few.

Masks (causal) as the dK/dV pass takes them: under a sliding window, documents or a block mask each warpgroup
walks its runs of query tiles (`consumer_runs`), masks the pairs they hide in its masked steps (`hide_unseen`),
and hands the other tiles back unread; a block mask's programs start long walks first.

With dropout 0.1, causal, 16K tokens a call, against the split backward (Gluon dQ and dK/dV passes) this pass ran
1.04 / 1.20 / 1.23 / 1.22 / 1.27× faster at D = 64 and 1.05 / 1.15 / 1.18 / 1.21 / 1.20× at D = 128, 1K-16K
(`results/tuning/h200-2026-11-27-gluon-fused-dropout/`, `results/tuning/h200-2026-11-27-gluon-fused-d128/`).
Under masks, fwd+bwd against the split backward: at D = 64 and 16K 1.07-1.16× on 32-query tiles (on the dense
64-query tiles the masked steps spill 112-176 bytes, and it ran 0.99-1.07×), 1.16× under documents at 64K; at
D = 128 1.04-1.11× (`results/tuning/h200-2026-11-27-masked-dropout/`). Without dropout, one warpgroup's own
reduce-add costs more than the split backward's two extra products (by up to 7% at D = 64 and 7-13% at D = 128),
so the table takes this pass without dropout only with a dQ warpgroup, from 4K.

Dense or masked, bf16 or fp16, Tq ≤ Tk (causal: aligned to the bottom right), any T; the tensors must suit tensor
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

from .flash_bwd_dkdv_hopper import (
    _producer,
    consumer_runs,
    hand_back,
    hide_unseen,
    init_ring,
    kept_query_runs,
    key_tile_walk,
    query_ring,
    query_runs,
    query_start,
    seen_tiles,
    store_dk_dv,
)
from .gluon_common import (
    LOG2E,
    load_head_tile,
    long_walks_first,
    mma_layout,
    reduce_add_head_tile,
    tile_and_head,
    tile_layout,
)
from .gluon_dropout import keep_mask_t


@gluon.jit
def hand_ds(dq_out, step, dsT):
    """This warpgroup's dSᵀ of its walk's step `step`, handed to the dQ warpgroup (`_dq_warpgroup`) through buffer
    step mod DS_STAGES of its ring, which it returns; dq_out's pair = (K buffers, ds_ready, ds_free, warpgroup)."""
    ds_smem, pair = dq_out[0], dq_out[5]
    ds_ready, ds_free, WG = pair[1], pair[2], pair[3]
    DS_STAGES: gl.constexpr = ds_ready.shape[0]
    slot = step % DS_STAGES
    mbarrier.wait(ds_free.index(slot), ((step // DS_STAGES) & 1) ^ 1)  # a fresh barrier reads as handed back
    buffer = ds_smem.index(2 * slot + WG)
    buffer.store(dsT)
    fence_async_shared()
    gl.thread_barrier()  # every thread's part of dSᵀ is written before the dQ warpgroup hears of it
    mbarrier.arrive(ds_ready.index(slot), count=1)
    return buffer


@gluon.jit
def _fused_step(
    dk,
    dv,
    tile,
    step,
    kv,
    ring,
    dq_out,
    lo,
    keys,
    consts,
    MASKED: gl.constexpr,
    FIRST: gl.constexpr,
    DROPOUT: gl.constexpr,
    WINDOW: gl.constexpr,
    DOCS: gl.constexpr,
    SPARSE: gl.constexpr,
):
    """One query tile's share of (dK, dV) (SPARSE: the walk's tile `tile` is a position in the kept-tile list), dK's
    product still in flight when it returns, and its dQ rows += dS·K sent to the accumulator. MASKED: the tile
    crosses the causal diagonal, (WINDOW) the upper edge of a causal sliding window or (DOCS) a document's edge
    (`hide_unseen`). FIRST: the warpgroup's first tile, whose products start dK and dV. At D > 64 (dK and dV take
    128 registers a thread) dPᵀ is issued after dV's product, so that Sᵀ and dPᵀ are never in flight together, and
    dQ is computed transposed, dQᵀ = Kᵀ·dSᵀ, so that a query tile of 32 rows (a product's rows are 64) keeps its
    accumulator at 32 registers. dq_out = (dSᵀ buffer, dQ buffer, dQ_acc's descriptor, b, h, pair); with a dQ
    warpgroup (PAIRED: dSᵀ buffers in a ring) pair = (K buffers, ds_ready, ds_free, this warpgroup's index), and this
    warpgroup's dSᵀ of its walk's step `step` goes to that warpgroup instead of into a product of its own."""
    start_n, kept = keys[0], keys[3]
    qk_scale, rng, dropout_scale, seq_len_k = consts[1], consts[2], consts[3], consts[4]
    k_smem, v_smem = kv
    ready, empty, q_ring, do_ring, lse_ring, delta_ring = ring
    ds_smem, dq_smem, dq_desc, b, h = dq_out[:5]
    PAIRED: gl.constexpr = len(ds_smem.shape) == 3  # the program's dQ warpgroup sums and sends dQ (`_dq_warpgroup`)
    STAGES: gl.constexpr = q_ring.shape[0]
    BLOCK_M: gl.constexpr = q_ring.shape[1]
    HEAD_DIM: gl.constexpr = q_ring.shape[2]
    BLOCK_N: gl.constexpr = k_smem.shape[0]
    LATE: gl.constexpr = HEAD_DIM > 64
    DQ_T: gl.constexpr = LATE or BLOCK_M < 64  # a product's rows come in 64s
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
    start_m = query_start(tile, lo, kept, BLOCK_M, SPARSE)
    if DROPOUT:
        keep = keep_mask_t(rng, start_m, start_n, seq_len_k, BLOCK_N, BLOCK_M)
    if FIRST:
        sT = warpgroup_mma_wait(num_outstanding=0 if LATE else 1, deps=(sT,))
    else:
        # Retires the previous tile's dK product with Sᵀ: its buffer goes back to the producer.
        sT, dk = warpgroup_mma_wait(num_outstanding=0 if LATE else 1, deps=(sT, dk))
        mbarrier.arrive(empty.index((tile - 1) % STAGES), count=1)

    pT = gl.exp2(sT * qk_scale - lse2[None, :])
    if MASKED:
        pT = hide_unseen(pT, start_m, tile, keys, consts, WINDOW, DOCS, SPARSE)
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
    if PAIRED:  # dSᵀ to the dQ warpgroup through a ring of DS_STAGES buffers a warpgroup
        ds_buffer = hand_ds(dq_out, step, dsT)
        # dK's left operand from that buffer too: from registers, beside the stores, ptxas serialises every product
        # of the kernel (C7512). This warpgroup's dK retires at the next step, before the buffer's next store.
        dk = warpgroup_mma(ds_buffer, q_tile, dk, use_acc=not FIRST, is_async=True)
        dv = warpgroup_mma_wait(num_outstanding=1, deps=(dv,))  # dK runs on
    else:
        ds_smem.store(dsT)
        fence_async_shared()
        if DQ_T:  # dQᵀ (D, BLOCK_M) = Kᵀ·dSᵀ, both read from shared memory
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
        if DQ_T:
            dq_smem.permute((1, 0)).store(dq)
        else:
            dq_smem.store(dq)
        fence_async_shared()
        reduce_add_head_tile(dq_desc, b, h, start_m, dq_smem)
    return dk, dv


@gluon.jit
def hidden_leading_tiles(start_n, lo, mine, masked_end, shift, BLOCK_M: gl.constexpr):
    """How many of the walk's query tiles from `mine` (rows lo + t · BLOCK_M) lie wholly before the keys at start_n
    (causal: query i sees keys up to i + shift), leaving at least one masked tile to walk."""
    hidden = gl.maximum(start_n - shift - (lo + mine * BLOCK_M), 0) // BLOCK_M
    return gl.minimum(hidden, gl.maximum(masked_end - mine - 1, 0))


@gluon.jit
def hand_zero_ds(dq_out, n_steps, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, s_layout: gl.constexpr):
    """This warpgroup's dSᵀ for the dQ warpgroup's first n_steps steps: zeros."""
    zeros = gl.zeros([BLOCK_N, BLOCK_M], dq_out[0].dtype, s_layout)
    for step in range(n_steps):
        hand_ds(dq_out, step, zeros)


@gluon.jit
def _consumer(
    kv,
    shared,
    start_n,
    CAUSAL: gl.constexpr,
    DROPOUT: gl.constexpr,
    WINDOW: gl.constexpr,
    DOCS: gl.constexpr,
    SPARSE: gl.constexpr,
):
    """One warpgroup's 64 keys: walk the query tiles that see them (under masks the runs of `consumer_runs`, the
    program's later tiles handed back unread), then store their dK (times the softmax scale) and dV (times the
    dropout keep-scale) by TMA through K's and V's buffers."""
    kv_ready, ring, dq_out, tiles, outs, consts = shared
    k_smem = kv[0]
    lo, n_tiles, kept = tiles[0], tiles[1], tiles[3]
    HEAD_DIM: gl.constexpr = k_smem.shape[1]
    BLOCK_N: gl.constexpr = k_smem.shape[0]
    BLOCK_M: gl.constexpr = ring[2].shape[1]
    s_layout: gl.constexpr = mma_layout(gl.num_warps(), BLOCK_M)
    acc_layout: gl.constexpr = mma_layout(gl.num_warps(), HEAD_DIM)
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    PAIRED: gl.constexpr = len(dq_out[0].shape) == 3
    if PAIRED:  # both warpgroups walk every query tile that sees any of the program's keys, in step
        first_key = start_n - dq_out[5][3] * BLOCK_N
        mine, masked_end, full_end, seen_end, valid = consumer_runs(first_key, tiles, consts, ring, 2 * BLOCK_N,
                                                                    CAUSAL, WINDOW, DOCS, SPARSE)  # fmt: skip
    else:
        mine, masked_end, full_end, seen_end, valid = consumer_runs(start_n, tiles, consts, ring, BLOCK_N, CAUSAL,
                                                                    WINDOW, DOCS, SPARSE)  # fmt: skip
    zeros = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
    first = mine
    if PAIRED and CAUSAL and not SPARSE and not DROPOUT and HEAD_DIM <= 64:
        # The pair walks from the first query tile that sees its first 64 keys; the second warpgroup's keys are
        # hidden from the queries before them (one 64-query tile), so it hands the dQ warpgroup zeros for that
        # tile instead of computing it: the backward 1.06-1.08x at 4K-16K dense, 1.01x under documents or a 1K
        # window at 16K. With dropout the extra code spills; at D = 128 (two 32-query tiles) it lost 3% at 4K.
        first = mine + hidden_leading_tiles(start_n, lo, mine, masked_end, consts[0], BLOCK_M)
        hand_zero_ds(dq_out, first - mine, BLOCK_N, BLOCK_M, s_layout)
        hand_back(ring, mine, first)
    mbarrier.wait(kv_ready, 0)
    key_ids = gl.load(consts[6] + gl.minimum(offs_n, consts[4] - 1)) if DOCS else offs_n  # the keys' documents
    keys = (start_n, offs_n, key_ids, kept, valid)
    # The first tile is peeled so that products, not zeros written by the warps, start dK and dV (an accumulator
    # written by plain instructions where paths merge makes ptxas serialise every product, C7515).
    dk, dv = _fused_step(zeros, zeros, first, first - mine, kv, ring, dq_out, lo, keys, consts, CAUSAL, True, DROPOUT,
                         WINDOW, DOCS, SPARSE)  # fmt: skip
    for tile in range(first + 1, masked_end):
        dk, dv = _fused_step(dk, dv, tile, tile - mine, kv, ring, dq_out, lo, keys, consts, True, False, DROPOUT,
                             WINDOW, DOCS, SPARSE)  # fmt: skip
    if WINDOW or DOCS or SPARSE:
        for tile in range(masked_end, full_end):
            dk, dv = _fused_step(dk, dv, tile, tile - mine, kv, ring, dq_out, lo, keys, consts, False, False,
                                 DROPOUT, WINDOW, DOCS, SPARSE)  # fmt: skip
        for tile in range(full_end, seen_end):
            dk, dv = _fused_step(dk, dv, tile, tile - mine, kv, ring, dq_out, lo, keys, consts, True, False,
                                 DROPOUT, WINDOW, DOCS, SPARSE)  # fmt: skip
        dk, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv))
        mbarrier.arrive(ring[1].index((seen_end - 1) % ring[2].shape[0]), count=1)  # the last tile read
        hand_back(ring, seen_end, n_tiles)
    else:
        for tile in range(masked_end, n_tiles):
            dk, dv = _fused_step(dk, dv, tile, tile - mine, kv, ring, dq_out, lo, keys, consts, False, False,
                                 DROPOUT, WINDOW, DOCS, SPARSE)  # fmt: skip
        dk, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv))
    if PAIRED:  # the dQ warpgroup's last products, which read this warpgroup's K (whose buffer takes dK), retired
        ds_free = dq_out[5][2]
        DS_STAGES: gl.constexpr = ds_free.shape[0]
        last = seen_end - 1 - mine
        mbarrier.wait(ds_free.index(last % DS_STAGES), (last // DS_STAGES) & 1)
    if DROPOUT:
        dv = dv * consts[3]
    tma.store_wait(0)
    store_dk_dv(dk, dv, kv, outs, start_n)


@gluon.jit
def _dq_warpgroup(
    shared, start_n, CAUSAL: gl.constexpr, WINDOW: gl.constexpr, DOCS: gl.constexpr, SPARSE: gl.constexpr
):
    """The dQ of a program of two math warpgroups of 64 keys: for each query tile of their walk (under a window,
    documents or a block mask, from the first either sees to the last), once both have put their dSᵀ in shared memory
    (`ds_ready`), dQ (BLOCK_M, D) = dS₀·K₀ + dS₁·K₁ over the program's 128 keys, sent with one reduce-add: half the
    reduce traffic of a warpgroup that sends its own, and the math warpgroups wait for nobody but this one, and
    only when it is DS_STAGES steps behind (`ds_free`)."""
    kv_ready, ring, dq_out, tiles, consts = shared
    ds_smem, dq_smem, dq_desc, b, h, pair = dq_out
    k_all, ds_ready, ds_free = pair[0], pair[1], pair[2]
    DS_STAGES: gl.constexpr = ds_ready.shape[0]
    BLOCK_M: gl.constexpr = ring[2].shape[1]
    HEAD_DIM: gl.constexpr = ring[2].shape[2]
    KEYS: gl.constexpr = k_all.shape[1]
    DQ_T: gl.constexpr = BLOCK_M < 64  # a product's rows come in 64s: dQᵀ (D, BLOCK_M) = K₀ᵀ·dS₀ᵀ + K₁ᵀ·dS₁ᵀ
    lo, n_tiles, kept = tiles[0], tiles[1], tiles[3]
    if WINDOW or DOCS or SPARSE:  # the math warpgroups' runs (`consumer_runs`), from the first to the last seen
        runs = query_runs(start_n, tiles, consts, BLOCK_M, 2 * KEYS, WINDOW, DOCS)
        if SPARSE:
            runs, _ = kept_query_runs(runs, kept, lo // BLOCK_M, n_tiles)
        mine, _, _, seen_end = runs
    else:
        mine, _ = seen_tiles(start_n, tiles, consts[0], BLOCK_M, 2 * KEYS, CAUSAL)
        seen_end = n_tiles
    if DQ_T:
        zeros = gl.zeros([HEAD_DIM, BLOCK_M], gl.float32, mma_layout(gl.num_warps(), BLOCK_M))
    else:
        zeros = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, mma_layout(gl.num_warps(), HEAD_DIM))
    mbarrier.wait(kv_ready, 0)
    for step in range(seen_end - mine):
        slot = step % DS_STAGES
        mbarrier.wait(ds_ready.index(slot), (step // DS_STAGES) & 1)
        if DQ_T:
            dq = warpgroup_mma(k_all.index(0).permute((1, 0)), ds_smem.index(2 * slot), zeros, use_acc=False,
                               is_async=True)  # fmt: skip
            dq = warpgroup_mma(k_all.index(1).permute((1, 0)), ds_smem.index(2 * slot + 1), dq, is_async=True)
        else:
            dq = warpgroup_mma(ds_smem.index(2 * slot).permute((1, 0)), k_all.index(0), zeros, use_acc=False,
                               is_async=True)  # fmt: skip
            dq = warpgroup_mma(ds_smem.index(2 * slot + 1).permute((1, 0)), k_all.index(1), dq, is_async=True)
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
        mbarrier.arrive(ds_free.index(slot), count=1)
        buf = step % 2
        tma.store_wait(1)  # the reduce-add that read this buffer two steps ago is done
        if DQ_T:
            dq_smem.index(buf).permute((1, 0)).store(dq)
        else:
            dq_smem.index(buf).store(dq)
        fence_async_shared()
        reduce_add_head_tile(dq_desc, b, h, query_start(mine + step, lo, kept, BLOCK_M, SPARSE), dq_smem.index(buf))
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
    window_size,
    documents,
    blocks,
    WalkOrder,
    STAGES: gl.constexpr,
    CONSUMERS: gl.constexpr,
    PAIRED_DQ: gl.constexpr,
    CAUSAL: gl.constexpr,
    WINDOW: gl.constexpr,
    HEADS_FASTEST: gl.constexpr,
    DROPOUT: gl.constexpr,
):
    """dK, dV (B, H, Tk, D) of a key tile (64 · CONSUMERS keys) of a head (`tile_and_head`), and its share of
    dQ/scale added into the fp32 accumulator (B, H, Tq, D), from Q, dO, K, V, the forward's LSE and δ; with
    PAIRED_DQ (two math warpgroups) a third warpgroup sums and sends their dQ (`_dq_warpgroup`).
    Descriptors as the dK/dV pass takes them (Q and dO in tiles of (1, 1, BLOCK_M, D), K, V, dK and dV of
    (1, 1, 64, D)), and dq_acc_desc in Q's tiles, all made on the host (`launch.launch_fused_hopper`). Masks as the
    dK/dV pass takes them (`flash_bwd_dkdv_hopper_kernel`): with CAUSAL, WINDOW (a sliding window of window_size
    keys), documents (DocIds with its schedule DocRanges) and blocks (a block mask's kept query tiles per key tile,
    KeptIndex with KeptCount), and WalkOrder the order the key tiles' programs start in."""
    DOCS: gl.constexpr = documents[0] is not None
    SPARSE: gl.constexpr = blocks[0] is not None
    dtype: gl.constexpr = q_desc.dtype
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    KEYS: gl.constexpr = k_desc.block_type.shape[2]  # a warpgroup's
    BLOCK_N: gl.constexpr = KEYS * CONSUMERS
    gl.static_assert(CONSUMERS <= 2, "one or two math warpgroups")
    if SPARSE:
        tile, bh = long_walks_first(WalkOrder, HEADS_FASTEST)
    else:
        tile, bh = tile_and_head(HEADS_FASTEST)
    b = bh // n_heads
    h = bh % n_heads
    start_n = tile * BLOCK_N

    kv_layout: gl.constexpr = tile_layout(KEYS, HEAD_DIM, dtype)
    k_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, KEYS, HEAD_DIM], kv_layout)
    v_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, KEYS, HEAD_DIM], kv_layout)
    ring = query_ring(STAGES, BLOCK_M, HEAD_DIM, dtype)
    ds_layout: gl.constexpr = tile_layout(KEYS, BLOCK_M, dtype)
    dq_layout: gl.constexpr = tile_layout(BLOCK_M, HEAD_DIM, gl.float32)
    # Both, a program of two math warpgroups whose dQ a third sums: dSᵀ in a ring of DS_STAGES pairs of buffers
    # (ds_ready: both stored; ds_free: the dQ warpgroup's products that read them retired), dQ's source doubled.
    if PAIRED_DQ:
        gl.static_assert(CONSUMERS == 2, "a dQ warpgroup: two math warpgroups")
        DS_STAGES: gl.constexpr = 2
        ds_smem = gl.allocate_shared_memory(dtype, [2 * DS_STAGES, KEYS, BLOCK_M], ds_layout)
        ds_ready = gl.allocate_shared_memory(gl.int64, [DS_STAGES, 1], mbarrier.MBarrierLayout())
        ds_free = gl.allocate_shared_memory(gl.int64, [DS_STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(DS_STAGES):
            mbarrier.init(ds_ready.index(i), count=2)
            mbarrier.init(ds_free.index(i), count=1)
    else:
        ds_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, KEYS, BLOCK_M], ds_layout)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2 if PAIRED_DQ else CONSUMERS, BLOCK_M, HEAD_DIM], dq_layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    init_ring(ring, CONSUMERS)
    fence_async_shared()

    shift = seq_len_k - seq_len_q
    masks = (window_size, documents, blocks)
    lo, n_tiles, hi, kept, docs, doc_range = key_tile_walk(
        tile, b, h, shift, seq_len_q, masks, BLOCK_M, BLOCK_N, CAUSAL, WINDOW
    )

    mbarrier.expect(kv_ready, 2 * CONSUMERS * k_desc.block_type.nbytes)
    for c in gl.static_range(CONSUMERS):
        load_head_tile(k_desc, b, h, start_n + c * KEYS, kv_ready, k_smem.index(c))
        load_head_tile(v_desc, b, h, start_n + c * KEYS, kv_ready, v_smem.index(c))

    row_start = bh.to(gl.int64) * seq_len_q
    rows = (LSE + row_start, Delta + row_start, seq_len_q)
    outs = (dk_desc, dv_desc, b, h, softmax_scale)
    rng = (seed, offset_lo, offset_hi, bh, dropout_threshold)  # this head's dropout stream (`gluon_dropout.py`)
    consts = (shift, softmax_scale * LOG2E, rng, dropout_scale, seq_len_k, window_size, docs, doc_range)
    # Constexprs go into each partition's argument tuple directly (a tuple bound to a name makes them run-time).
    tiles = (lo, n_tiles, hi, kept)
    walk = (lo, n_tiles, kept)  # the producer's
    if PAIRED_DQ:
        # registers of the math warpgroups and the dQ warpgroup: 8 more at D = 128, and for the masked walks' bounds
        DQ_WG_REGS: gl.constexpr = (208, 72) if HEAD_DIM > 64 or WINDOW or DOCS or SPARSE else (200, 88)
        dq_out0 = (ds_smem, dq_smem, dq_acc_desc, b, h, (k_smem, ds_ready, ds_free, 0))
        dq_out1 = (ds_smem, dq_smem, dq_acc_desc, b, h, (k_smem, ds_ready, ds_free, 1))
        gl.warp_specialize(
            [
                (_consumer, ((k_smem.index(0), v_smem.index(0)), (kv_ready, ring, dq_out0, tiles, outs, consts),
                             start_n, CAUSAL, DROPOUT, WINDOW, DOCS, SPARSE)),
                (_consumer, ((k_smem.index(1), v_smem.index(1)), (kv_ready, ring, dq_out1, tiles, outs, consts),
                             start_n + KEYS, CAUSAL, DROPOUT, WINDOW, DOCS, SPARSE)),
                (_dq_warpgroup, ((kv_ready, ring, dq_out0, tiles, consts), start_n, CAUSAL, WINDOW, DOCS, SPARSE)),
                (_producer, ((q_desc, do_desc), ring, rows, walk, b, h, SPARSE)),
            ],
            [4, 4, 1],
            [DQ_WG_REGS[0], DQ_WG_REGS[1], 24],
        )  # fmt: skip
    elif CONSUMERS == 1:
        dq_out0 = (ds_smem.index(0), dq_smem.index(0), dq_acc_desc, b, h, 0)
        gl.warp_specialize(
            [
                (_consumer, ((k_smem.index(0), v_smem.index(0)), (kv_ready, ring, dq_out0, tiles, outs, consts),
                             start_n, CAUSAL, DROPOUT, WINDOW, DOCS, SPARSE)),
                (_producer, ((q_desc, do_desc), ring, rows, walk, b, h, SPARSE)),
            ],
            [1],
            [24],
        )  # fmt: skip
    else:
        dq_out0 = (ds_smem.index(0), dq_smem.index(0), dq_acc_desc, b, h, 0)
        dq_out1 = (ds_smem.index(1), dq_smem.index(1), dq_acc_desc, b, h, 0)
        gl.warp_specialize(
            [
                (_consumer, ((k_smem.index(0), v_smem.index(0)), (kv_ready, ring, dq_out0, tiles, outs, consts),
                             start_n, CAUSAL, DROPOUT, WINDOW, DOCS, SPARSE)),
                (_consumer, ((k_smem.index(1), v_smem.index(1)), (kv_ready, ring, dq_out1, tiles, outs, consts),
                             start_n + KEYS, CAUSAL, DROPOUT, WINDOW, DOCS, SPARSE)),
                (_producer, ((q_desc, do_desc), ring, rows, walk, b, h, SPARSE)),
            ],
            [4, 1],
            [232, 24],
        )  # fmt: skip
