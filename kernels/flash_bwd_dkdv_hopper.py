"""The split backward's dK/dV pass for Hopper, in Gluon: warp-specialised, with every product asynchronous.

Same math as `flash_bwd.py`'s dK/dV pass; one program per key tile walks the query tiles that see it:

    Sᵀ = K·Qᵀ,  Pᵀ = exp2(Sᵀ·scale·log2 e − LSE·log2 e),  dPᵀ = V·dOᵀ,
    dV += Pᵀ·dO,  dSᵀ = Pᵀ ∘ (dPᵀ − δ),  dK += dSᵀ·Q       (dK scaled by `scale` once, at the end)

What Triton's compiler does not express, and this pass does:
- **A producer warp** (`_producer`, 24 registers) owns a ring of STAGES buffers. It waits until a buffer is handed
  back, starts the TMA loads of a query tile's Q and dO into it, and stores the tile's LSE·log2 e and δ beside
  them (plain loads). It runs up to STAGES tiles ahead, so no load's latency is on the consumer's path.
- **CONSUMERS math warpgroups** (`_consumer`, one to three), each owning 64 keys of the program's BLOCK_N =
  64 · CONSUMERS: they share every Q/dO tile, which divides the loads per key, and each walks the query tiles
  that see its keys, issuing every product as an asynchronous warpgroup MMA and waiting for each only where its
  result is read. No CTA-wide barrier in the loop: a buffer's `ready` mbarrier says it is full, its `empty`
  mbarrier (one arrival per warpgroup) hands it back. Causal: a warpgroup hands back at once the program's first
  query tiles that none of its keys sees.

        issue Sᵀ_j, dPᵀ_j │ wait Sᵀ_j (dV_{j−1}, dK_{j−1} retire; their buffer goes back) │ Pᵀ_j ‖ dPᵀ_j runs
        issue dV_j        │ wait dPᵀ_j                                                    │ dSᵀ_j ‖ dV_j runs
        issue dK_j        │ next tile                                                     ‖ dV_j, dK_j run

  At D = 128, dK and dV hold 128 registers a thread, and with Sᵀ and dPᵀ in flight beside them a 64 × 64 step
  does not fit (ptxas serialises the products, C7512). There dPᵀ is issued late, after dV's product:

        issue Sᵀ_j        │ wait Sᵀ_j (dK_{j−1} retires; the buffer goes back)            │ Pᵀ_j
        issue dV_j, dPᵀ_j │ wait dPᵀ_j (and dV_j)                                         │ dSᵀ_j
        issue dK_j        │ next tile                                                     ‖ dK_j runs

  Each warpgroup then waits more, but two of them (a 128-key tile, FlashAttention-3's at this head dim) cover each
  other's waits. That ran the pass 1.07–1.29× faster than one warpgroup on 32 × 64 tiles
  (`results/tuning/h200-2026-11-27-dkdv-late-dp/`). At D = 64 the late schedule is 3–10% slower.

  Pᵀ and dSᵀ stay in registers as the left operand of their products. At D ≤ 64 so does K, loaded once: a 64-row
  step of Sᵀ = K·Qᵀ that reads both operands from shared memory is bound by shared-memory bandwidth (2–4% of the
  pass, `results/tuning/h200-2026-11-27-register-operands/`); at D = 128 the registers are not there (ptxas
  serialises the products, C7512). A warpgroup's first tile is peeled so that its products, not zeros written by
  the warps, start dK and dV: an accumulator written by ordinary instructions where paths merge with its product
  in flight makes ptxas serialise every product of the kernel (warning C7515).

Registers: one warpgroup is launched with maxnreg = 128 so that two programs share an SM, and the producer's
registers go to the consumer (232); two take 248 and 232 at maxnreg = 168 (one program an SM; at D = 128 ptxas
keeps 24 bytes of addresses on the stack across the walk, none inside it); three share an SM at 168, 160, 160.
BLOCK_M is a multiple of 32 (the producer's LSE/δ vector spans its 32 lanes; a dropout draw spans 32 queries).

Dropout: each warpgroup draws the keep-mask of its Sᵀ tile itself while Sᵀ's product runs (`gluon_dropout.py`:
the Triton passes' mask bit for bit, each thread drawing exactly the numbers of the elements it holds). At D = 128
that takes registers the 64 × 128 tile does not have (ptxas spills inside the walk), so the table runs 32 × 128
there; against the Triton dK/dV pass with dropout the pass ran 1.15–1.33× faster at D = 64 and 1.17–1.23× at
D = 128 (`results/tuning/h200-2026-11-27-dkdv-dropout/`).

Masks (causal): under a sliding window, documents or a block mask each warpgroup walks three runs of the program's
query tiles, masked, mask-free and masked (`query_runs`; under a block mask, positions of the key tile's kept-tile
list, `kept_query_runs`), and hands the tiles outside them back unread.

Dense or masked, bf16 or fp16, Tq ≤ Tk (causal: aligned to the bottom right), any T:
rows past T arrive as zeros with LSE = +inf, so their P is 0. The tensors must suit tensor descriptors
(`launch.hopper_launch_config` checks).
Gluon has no interpreter path: the CPU tests compile this pass for sm_90a (`tests/test_kernel_codegen.py`), and
`scripts/bench_attention.py` checks it against the reference on the GPU; same-process A/B and history:
`results/tuning/h200-2026-11-27-gluon-dkdv/`, `results/tuning/h200-2026-11-27-dkdv-consumers/`.
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

from .gluon_common import (
    LOG2E,
    kept_tile,
    load_head_tile,
    long_walks_first,
    lower_bound,
    mma_layout,
    store_head_tile,
    tile_and_head,
    tile_documents,
    tile_kept_list,
    tile_layout,
)
from .gluon_dropout import keep_mask_t


@gluon.jit
def query_ring(STAGES: gl.constexpr, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, dtype: gl.constexpr):
    """The ring `_producer` fills: (ready, empty) mbarriers (`init_ring`) and STAGES buffers of Q, dO (BLOCK_M, D),
    LSE·log2 e and δ (BLOCK_M)."""
    stats_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    return (
        gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
        gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
        gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], tile_layout(BLOCK_M, HEAD_DIM, dtype)),
        gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], tile_layout(BLOCK_M, HEAD_DIM, dtype)),
        gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], stats_layout),
        gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], stats_layout),
    )


@gluon.jit
def init_ring(ring, CONSUMERS: gl.constexpr):
    """A buffer is ready after its TMA bytes (the producer's expect) and its LSE/δ stores, and empty once each of
    the CONSUMERS math warpgroups has handed it back. The caller fences the inits."""
    STAGES: gl.constexpr = ring[2].shape[0]
    for i in gl.static_range(STAGES):
        mbarrier.init(ring[0].index(i), count=2)
        mbarrier.init(ring[1].index(i), count=CONSUMERS)


@gluon.jit
def _producer(descs, ring, rows, walk, b, h, SPARSE: gl.constexpr):
    """Fill the ring: the walk's query tile t's Q, dO (TMA), LSE·log2 e and δ (plain loads; rows past Tq get
    LSE = +inf, so P = 0, and δ = 0) into buffer t mod STAGES, once the consumer has handed that buffer back. walk
    = (lo, n_tiles, kept): the n_tiles tiles from row lo, or (SPARSE) those at positions p_lo … of the kept-tile
    list kept = (kept, n_kept, p_lo)."""
    lo, n_tiles, kept = walk
    q_desc, do_desc = descs
    ready, empty, q_ring, do_ring, lse_ring, delta_ring = ring
    lse_row, delta_row, seq_len_q = rows
    STAGES: gl.constexpr = q_ring.shape[0]
    BLOCK_M: gl.constexpr = q_ring.shape[1]
    vec: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    for tile in range(n_tiles):
        slot = tile % STAGES
        mbarrier.wait(empty.index(slot), ((tile // STAGES) & 1) ^ 1)  # a fresh barrier reads as handed back
        start_m = query_start(tile, lo, kept, BLOCK_M, SPARSE)
        bar = ready.index(slot)
        mbarrier.expect(bar, 2 * q_desc.block_type.nbytes)
        load_head_tile(q_desc, b, h, start_m, bar, q_ring.index(slot))
        load_head_tile(do_desc, b, h, start_m, bar, do_ring.index(slot))
        offs_m = start_m + gl.arange(0, BLOCK_M, layout=vec)
        row_ok = offs_m < seq_len_q
        lse_ring.index(slot).store(gl.load(lse_row + offs_m, mask=row_ok, other=float("inf")) * LOG2E)
        delta_ring.index(slot).store(gl.load(delta_row + offs_m, mask=row_ok, other=0.0))
        mbarrier.arrive(bar, count=1)


@gluon.jit
def _dkdv_step(
    dk,
    dv,
    tile,
    kv,
    ring,
    lo,
    keys,
    consts,
    MASKED: gl.constexpr,
    FIRST: gl.constexpr,
    LATE_DP: gl.constexpr,
    DROPOUT: gl.constexpr,
    WINDOW: gl.constexpr,
    DOCS: gl.constexpr,
    SPARSE: gl.constexpr,
):
    """One query tile's share of (dK, dV) (SPARSE: the walk's tile `tile` is a position in the kept-tile list),
    both still in flight when it returns. MASKED: the tile crosses the
    causal diagonal, (WINDOW) the upper edge of a causal sliding window or (DOCS) a document's edge. FIRST: the
    warpgroup's first tile, whose products start dK and dV. LATE_DP: dPᵀ is issued after dV's product rather than
    with Sᵀ, so that Sᵀ and dPᵀ are never in flight together (the second schedule in the module docstring).
    DROPOUT: with keep-mask Z and keep-scale c, dV += (Z ∘ Pᵀ)·dO (c applied once, at the end) and
    dSᵀ = Pᵀ ∘ (c·Z ∘ dPᵀ − δ); the mask is drawn while Sᵀ's product runs."""
    start_n, kept = keys[0], keys[3]
    qk_scale, rng, dropout_scale, seq_len_k = consts[1], consts[2], consts[3], consts[4]
    k_op, v_op = kv
    ready, empty, q_ring, do_ring, lse_ring, delta_ring = ring
    start_m = query_start(tile, lo, kept, q_ring.shape[1], SPARSE)
    STAGES: gl.constexpr = q_ring.shape[0]
    BLOCK_M: gl.constexpr = q_ring.shape[1]
    HEAD_DIM: gl.constexpr = q_ring.shape[2]
    BLOCK_N: gl.constexpr = k_op.shape[0]
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
    sT = warpgroup_mma(k_op, q_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
    if not LATE_DP:
        dpT = warpgroup_mma(v_op, do_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
    lse2 = lse_ring.index(slot).load(row_layout)
    delta = delta_ring.index(slot).load(row_layout)
    if DROPOUT:
        keep = keep_mask_t(rng, start_m, start_n, seq_len_k, BLOCK_N, BLOCK_M)
    if LATE_DP:
        if FIRST:
            sT = warpgroup_mma_wait(num_outstanding=0, deps=(sT,))
        else:
            sT, dk = warpgroup_mma_wait(num_outstanding=0, deps=(sT, dk))
            mbarrier.arrive(empty.index((tile - 1) % STAGES), count=1)
    else:
        if FIRST:
            sT = warpgroup_mma_wait(num_outstanding=1, deps=(sT,))
        else:
            # Retires the previous tile's dV and dK products with Sᵀ: their buffer goes back to the producer.
            sT, dk, dv = warpgroup_mma_wait(num_outstanding=1, deps=(sT, dk, dv))
            mbarrier.arrive(empty.index((tile - 1) % STAGES), count=1)

    pT = gl.exp2(sT * qk_scale - lse2[None, :])
    if MASKED:
        pT = hide_unseen(pT, start_m, tile, keys, consts, WINDOW, DOCS, SPARSE)
    pdT = gl.where(keep, pT, 0.0) if DROPOUT else pT
    dv = warpgroup_mma(gl.convert_layout(pdT.to(dtype), p_layout), do_tile, dv, use_acc=not FIRST, is_async=True)
    if LATE_DP:
        dpT = warpgroup_mma(v_op, do_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
        dpT, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dpT, dv))
    else:
        dpT = warpgroup_mma_wait(num_outstanding=1, deps=(dpT,))
    if DROPOUT:
        dsT = pT * gl.where(keep, dpT * dropout_scale - delta[None, :], -delta[None, :])
    else:
        dsT = pT * (dpT - delta[None, :])
    dk = warpgroup_mma(gl.convert_layout(dsT.to(dtype), p_layout), q_tile, dk, use_acc=not FIRST, is_async=True)
    return dk, dv


@gluon.jit
def hide_unseen(pT, start_m, tile, keys, consts, WINDOW: gl.constexpr, DOCS: gl.constexpr, SPARSE: gl.constexpr):
    """Pᵀ of keys keys = (start_n, offs_n, key_ids, kept, valid) and the query tile at start_m (the walk's tile
    `tile`), with the pairs the masks hide set to 0: causal (query i at position i + shift sees keys up to it;
    consts = (shift, …, seq_len_k, window_size, docs, …)), (WINDOW) the last window_size keys only, (DOCS) the keys
    of its own document (key_ids: the keys' documents), and (SPARSE) no pair at positions outside the warpgroup's
    runs valid = (first, end) (a walk with no kept tile)."""
    offs_n, key_ids, valid = keys[1], keys[2], keys[4]
    shift, seq_len_k, window_size, docs = consts[0], consts[4], consts[5], consts[6]
    BLOCK_M: gl.constexpr = pT.shape[1]
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, pT.type.layout))
    seen = (offs_m + shift)[None, :] >= offs_n[:, None]
    if WINDOW:
        seen = seen & ((offs_m + shift)[None, :] < offs_n[:, None] + window_size)
    if DOCS:
        query_ids = gl.load(docs + gl.minimum(offs_m + shift, seq_len_k - 1))
        seen = seen & (query_ids[None, :] == key_ids[:, None])
    if SPARSE:
        seen = seen & (tile >= valid[0]) & (tile < valid[1])
    return gl.where(seen, pT, 0.0)


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
    """One warpgroup's 64 keys: walk the query tiles that see them, then write their dK (times the softmax scale)
    and dV (times the dropout keep-scale). Under a causal sliding window (WINDOW), documents (DOCS) or a block mask
    (SPARSE: the walk goes through the kept-tile list) the walk takes the runs of `query_runs`, and hands the
    program's later tiles back unread."""
    kv_ready, ring, tiles, outs, consts = shared
    k_smem, v_smem = kv
    lo, n_tiles, kept = tiles[0], tiles[1], tiles[3]
    HEAD_DIM: gl.constexpr = k_smem.shape[1]
    BLOCK_N: gl.constexpr = k_smem.shape[0]
    BLOCK_M: gl.constexpr = ring[2].shape[1]
    s_layout: gl.constexpr = mma_layout(gl.num_warps(), BLOCK_M)
    acc_layout: gl.constexpr = mma_layout(gl.num_warps(), HEAD_DIM)
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    mine, masked_end, full_end, seen_end, valid = consumer_runs(start_n, tiles, consts, ring, BLOCK_N, CAUSAL,
                                                                WINDOW, DOCS, SPARSE)  # fmt: skip
    zeros = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(kv_ready, 0)
    if HEAD_DIM <= 64:  # K as Sᵀ's left operand from registers: the product then reads only Qᵀ from shared memory
        kv = (k_smem.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)), v_smem)
    LATE_DP: gl.constexpr = HEAD_DIM > 64  # dK and dV take 128 registers a thread: Sᵀ and dPᵀ take turns
    key_ids = gl.load(consts[6] + gl.minimum(offs_n, consts[4] - 1)) if DOCS else offs_n  # the keys' documents
    keys = (start_n, offs_n, key_ids, kept, valid)
    dk, dv = _dkdv_step(
        zeros, zeros, mine, kv, ring, lo, keys, consts, CAUSAL, True, LATE_DP, DROPOUT, WINDOW, DOCS, SPARSE
    )
    for tile in range(mine + 1, masked_end):
        dk, dv = _dkdv_step(
            dk, dv, tile, kv, ring, lo, keys, consts, True, False, LATE_DP, DROPOUT, WINDOW, DOCS, SPARSE
        )
    if WINDOW or DOCS or SPARSE:
        for tile in range(masked_end, full_end):
            dk, dv = _dkdv_step(
                dk, dv, tile, kv, ring, lo, keys, consts, False, False, LATE_DP, DROPOUT, WINDOW, DOCS, SPARSE
            )
        for tile in range(full_end, seen_end):
            dk, dv = _dkdv_step(
                dk, dv, tile, kv, ring, lo, keys, consts, True, False, LATE_DP, DROPOUT, WINDOW, DOCS, SPARSE
            )
        dk, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv))
        mbarrier.arrive(ring[1].index((seen_end - 1) % ring[2].shape[0]), count=1)  # the last tile read
        hand_back(ring, seen_end, n_tiles)
    else:
        for tile in range(masked_end, n_tiles):
            dk, dv = _dkdv_step(
                dk, dv, tile, kv, ring, lo, keys, consts, False, False, LATE_DP, DROPOUT, WINDOW, DOCS, SPARSE
            )
        dk, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv))
    if DROPOUT:
        dv = dv * consts[3]
    store_dk_dv(dk, dv, (k_smem, v_smem), outs, start_n)


