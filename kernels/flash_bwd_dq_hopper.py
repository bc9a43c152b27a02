"""The split backward's dQ pass for Hopper, in Gluon: warp-specialised, with every product asynchronous.

Same math as `flash_bwd.py`'s dQ pass; one program per query tile walks the key tiles it sees, and while its first
products run computes its rows' δ = rowsum(dO ∘ O) − dlse (stored for the dK/dV pass, which runs next):

    S = Q·Kᵀ,  P = exp2(S·scale·log2 e − LSE·log2 e),  dP = dO·Vᵀ,  dS = P ∘ (dP − δ),  dQ += dS·K
    (dQ scaled by `scale` once, at the end)

As in `flash_bwd_dkdv_hopper.py`, the mirror image of this pass:
- **A producer warp** (`_producer`, 24 registers) owns a ring of STAGES buffers of K and V tiles, filled by TMA
  as soon as the consumer hands a buffer back.
- **The consumer warpgroup** (`_consumer`) issues every product as an asynchronous warpgroup MMA and waits for each
  only where its result is read, with no CTA-wide barrier in its loop:

        issue S_j, dP_j │ wait S_j (dQ_{j−1} retires; its K/V buffer goes back) │ P_j ‖ dP_j runs
        wait dP_j       │ dS_j                                                   │
        issue dQ_j      │ next tile                                              ‖ dQ_j runs

  Q and dO stay in shared memory for the whole walk; dS stays in registers as the left operand of its product.
- Key tiles are walked from the causal diagonal down, so that the tiles that pay for the mask come first and the
  first one, peeled, starts dQ with its product rather than with zeros written by the warps (which makes ptxas
  serialise every product of the kernel: warning C7515).

Dropout: the consumer draws the keep-mask of its tile while S's and dP's products run. The draws are made
key-major, where each thread draws the numbers of its elements, and the decisions reach this query-major tile
through shared memory (`gluon_dropout.keep_mask`). Against the Triton dQ pass with dropout the pass ran 1.10–1.30×
faster at D = 128, and 0.98–1.05× at D = 64, where the table takes it only at 2K and 4K
(`results/tuning/h200-2026-11-27-dq-dropout/`).

Launched with maxnreg = 128 so that two programs share an SM; the producer's registers go to the consumer (232).
BLOCK_M is a multiple of 16 × num_warps (of 32 with dropout: a draw spans 32 queries). Dense, or causal under a
sliding window, documents and a block mask, walked in masked, mask-free and masked runs as in
`flash_fwd_hopper.py` (from the top down). bf16 or fp16, Tq ≤ Tk (causal: aligned to the bottom right), any T: key
rows past Tk arrive as zeros and are masked; query rows past Tq are computed with LSE = +inf (P = 0) and not
stored. The tensors must suit tensor descriptors (`launch.hopper_launch_config` checks). Gluon has no interpreter
path: the CPU tests compile this pass for sm_90a (`tests/test_kernel_codegen.py`), and
`scripts/bench_attention.py` checks it against the reference on the GPU.
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
from triton.runtime.jit import constexpr_function

from .gluon_common import (
    LOG2E,
    kept_tile,
    key_tiles,
    load_head_tile,
    masked_query_tile,
    mma_layout,
    query_tile_program,
    store_head_tile,
    tile_layout,
)
from .gluon_dropout import keep_mask


@constexpr_function
def _rows_layout(num_warps, head_dim):
    """A plain layout of a (rows, head_dim) tile for δ's loads: 8 contiguous elements a thread."""
    lanes_d = min(head_dim // 8, 32)
    return gl.BlockedLayout([1, 8], [32 // lanes_d, lanes_d], [num_warps, 1], [1, 0])


@gluon.jit
def _producer(descs, ring, tiles, b, h, SPARSE: gl.constexpr):
    """Fill the ring: the walk's tile t, key tile t_hi − 1 − t (counted down from the diagonal; SPARSE: the tile at
    that position of the kept-tile list kept[0:n_kept]), into buffer t mod STAGES, once the consumer has handed
    that buffer back, for the n_tiles tiles below t_hi (tiles = (n_tiles, t_hi, kept, n_kept))."""
    k_desc, v_desc = descs
    ready, empty, k_ring, v_ring = ring
    n_tiles, t_hi, kept, n_kept = tiles
    STAGES: gl.constexpr = k_ring.shape[0]
    BLOCK_N: gl.constexpr = k_ring.shape[1]
    for tile in range(n_tiles):
        slot = tile % STAGES
        mbarrier.wait(empty.index(slot), ((tile // STAGES) & 1) ^ 1)  # a fresh barrier reads as handed back
        start_n = (kept_tile(kept, n_kept, t_hi - 1 - tile) if SPARSE else t_hi - 1 - tile) * BLOCK_N
        bar = ready.index(slot)
        mbarrier.expect(bar, 2 * k_desc.block_type.nbytes)
        load_head_tile(k_desc, b, h, start_n, bar, k_ring.index(slot))
        load_head_tile(v_desc, b, h, start_n, bar, v_ring.index(slot))


@gluon.jit
def _issue_products(tile, qdo, ring):
    """Issue S = Q·Kᵀ and dP = dO·Vᵀ of key tile `tile` once its buffer is full."""
    q_smem, do_smem = qdo
    ready, k_ring, v_ring = ring[0], ring[2], ring[3]
    STAGES: gl.constexpr = k_ring.shape[0]
    BLOCK_N: gl.constexpr = k_ring.shape[1]
    BLOCK_M: gl.constexpr = q_smem.shape[0]
    s_layout: gl.constexpr = mma_layout(gl.num_warps(), BLOCK_N)
    slot = tile % STAGES
    mbarrier.wait(ready.index(slot), (tile // STAGES) & 1)
    zeros = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    s = warpgroup_mma(q_smem, k_ring.index(slot).permute((1, 0)), zeros, use_acc=False, is_async=True)
    dp = warpgroup_mma(do_smem, v_ring.index(slot).permute((1, 0)), zeros, use_acc=False, is_async=True)
    return s, dp


@gluon.jit
def _dq_step(
    dq,
    s,
    dp,
    tile,
    ring,
    rows,
    t_hi,
    scales,
    CAUSAL: gl.constexpr,
    MASKED: gl.constexpr,
    FIRST: gl.constexpr,
    WINDOW: gl.constexpr,
    DOCS: gl.constexpr,
    SPARSE: gl.constexpr,
    DROPOUT: gl.constexpr,
):
    """The walk's tile `tile` (key tile t_hi − 1 − tile; SPARSE: the tile at that position of the kept-tile list,
    and positions below the walk's runs masked whole)'s share of dQ, from its S and dP in flight
    (`_issue_products`); still in flight when it returns. MASKED: the tile crosses the causal diagonal, the end of
    the keys, (WINDOW) the lower edge of a causal sliding window or (DOCS) a document's edge. FIRST: the program's
    first tile, whose product starts dQ. DROPOUT: with keep-mask Z and keep-scale c, dS = P ∘ (c·Z ∘ dP − δ); the
    mask is drawn while S's and dP's products run."""
    empty, k_ring = ring[1], ring[2]
    start_m, offs_m, lse2, delta, shift, seq_len_k, window_size, docs, row_ids, kept, n_kept, walk_lo = rows
    qk_scale, rng, dropout_scale = scales
    STAGES: gl.constexpr = k_ring.shape[0]
    BLOCK_N: gl.constexpr = k_ring.shape[1]
    HEAD_DIM: gl.constexpr = k_ring.shape[2]
    BLOCK_M: gl.constexpr = offs_m.shape[0]
    acc_layout: gl.constexpr = mma_layout(gl.num_warps(), HEAD_DIM)
    ds_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    start_n = (kept_tile(kept, n_kept, t_hi - 1 - tile) if SPARSE else t_hi - 1 - tile) * BLOCK_N
    if DROPOUT:
        keep = keep_mask(rng, start_m, start_n, seq_len_k, BLOCK_M, BLOCK_N)
    if FIRST:
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
    else:
        # Retires the previous tile's dQ product with S: its buffer goes back to the producer.
        s, dq = warpgroup_mma_wait(num_outstanding=1, deps=(s, dq))
        mbarrier.arrive(empty.index((tile - 1) % STAGES), count=1)

    p = gl.exp2(s * qk_scale - lse2[:, None])
    if MASKED:
        offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s.type.layout))
        # Causal: n ≤ m + shift implies n < Tk for every row that is stored.
        seen = offs_n[None, :] <= (offs_m + shift)[:, None] if CAUSAL else (offs_n < seq_len_k)[None, :]
        if WINDOW:
            seen = seen & (offs_n[None, :] > (offs_m + shift - window_size)[:, None])
        if DOCS:
            col_ids = gl.load(docs + offs_n, mask=offs_n < seq_len_k, other=0)
            seen = seen & (col_ids[None, :] == row_ids[:, None])
        if SPARSE:
            seen = seen & (t_hi - 1 - tile >= walk_lo)
        p = gl.where(seen, p, 0.0)
    dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp,))
    if DROPOUT:
        ds = p * gl.where(keep, dp * dropout_scale - delta[:, None], -delta[:, None])
    else:
        ds = p * (dp - delta[:, None])
    k_tile = k_ring.index(tile % STAGES)
    dq = warpgroup_mma(gl.convert_layout(ds.to(k_tile.dtype), ds_layout), k_tile, dq, use_acc=not FIRST, is_async=True)
    return dq


@gluon.jit
def _row_loads(heads, row_ptrs, offs_m, seq_len_q, HEAD_DIM: gl.constexpr):
    """The loads behind the rows' statistics (O, dO and LSE of rows offs_m; rows past Tq: 0 and +inf), issued
    before Q and dO arrive so that their latency overlaps that wait (`_row_stats` uses them)."""
    o_ptrs, do_ptrs, stride_ot, stride_dot = heads
    lse_row = row_ptrs[0]
    rows_layout: gl.constexpr = _rows_layout(gl.num_warps(), HEAD_DIM)
    m = gl.convert_layout(offs_m, gl.SliceLayout(1, rows_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, rows_layout))
    m_ok = m < seq_len_q
    o = gl.load(o_ptrs + m[:, None] * stride_ot + cols[None, :], mask=m_ok[:, None], other=0.0)
    do = gl.load(do_ptrs + m[:, None] * stride_dot + cols[None, :], mask=m_ok[:, None], other=0.0)
    lse = gl.load(lse_row + offs_m, mask=offs_m < seq_len_q, other=float("inf"))
    return o, do, lse


@gluon.jit
def _row_stats(loads, row_ptrs, offs_m, seq_len_q, HAS_DLSE: gl.constexpr):
    """LSE·log2 e and δ = rowsum(dO ∘ O) − dlse of rows offs_m from `_row_loads`; δ is also stored."""
    o, do, lse = loads
    dlse_row, delta_row = row_ptrs[1], row_ptrs[2]
    delta = gl.sum(o.to(gl.float32) * do.to(gl.float32), axis=1)
    m = gl.convert_layout(offs_m, delta.type.layout)
    if HAS_DLSE:  # a gradient dlse into the returned LSE adds dlse·P to dS: δ lowered by dlse
        delta -= gl.load(dlse_row + m, mask=m < seq_len_q, other=0.0)
    gl.store(delta_row + m, delta, mask=m < seq_len_q)
    return lse * LOG2E, gl.convert_layout(delta, offs_m.type.layout)


@gluon.jit
def _consumer(
    qdo,
    qdo_ready,
    ring,
    stats,
    walk,
    outs,
    start_m,
    scales,
    CAUSAL: gl.constexpr,
    HAS_DLSE: gl.constexpr,
    WINDOW: gl.constexpr,
    DOCS: gl.constexpr,
    SPARSE: gl.constexpr,
    DROPOUT: gl.constexpr,
):
    """The walk over this query tile's key tiles (SPARSE: positions of its kept-tile list kept = (kept, n_kept,
    walk_lo), the first position of the walk's runs), walked down from key tile t_hi − 1 in the runs of
    walk = (n_top, n_full_end, n_tiles, t_hi): the first n_top tiles cross the diagonal (or a document's end),
    those up to n_full_end are seen whole by every row and (WINDOW, DOCS) the rest cross the window's lower edge or
    a document's start; δ and LSE of its rows are computed during the first tile. Then dQ (times the softmax
    scale)."""
    q_smem = qdo[0]
    heads, row_ptrs, shift, seq_len_q, seq_len_k, window_size, docs, kept = stats
    n_masked, n_full_end, n_tiles, t_hi = walk
    dq_desc, b, h, softmax_scale = outs
    BLOCK_M: gl.constexpr = q_smem.shape[0]
    HEAD_DIM: gl.constexpr = q_smem.shape[1]
    BLOCK_N: gl.constexpr = ring[2].shape[1]
    s_layout: gl.constexpr = mma_layout(gl.num_warps(), BLOCK_N)
    acc_layout: gl.constexpr = mma_layout(gl.num_warps(), HEAD_DIM)
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    loads = _row_loads(heads, row_ptrs, offs_m, seq_len_q, HEAD_DIM)
    mbarrier.wait(qdo_ready, 0)
    # The first tile is peeled (see the module docstring: C7515); its products run while δ is summed.
    # Every query tile sees at least one key tile.
    s, dp = _issue_products(0, qdo, ring)
    lse2, delta = _row_stats(loads, row_ptrs, offs_m, seq_len_q, HAS_DLSE)
    row_ids = gl.load(docs + gl.minimum(offs_m + shift, seq_len_k - 1)) if DOCS else offs_m  # the rows' documents
    rows = (start_m, offs_m, lse2, delta, shift, seq_len_k, window_size, docs, row_ids, kept[0], kept[1], kept[2])
    zeros = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, acc_layout)
    dq = _dq_step(zeros, s, dp, 0, ring, rows, t_hi, scales, CAUSAL, True, True, WINDOW, DOCS, SPARSE, DROPOUT)
    for tile in range(1, n_masked):
        s, dp = _issue_products(tile, qdo, ring)
        dq = _dq_step(dq, s, dp, tile, ring, rows, t_hi, scales, CAUSAL, True, False, WINDOW, DOCS, SPARSE, DROPOUT)
    if WINDOW or DOCS or SPARSE:
        for tile in range(gl.maximum(n_masked, 1), n_full_end):
            s, dp = _issue_products(tile, qdo, ring)
            dq = _dq_step(
                dq, s, dp, tile, ring, rows, t_hi, scales, CAUSAL, False, False, WINDOW, DOCS, SPARSE, DROPOUT
            )
        for tile in range(gl.maximum(n_full_end, 1), n_tiles):
            s, dp = _issue_products(tile, qdo, ring)
            dq = _dq_step(dq, s, dp, tile, ring, rows, t_hi, scales, CAUSAL, True, False, WINDOW, DOCS, SPARSE, DROPOUT)
    else:
        for tile in range(gl.maximum(n_masked, 1), n_tiles):
            s, dp = _issue_products(tile, qdo, ring)
            dq = _dq_step(
                dq, s, dp, tile, ring, rows, t_hi, scales, CAUSAL, False, False, WINDOW, DOCS, SPARSE, DROPOUT
            )
    dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))

    # dQ leaves by one TMA store through Q's buffer, free now that every product that read it has retired; rows past
    # Tq are clipped by the descriptor.
    q_smem.store((dq * softmax_scale).to(q_smem.dtype))
    fence_async_shared()
    store_head_tile(dq_desc, b, h, start_m, q_smem)
    tma.store_wait(0)


@gluon.jit(do_not_specialize=["seed", "offset_lo", "offset_hi", "dropout_threshold"])
def flash_bwd_dq_hopper_kernel(
    q_desc,
    k_desc,
    v_desc,
    do_desc,
    DO,
    O,
    LSE,
    DLSE,
    Delta,
    dq_desc,
    do_strides,
    o_strides,
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
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
    WINDOW: gl.constexpr,
    HEADS_FASTEST: gl.constexpr,
    DROPOUT: gl.constexpr,
):
    """dQ (B, H, Tq, D) and δ (B·H·Tq fp32) of a query tile of a head (`query_tile_program`), from Q, dO, O
    (B, H, Tq, D), K, V (B, H, Tk, D), the forward's LSE and, if not None, its gradient DLSE (B·H·Tq fp32 each).
    Q, dO (tiles of BLOCK_M rows), K and V (BLOCK_N rows) arrive as descriptors made on the host, and dQ leaves
    through one of Q's tiles (`launch.launch_dq_hopper`); dO and O are also read through pointers, for δ. With
    CAUSAL, two more masks (as in `flash_fwd_hopper.py`): WINDOW, a sliding window of window_size keys, documents
    (DocIds with its schedule DocRanges for this tiling) and blocks (a block mask's kept key tiles per query tile,
    KeptIndex with KeptCount)."""
    DOCS: gl.constexpr = documents[0] is not None
    SPARSE: gl.constexpr = blocks[0] is not None
    dtype: gl.constexpr = q_desc.dtype
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    start_m, b, h, bh = query_tile_program(seq_len_q, n_heads, BLOCK_M, CAUSAL, HEADS_FASTEST)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], tile_layout(BLOCK_M, HEAD_DIM, dtype))
    do_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], tile_layout(BLOCK_M, HEAD_DIM, dtype))
    ring = (
        gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
        gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
        gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], tile_layout(BLOCK_N, HEAD_DIM, dtype)),
        gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], tile_layout(BLOCK_N, HEAD_DIM, dtype)),
    )
    qdo_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(qdo_ready, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ring[0].index(i), count=1)
        mbarrier.init(ring[1].index(i), count=1)
    fence_async_shared()

    masks = (window_size, documents, blocks)
    # Key tiles [b, t_hi) cross the diagonal or the end of the keys, [a, b) are seen whole by every row, and (under
    # a window or documents) [t_lo, a) cross its lower edge or a document's start.
    if WINDOW or DOCS or SPARSE:
        docs, kept, runs = masked_query_tile(start_m, b, h, seq_len_q, seq_len_k, masks, BLOCK_M, BLOCK_N, WINDOW)
        t_lo, a, b_full, t_hi = runs
        # A walk takes at least one step (`kept_tile`): with no kept tile, one masked whole.
        walk = (t_hi - b_full, t_hi - a, gl.maximum(t_hi - t_lo, 1), t_hi)
        walk_lo = t_lo
    else:
        docs = 0
        kept = (0, 0)
        n_tiles, n_full = key_tiles(start_m, seq_len_q, seq_len_k, BLOCK_M, BLOCK_N, CAUSAL)
        walk = (n_tiles - n_full, n_tiles, n_tiles, n_tiles)
        walk_lo = 0
    shift = seq_len_k - seq_len_q

    mbarrier.expect(qdo_ready, 2 * q_desc.block_type.nbytes)
    load_head_tile(q_desc, b, h, start_m, qdo_ready, q_smem)
    load_head_tile(do_desc, b, h, start_m, qdo_ready, do_smem)

    row_start = bh.to(gl.int64) * seq_len_q
    heads = (
        O + b.to(gl.int64) * o_strides[0] + h.to(gl.int64) * o_strides[1],
        DO + b.to(gl.int64) * do_strides[0] + h.to(gl.int64) * do_strides[1],
        o_strides[2],
        do_strides[2],
    )
    HAS_DLSE: gl.constexpr = DLSE is not None
    dlse_row = DLSE + row_start if HAS_DLSE else LSE + row_start  # LSE: a placeholder (a tuple cannot hold None)
    stats = (
        heads,
        (LSE + row_start, dlse_row, Delta + row_start),
        shift,
        seq_len_q,
        seq_len_k,
        window_size,
        docs,
        (kept[0], kept[1], walk_lo),
    )
    outs = (dq_desc, b, h, softmax_scale)
    rng = (seed, offset_lo, offset_hi, bh, dropout_threshold)  # this head's dropout stream (`gluon_dropout.py`)
    scales = (softmax_scale * LOG2E, rng, dropout_scale)
    gl.warp_specialize(
        [
            (
                _consumer,
                (
                    (q_smem, do_smem),
                    qdo_ready,
                    ring,
                    stats,
                    walk,
                    outs,
                    start_m,
                    scales,
                    CAUSAL,
                    HAS_DLSE,
                    WINDOW,
                    DOCS,
                    SPARSE,
                    DROPOUT,
                ),
            ),
            (_producer, ((k_desc, v_desc), ring, (walk[2], walk[3], kept[0], kept[1]), b, h, SPARSE)),
        ],
        [1],
        [24],
    )