@gluon.jit
def consumer_runs(
    start_n,
    tiles,
    consts,
    ring,
    BLOCK_N: gl.constexpr,
    CAUSAL: gl.constexpr,
    WINDOW: gl.constexpr,
    DOCS: gl.constexpr,
    SPARSE: gl.constexpr,
):
    """The walk of the warpgroup whose BLOCK_N keys start at start_n over the program's query tiles
    tiles = (lo, n_tiles, hi, kept), counted from lo: (mine, masked_end, full_end, seen_end, valid). Tiles
    [mine, masked_end) are masked, then (under a window, documents or a block mask) [masked_end, full_end) seen
    whole and [full_end, seen_end) masked again (`query_runs`; SPARSE: positions in the kept-tile list, of which
    the warpgroup's runs hold valid = (first, end), `kept_query_runs`); dense, the rest is mask-free up to n_tiles
    (`skip_unseen_tiles`). The tiles before mine are handed back unread here."""
    lo, n_tiles, kept = tiles[0], tiles[1], tiles[3]
    BLOCK_M: gl.constexpr = ring[2].shape[1]
    valid = (0, 0)
    if WINDOW or DOCS or SPARSE:
        runs = query_runs(start_n, tiles, consts, BLOCK_M, BLOCK_N, WINDOW, DOCS)
        if SPARSE:
            runs, valid = kept_query_runs(runs, kept, lo // BLOCK_M, n_tiles)
        mine, masked_end, full_end, seen_end = runs
        hand_back(ring, 0, mine)
    else:
        mine, masked_end = skip_unseen_tiles(start_n, tiles, consts[0], ring, BLOCK_N, CAUSAL)
        full_end = n_tiles
        seen_end = n_tiles
    return mine, masked_end, full_end, seen_end, valid


@gluon.jit
def skip_unseen_tiles(start_n, tiles, shift, ring, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """`seen_tiles`, and the tiles below `mine` handed back unread."""
    mine, masked_end = seen_tiles(start_n, tiles, shift, ring[2].shape[1], BLOCK_N, CAUSAL)
    hand_back(ring, 0, mine)
    return mine, masked_end


@gluon.jit
def seen_tiles(start_n, tiles, shift, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """(mine, masked_end) of the BLOCK_N keys at start_n, among the program's query tiles tiles = (lo, n_tiles, hi),
    counted from lo in steps of BLOCK_M: those below `mine` see none of the keys, those from `mine` to `masked_end`
    cross their diagonal (causal: shift = Tk − Tq). Keys past Tk (a ragged last tile) keep the last query tile,
    masked, so that a walk's peeled first step always has one."""
    lo, hi = tiles[0], tiles[2]
    first, free = lo, lo
    if CAUSAL:
        first = gl.minimum(gl.maximum(start_n - shift, 0) // BLOCK_M * BLOCK_M, hi - BLOCK_M)
        free = gl.minimum(gl.cdiv(gl.maximum(start_n + BLOCK_N - 1 - shift, 0), BLOCK_M) * BLOCK_M, hi)
    mine = (first - lo) // BLOCK_M
    return mine, gl.maximum((free - lo) // BLOCK_M, mine + 1)


@gluon.jit
def query_runs(start_n, tiles, consts, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, WINDOW: gl.constexpr,
               DOCS: gl.constexpr):  # fmt: skip
    """The walk of the warpgroup whose BLOCK_N keys start at start_n, causal, under a sliding window (query i sees
    key j if j ≤ i + shift < j + W) and/or documents (consts' doc_range: the program's query ranges, `load_range`),
    over the program's query tiles tiles = (lo, n_tiles, hi), counted from lo: (mine, a, b, seen_end), tiles
    [mine, a) masked, [a, b) seen whole by every key, [b, seen_end) masked; none before mine or from seen_end on
    sees any of the keys. Keys past Tk (a ragged last tile) keep the last query tile, masked, so that the walk's
    peeled first step always has one (`tile_ranges.query_range`, `intersect_ranges`)."""
    lo, hi = tiles[0], tiles[2]
    n_tiles = (hi - lo) // BLOCK_M
    shift = consts[0]
    last_key = start_n + BLOCK_N - 1
    seen_lo = gl.maximum(start_n - shift, 0)
    full_lo = gl.maximum(last_key - shift, 0)
    seen_hi = hi
    full_hi = hi
    if WINDOW:
        window_size = consts[5]
        seen_hi = gl.minimum(seen_hi, last_key - shift + window_size)
        full_hi = gl.minimum(full_hi, start_n - shift + window_size)
    if DOCS:
        doc_lo, doc_hi, doc_full_lo, doc_full_hi = consts[7]
        seen_lo = gl.maximum(seen_lo, doc_lo)
        seen_hi = gl.minimum(seen_hi, doc_hi)
        full_lo = gl.maximum(full_lo, doc_full_lo)
        full_hi = gl.minimum(full_hi, doc_full_hi)
    mine = gl.minimum(gl.maximum(seen_lo - lo, 0) // BLOCK_M, n_tiles - 1)
    seen_end = gl.minimum(gl.maximum(gl.cdiv(gl.maximum(seen_hi - lo, 0), BLOCK_M), mine + 1), n_tiles)
    a = gl.minimum(gl.maximum(gl.cdiv(gl.maximum(full_lo - lo, 0), BLOCK_M), mine + 1), seen_end)
    b = gl.minimum(gl.maximum(gl.maximum(full_hi - lo, 0) // BLOCK_M, a), seen_end)
    return mine, a, b, seen_end


@gluon.jit
def kept_query_runs(runs, kept, first_tile, n_walk):
    """A warpgroup's runs (`query_runs`, query tiles counted from first_tile) as positions of the walk through the
    kept-tile list kept = (kept, n_kept, p_lo) (position 0 of the walk: p_lo of the list), n_walk positions long;
    and (first, end), the positions the warpgroup's runs hold: with none, its walk keeps one step there, masked
    whole."""
    kept_ptr, n_kept, p_lo = kept
    mine, a, b, seen_end = runs
    first = lower_bound(kept_ptr, n_kept, first_tile + mine) - p_lo
    a = lower_bound(kept_ptr, n_kept, first_tile + a) - p_lo
    b = lower_bound(kept_ptr, n_kept, first_tile + b) - p_lo
    end = lower_bound(kept_ptr, n_kept, first_tile + seen_end) - p_lo
    mine = gl.minimum(first, n_walk - 1)
    seen_end = gl.minimum(gl.maximum(end, mine + 1), n_walk)
    a = gl.minimum(gl.maximum(a, mine + 1), seen_end)
    return (mine, a, gl.minimum(gl.maximum(b, a), seen_end), seen_end), (first, end)


@gluon.jit
def query_start(tile, lo, kept, BLOCK_M: gl.constexpr, SPARSE: gl.constexpr):
    """The first query row of the walk's tile `tile`: lo + tile · BLOCK_M, or (SPARSE) that of the tile at position
    p_lo + tile of the kept-tile list kept = (kept, n_kept, p_lo)."""
    if SPARSE:
        return kept_tile(kept[0], kept[1], kept[2] + tile) * BLOCK_M
    return lo + tile * BLOCK_M


@gluon.jit
def hand_back(ring, start, end):
    """Hand back the program's query tiles [start, end) unread, each once it has landed (so that its arrival counts
    for that fill), for the other warpgroups of the program and the producer that refills them."""
    STAGES: gl.constexpr = ring[2].shape[0]
    for tile in range(start, end):
        mbarrier.wait(ring[0].index(tile % STAGES), (tile // STAGES) & 1)
        mbarrier.arrive(ring[1].index(tile % STAGES), count=1)


@gluon.jit
def store_dk_dv(dk, dv, kv, outs, start_n):
    """dK (times the softmax scale) and dV of the keys at start_n, by TMA stores through K's and V's buffers
    kv = (k_smem, v_smem), free once every product that read them has retired; rows past Tk are clipped by the
    descriptors outs = (dk_desc, dv_desc, b, h, softmax_scale)."""
    k_smem, v_smem = kv
    dk_desc, dv_desc, b, h, softmax_scale = outs
    k_smem.store((dk * softmax_scale).to(k_smem.dtype))
    v_smem.store(dv.to(v_smem.dtype))
    fence_async_shared()
    store_head_tile(dk_desc, b, h, start_n, k_smem)
    store_head_tile(dv_desc, b, h, start_n, v_smem)
    tma.store_wait(0)


@gluon.jit
def key_tile_walk(
    tile,
    b,
    h,
    shift,
    seq_len_q,
    masks,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    CAUSAL: gl.constexpr,
    WINDOW: gl.constexpr,
):
    """The query tiles the program of key tile `tile` (BLOCK_N keys) of head (b, h) walks, for the passes whose
    programs own keys: (lo, n_tiles, hi, kept, docs, doc_range). Query rows [lo, hi), in n_tiles tiles of BLOCK_M,
    see some key of the program (causal: shift = Tk − Tq aligns them to the bottom right); under a sliding window
    and documents (masks = (window_size, documents, blocks) as `gluon_common.masked_query_tile` takes them, their
    schedules for this tiling) only those that may; under a block mask (its kept query tiles per key tile) the walk
    goes through the kept tiles from lo to hi, n_tiles positions of the list kept = (kept, n_kept, p_lo) from p_lo
    ((0, 0, 0) without). docs: the batch's document ids (0 without); doc_range: the tile's ranges (`load_range`; 0
    without)."""
    window_size, documents, blocks = masks
    DOCS: gl.constexpr = documents[0] is not None
    SPARSE: gl.constexpr = blocks[0] is not None
    start_n = tile * BLOCK_N
    hi = gl.cdiv(seq_len_q, BLOCK_M) * BLOCK_M
    docs, doc_range = tile_documents(documents, b, tile)
    if WINDOW or DOCS or SPARSE:  # the walk keeps at least one tile
        seen_lo = gl.maximum(start_n - shift, 0)
        seen_hi = hi
        if WINDOW:  # queries from start_n + BLOCK_N − 1 − shift + W on see none of the keys
            seen_hi = gl.minimum(seen_hi, start_n + BLOCK_N - 1 - shift + window_size)
        if DOCS:
            seen_lo = gl.maximum(seen_lo, doc_range[0])
            seen_hi = gl.minimum(seen_hi, doc_range[1])
        lo = gl.minimum(seen_lo // BLOCK_M * BLOCK_M, hi - BLOCK_M)
        hi = gl.maximum(gl.cdiv(gl.maximum(seen_hi, 0), BLOCK_M) * BLOCK_M, lo + BLOCK_M)
    else:
        lo = gl.maximum(start_n - shift, 0) // BLOCK_M * BLOCK_M if CAUSAL else 0
    n_tiles = (hi - lo) // BLOCK_M
    if SPARSE:
        kept_ptr, n_kept = tile_kept_list(blocks, h, tile)
        p_lo = lower_bound(kept_ptr, n_kept, lo // BLOCK_M)
        n_tiles = gl.maximum(lower_bound(kept_ptr, n_kept, hi // BLOCK_M) - p_lo, 1)
        kept = (kept_ptr, n_kept, p_lo)
    else:
        kept = (0, 0, 0)
    return lo, n_tiles, hi, kept, docs, doc_range


@gluon.jit(do_not_specialize=["seed", "offset_lo", "offset_hi", "dropout_threshold"])
def flash_bwd_dkdv_hopper_kernel(
    q_desc,
    k_desc,
    v_desc,
    do_desc,
    LSE,
    Delta,
    dk_desc,
    dv_desc,
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
    CAUSAL: gl.constexpr,
    WINDOW: gl.constexpr,
    HEADS_FASTEST: gl.constexpr,
    DROPOUT: gl.constexpr,
):
    """dK, dV (B, H, Tk, D) of a key tile (64 · CONSUMERS keys) of a head (`tile_and_head`), from Q, dO
    (B, H, Tq, D), K and V (B, H, Tk, D), the forward's LSE and δ = rowsum(dO ∘ O) − dlse (B·H·Tq fp32 each, as the
    dQ pass leaves them). Q and dO arrive as descriptors in tiles of (1, 1, BLOCK_M, D), K and V in tiles of
    (1, 1, 64, D), and dK and dV leave through descriptors of K's tiles, all made on the host
    (`launch.launch_dkdv_hopper`). With CAUSAL, two more masks (as in `flash_fwd_hopper.py`): WINDOW, a sliding
    window of window_size keys, documents (DocIds with its schedule DocRanges, for this tiling: per key tile, the
    query ranges) and blocks (a block mask's kept query tiles per key tile, KeptIndex with KeptCount), and
    WalkOrder the order the key tiles' programs start in (`long_walks_first`)."""
    DOCS: gl.constexpr = documents[0] is not None
    SPARSE: gl.constexpr = blocks[0] is not None
    dtype: gl.constexpr = q_desc.dtype
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    KEYS: gl.constexpr = k_desc.block_type.shape[2]  # a warpgroup's
    BLOCK_N: gl.constexpr = KEYS * CONSUMERS
    gl.static_assert(CONSUMERS <= 3, "one to three math warpgroups")
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
    qk_scale = softmax_scale * LOG2E
    rng = (seed, offset_lo, offset_hi, bh, dropout_threshold)  # this head's dropout stream (`gluon_dropout.py`)
    consts = (shift, qk_scale, rng, dropout_scale, seq_len_k, window_size, docs, doc_range)
    # Constexprs go into each partition's argument tuple directly: a tuple assigned to a name first turns them into
    # run-time values, and their branches into run-time branches.
    shared = (kv_ready, ring, (lo, n_tiles, hi, kept), outs, consts)
    walk = (lo, n_tiles, kept)  # the producer's
    if CONSUMERS == 1:
        gl.warp_specialize(
            [
                (
                    _consumer,
                    ((k_smem.index(0), v_smem.index(0)), shared, start_n, CAUSAL, DROPOUT, WINDOW, DOCS, SPARSE),
                ),
                (_producer, ((q_desc, do_desc), ring, rows, walk, b, h, SPARSE)),
            ],
            [1],
            [24],
        )
    elif CONSUMERS == 2:
        gl.warp_specialize(
            [
                (
                    _consumer,
                    ((k_smem.index(0), v_smem.index(0)), shared, start_n, CAUSAL, DROPOUT, WINDOW, DOCS, SPARSE),
                ),
                (
                    _consumer,
                    ((k_smem.index(1), v_smem.index(1)), shared, start_n + KEYS, CAUSAL, DROPOUT, WINDOW, DOCS, SPARSE),
                ),
                (_producer, ((q_desc, do_desc), ring, rows, walk, b, h, SPARSE)),
            ],
            [4, 1],
            [232, 24],
        )
    else:
        gl.warp_specialize(
            [
                (
                    _consumer,
                    ((k_smem.index(0), v_smem.index(0)), shared, start_n, CAUSAL, DROPOUT, WINDOW, DOCS, SPARSE),
                ),
                (
                    _consumer,
                    ((k_smem.index(1), v_smem.index(1)), shared, start_n + KEYS, CAUSAL, DROPOUT, WINDOW, DOCS, SPARSE),
                ),
                (
                    _consumer,
                    (
                        (k_smem.index(2), v_smem.index(2)),
                        shared,
                        start_n + 2 * KEYS,
                        CAUSAL,
                        DROPOUT,
                        WINDOW,
                        DOCS,
                        SPARSE,
                    ),
                ),
                (_producer, ((q_desc, do_desc), ring, rows, walk, b, h, SPARSE)),
            ],
            [4, 4, 1],
            [160, 160, 24],
        )
