"""The forward for Hopper, in Gluon: warp-specialised, one to three math warpgroups a program, every product
asynchronous.

Same math as `flash_fwd.py` (base 2, log2 e folded into the scale):

    s = q·kᵀ,  m' = max(m, rowmax(s)·scale·log2 e),  p = exp2(s·scale·log2 e − m'),  α = exp2(m − m'),
    l' = α·l + rowsum(p),  acc' = α·acc + (Z ∘ p)·v;   at the end O = c·acc / l and LSE = (m + log2 l)·ln 2

with dropout's keep-mask Z and keep-scale c (Z = 1, c = 1 without): the normaliser l sums the probabilities
before dropout, as the backward passes expect.

- **A producer warp** (`_producer`, 24 registers) streams K and V tiles by TMA through a ring of STAGES buffers,
  K and V with a ready barrier each, so that S can start before V has landed.
- **CONSUMERS math warpgroups** (`_consumer`, one to three), each owning 64 query rows of the program's BLOCK_M =
  64 · CONSUMERS: they share every K/V tile, which divides the loads per query row, and the warp schedulers run one's
  softmax while another's products run. Each warpgroup issues S = Q·Kᵀ of a tile once its K lands, waits for it
  (which also retires the previous tile's p·v and hands that tile's buffer back), computes the softmax, rescales acc
  and issues acc += p·V with p in registers as the product's left operand, left in flight into the next step.
  (Issuing S of the next tile ahead of p·v, FlashAttention-3's intra-warpgroup overlap, measured slower:
  `results/tuning/h200-2026-11-27-gluon-fwd/`.)
- Key tiles are walked from key 0 up: the first is peeled (and masked), so that every row has seen a key before
  its running max is used and the in-flight accumulator never merges with registers the warps wrote (which makes
  ptxas serialise every product of the kernel: warning C7515); then the tiles every row sees whole, without
  masks; then the tiles crossing the causal diagonal or the end of the keys.
- **Masks** (causal): under a sliding window, documents or a block mask a program walks three runs of key tiles,
  masked, mask-free and masked (`gluon_common.masked_key_runs`): its causal range intersected with the window's,
  the documents' schedule ranges for its tile and, under a block mask, the tiles its kept-tile list holds (the runs
  as positions in that list, `gluon_common.kept_runs`). The first tile then need not hold a key every row sees,
  so masked steps keep the exponents of rows that have seen nothing at 0 (`_softmax`).
- O leaves by a TMA store from Q's buffer, whole lines at a time, where stores from the accumulator's registers
  would write 16-byte pieces of many rows.
- **Dropout** (DROPOUT): each math warpgroup draws its tile's keep-mask as the dQ pass does
  (`gluon_dropout.keep_mask`: drawn key-major, each thread the numbers of its own elements, and moved to this
  query-major layout through shared memory), bit for bit the mask every other pass draws, and drops from p before
  its product with V (after p's row sums have gone into l).

Tq ≤ Tk (causal: aligned to the bottom right), any T: key rows past Tk and query rows past Tq arrive as zeros from
the descriptors; the former are masked, the latter computed and not stored. bf16 or fp16; the tensors must suit
tensor descriptors (`launch.hopper_launch_config` checks). Gluon has no interpreter path: the CPU tests compile this
pass for sm_90a (`tests/test_kernel_codegen.py`), and `scripts/bench_attention.py` checks it on the GPU.
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
    key_tiles,
    load_head_tile,
    masked_query_tile,
    mma_layout,
    query_tile_program,
    store_head_tile,
    tile_layout,
)
from .gluon_dropout import keep_mask

LN2: gl.constexpr = gl.constexpr(0.6931471805599453)
ROWS: gl.constexpr = gl.constexpr(64)  # query rows a math warpgroup owns


@gluon.jit
def _producer(descs, ring, tiles, b, h, SPARSE: gl.constexpr):
    """Fill the ring: the walk's j-th key tile into buffer j mod STAGES, once every math warpgroup has handed that
    buffer back, for the walk tiles = (t_lo, t_hi, kept, n_kept): tiles t_lo … t_hi − 1, or (SPARSE) the tiles at
    those positions of the kept-tile list kept[0:n_kept]."""
    k_desc, v_desc = descs
    k_ready, v_ready, empty, k_ring, v_ring = ring
    t_lo, t_hi, kept, n_kept = tiles
    STAGES: gl.constexpr = k_ring.shape[0]
    BLOCK_N: gl.constexpr = k_ring.shape[1]
    for j in range(t_hi - t_lo):
        slot = j % STAGES
        mbarrier.wait(empty.index(slot), ((j // STAGES) & 1) ^ 1)  # a fresh barrier reads as handed back
        start_n = (kept_tile(kept, n_kept, t_lo + j) if SPARSE else t_lo + j) * BLOCK_N
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        load_head_tile(k_desc, b, h, start_n, k_ready.index(slot), k_ring.index(slot))
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        load_head_tile(v_desc, b, h, start_n, v_ready.index(slot), v_ring.index(slot))


@gluon.jit
def _issue_s(q_smem, ring, j):
    """Issue S = Q·Kᵀ of the walk's j-th key tile once its K has landed."""
    k_ready, k_ring = ring[0], ring[3]
    STAGES: gl.constexpr = k_ring.shape[0]
    BLOCK_N: gl.constexpr = k_ring.shape[1]
    s_layout: gl.constexpr = mma_layout(gl.num_warps(), BLOCK_N)
    slot = j % STAGES
    mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
    zeros = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    return warpgroup_mma(q_smem, k_ring.index(slot).permute((1, 0)), zeros, use_acc=False, is_async=True)


@gluon.jit
def _issue_pv(acc, p, ring, j):
    """Issue acc += p·V of the walk's j-th key tile (p in registers) once its V has landed."""
    v_ready, v_ring = ring[1], ring[4]
    STAGES: gl.constexpr = v_ring.shape[0]
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    slot = j % STAGES
    mbarrier.wait(v_ready.index(slot), (j // STAGES) & 1)
    v_tile = v_ring.index(slot)
    return warpgroup_mma(gl.convert_layout(p.to(v_tile.dtype), p_layout), v_tile, acc, is_async=True)


@gluon.jit
def _softmax(
    s,
    m_i,
    l_i,
    tile,
    rows,
    qk_scale,
    CAUSAL: gl.constexpr,
    MASKED: gl.constexpr,
    WINDOW: gl.constexpr,
    DOCS: gl.constexpr,
    SPARSE: gl.constexpr,
):
    """The online-softmax update of (m, l) with the walk's tile `tile`'s scores s; returns p (fp32), α, m', l'.
    Under a causal sliding window (WINDOW), documents (DOCS: a query sees the keys of its own document) or a block
    mask (SPARSE: `tile` is a position in the kept-tile list, and positions past the walk's runs are masked
    whole) a row may see no key of a masked tile, nor of any tile before it; its max then stays −inf and exponents
    are taken from 0, so that its p and α are 0 rather than NaN."""
    offs_m, shift, seq_len_k, window_size, docs, row_ids, kept, n_kept, walk_end, _ = rows
    BLOCK_N: gl.constexpr = s.shape[1]
    if MASKED:
        column = kept_tile(kept, n_kept, tile) if SPARSE else tile
        offs_n = column * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s.type.layout))
        if CAUSAL:  # n ≤ m + shift implies n < Tk for every row that is stored
            seen = offs_n[None, :] <= (offs_m + shift)[:, None]
            if WINDOW:
                seen = seen & (offs_n[None, :] > (offs_m + shift - window_size)[:, None])
            if DOCS:
                col_ids = gl.load(docs + offs_n, mask=offs_n < seq_len_k, other=0)
                seen = seen & (col_ids[None, :] == row_ids[:, None])
            if SPARSE:
                seen = seen & (tile < walk_end)
            s = gl.where(seen, s, float("-inf"))
        else:
            s = gl.where((offs_n < seq_len_k)[None, :], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    m_from = gl.where(m_new == float("-inf"), 0.0, m_new) if (WINDOW or DOCS or SPARSE) and MASKED else m_new
    p = gl.exp2(s * qk_scale - m_from[:, None])
    alpha = gl.exp2(m_i - m_from)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _dropped(p, tile, rows, SPARSE: gl.constexpr):
    """p with the elements dropout drops set to 0, for the walk's tile `tile` (SPARSE: a position in the kept-tile
    list) and the warpgroup's rows."""
    seq_len_k, kept, n_kept = rows[2], rows[6], rows[7]
    rng, row0 = rows[9]
    BLOCK_N: gl.constexpr = p.shape[1]
    column = kept_tile(kept, n_kept, tile) if SPARSE else tile
    return gl.where(keep_mask(rng, row0, column * BLOCK_N, seq_len_k, ROWS, BLOCK_N), p, 0.0)


@gluon.jit
def _rescale(acc, alpha):
    return acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]


@gluon.jit
def _step(
    state,
    q_smem,
    ring,
    tile,
    t_lo,
    rows,
    qk_scale,
    CAUSAL: gl.constexpr,
    MASKED: gl.constexpr,
    WINDOW: gl.constexpr,
    DOCS: gl.constexpr,
    SPARSE: gl.constexpr,
    DROPOUT: gl.constexpr,
):
    """One key tile (the walk's (tile − t_lo)-th): S and the previous p·v retire together, then p·v of this tile
    is issued and left in flight."""
    acc, m_i, l_i = state
    empty = ring[2]
    STAGES: gl.constexpr = empty.shape[0]
    j = tile - t_lo
    s = _issue_s(q_smem, ring, j)
    s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s, acc))
    mbarrier.arrive(empty.index((j - 1) % STAGES), count=1)  # the previous tile's K and V are read
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, tile, rows, qk_scale, CAUSAL, MASKED, WINDOW, DOCS, SPARSE)
    if DROPOUT:
        p = _dropped(p, tile, rows, SPARSE)
    acc = _issue_pv(_rescale(acc, alpha), p, ring, j)
    return acc, m_i, l_i


@gluon.jit
def _walk(
    state,
    q_smem,
    ring,
    tiles,
    rows,
    qk_scale,
    CAUSAL: gl.constexpr,
    WINDOW: gl.constexpr,
    DOCS: gl.constexpr,
    SPARSE: gl.constexpr,
    DROPOUT: gl.constexpr,
):
    """Key tiles t_lo + 1 … t_hi − 1 of the runs tiles = (t_lo, a, b, t_hi) (masked, mask-free, masked; without
    masks t_lo = a = 0; SPARSE: positions in the kept-tile list), from the first tile's p·v in flight; returns
    (acc, m, l) with the last p·v landed."""
    t_lo, a, b, t_hi = tiles
    if WINDOW or DOCS or SPARSE:
        for tile in range(t_lo + 1, a):
            state = _step(state, q_smem, ring, tile, t_lo, rows, qk_scale, CAUSAL, True, WINDOW, DOCS, SPARSE, DROPOUT)
        for tile in range(gl.maximum(a, t_lo + 1), b):
            state = _step(state, q_smem, ring, tile, t_lo, rows, qk_scale, CAUSAL, False, WINDOW, DOCS, SPARSE, DROPOUT)
        for tile in range(gl.maximum(b, t_lo + 1), t_hi):
            state = _step(state, q_smem, ring, tile, t_lo, rows, qk_scale, CAUSAL, True, WINDOW, DOCS, SPARSE, DROPOUT)
    else:
        for tile in range(1, b):
            state = _step(state, q_smem, ring, tile, 0, rows, qk_scale, CAUSAL, False, False, False, False, DROPOUT)
        for tile in range(gl.maximum(b, 1), t_hi):
            state = _step(state, q_smem, ring, tile, 0, rows, qk_scale, CAUSAL, True, False, False, False, DROPOUT)
    acc, m_i, l_i = state
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc,)), m_i, l_i


@gluon.jit
def _consumer(
    q_smem,
    shared,
    rows,
    CAUSAL: gl.constexpr,
    WINDOW: gl.constexpr,
    DOCS: gl.constexpr,
    SPARSE: gl.constexpr,
    DROPOUT: gl.constexpr,
):
    """One math warpgroup's 64 rows: the walk over the key tiles, then O and LSE."""
    q_ready, ring, tiles, outs, qk_scale, kept = shared
    t_lo, t_hi = tiles[0], tiles[3]
    walk_end = gl.maximum(t_hi, t_lo + 1) if SPARSE else t_hi  # a walk takes at least one step (`kept_tile`)
    row0, shift, seq_len_k, window_size, docs, rng, dropout_scale = rows
    o_desc, b, h, lse_ptrs, seq_len_q = outs
    empty, v_ring = ring[2], ring[4]
    STAGES: gl.constexpr = v_ring.shape[0]
    HEAD_DIM: gl.constexpr = v_ring.shape[2]
    BLOCK_N: gl.constexpr = v_ring.shape[1]
    s_layout: gl.constexpr = mma_layout(gl.num_warps(), BLOCK_N)
    acc_layout: gl.constexpr = mma_layout(gl.num_warps(), HEAD_DIM)
    offs_m = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
    row_ids = gl.load(docs + gl.minimum(offs_m + shift, seq_len_k - 1)) if DOCS else offs_m  # the rows' documents
    rows = (offs_m, shift, seq_len_k, window_size, docs, row_ids, kept[0], kept[1], t_hi, (rng, row0))
    mbarrier.wait(q_ready, 0)

    # The first tile, peeled and masked. Without a window or documents it holds key 0, seen by every row, so m is
    # finite from here on; with them, `_softmax` keeps rows that have seen nothing yet at zero.
    s = _issue_s(q_smem, ring, 0)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    m_i = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout))
    p, _, m_i, l_i = _softmax(s, m_i, l_i, t_lo, rows, qk_scale, CAUSAL, True, WINDOW, DOCS, SPARSE)
    if DROPOUT:
        p = _dropped(p, t_lo, rows, SPARSE)
    zeros = gl.zeros([ROWS, HEAD_DIM], gl.float32, acc_layout)
    state = (_issue_pv(zeros, p, ring, 0), m_i, l_i)
    acc, m_i, l_i = _walk(state, q_smem, ring, tiles, rows, qk_scale, CAUSAL, WINDOW, DOCS, SPARSE, DROPOUT)
    mbarrier.arrive(empty.index((walk_end - t_lo - 1) % STAGES), count=1)

    # O leaves through Q's buffer, free now that every product that read it has retired, by one TMA store: whole
    # 128-byte lines, and rows past Tq clipped by the descriptor.
    norm = gl.where(l_i == 0.0, 1.0, l_i) if SPARSE else l_i  # a row that sees no key: o = 0 (and LSE = −inf)
    if DROPOUT:  # kept probabilities are scaled by c
        norm = norm / dropout_scale
    o = acc / gl.convert_layout(norm, gl.SliceLayout(1, acc_layout))[:, None]
    q_smem.store(o.to(q_smem.dtype))
    fence_async_shared()
    store_head_tile(o_desc, b, h, row0, q_smem)
    gl.store(lse_ptrs + offs_m, (m_i + gl.log2(l_i)) * LN2, mask=offs_m < seq_len_q)
    tma.store_wait(0)


@gluon.jit(do_not_specialize=["seed", "offset_lo", "offset_hi", "dropout_threshold"])
def flash_fwd_hopper_kernel(
    q_desc,
    k_desc,
    v_desc,
    o_desc,
    LSE,
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
    CONSUMERS: gl.constexpr,
    CAUSAL: gl.constexpr,
    WINDOW: gl.constexpr,
    HEADS_FASTEST: gl.constexpr,
    DROPOUT: gl.constexpr,
):
    """O (B, H, Tq, D) and LSE (B·H·Tq fp32) of a query tile (64 · CONSUMERS rows) of a head (`query_tile_program`),
    from tensor descriptors of Q (B, H, Tq, D) in tiles of (1, 1, 64, D) and K, V (B, H, Tk, D) in tiles of
    (1, 1, BLOCK_N, D), made on the host (`launch.launch_forward_hopper`). With CAUSAL, two more masks:
    WINDOW, each query sees only the window_size keys up to its own position; documents = (DocIds, stride_b,
    DocRanges, stride_b), DocIds (B, Tk) int32 (else None): a query sees only the keys of its own document, with
    DocRanges the documents' schedule for this tiling (B, query tiles, 4) int32 (`tile_schedule.py`); blocks =
    (KeptCount, stride_h, KeptIndex, stride_h, stride_row), KeptIndex (H or 1, query tiles, key tiles) int32 (else
    None): a block mask whose tiles this tiling's fit whole, with KeptCount, its kept key tiles per query tile (head
    strides 0 for a mask every head shares). With DROPOUT, the
    keep-mask of (seed, offset_lo, offset_hi) at dropout_threshold, kept values scaled by dropout_scale
    (`gluon_dropout.py`)."""
    DOCS: gl.constexpr = documents[0] is not None
    SPARSE: gl.constexpr = blocks[0] is not None
    dtype: gl.constexpr = q_desc.dtype
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    BLOCK_M: gl.constexpr = ROWS * CONSUMERS
    gl.static_assert(CONSUMERS <= 3, "one to three math warpgroups")
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    start_m, b, h, bh = query_tile_program(seq_len_q, n_heads, BLOCK_M, CAUSAL, HEADS_FASTEST)
    layout: gl.constexpr = tile_layout(ROWS, HEAD_DIM, dtype)  # BLOCK_N rows share it: the swizzle spans 8 rows

    q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, ROWS, HEAD_DIM], layout)
    ring = (
        gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
        gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
        gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
        gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], layout),
        gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], layout),
    )
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ring[0].index(i), count=1)
        mbarrier.init(ring[1].index(i), count=1)
        mbarrier.init(ring[2].index(i), count=CONSUMERS)  # every math warpgroup hands the buffer back
    fence_async_shared()

    masks = (window_size, documents, blocks)
    if WINDOW or DOCS or SPARSE:
        docs, kept, tiles = masked_query_tile(start_m, b, h, seq_len_q, seq_len_k, masks, BLOCK_M, BLOCK_N, WINDOW)
    else:
        docs = 0
        kept = (0, 0)
        n_tiles, n_full = key_tiles(start_m, seq_len_q, seq_len_k, BLOCK_M, BLOCK_N, CAUSAL)
        tiles = (0, 0, n_full, n_tiles)
    shift = seq_len_k - seq_len_q
    mbarrier.expect(q_ready, CONSUMERS * q_desc.block_type.nbytes)
    for c in gl.static_range(CONSUMERS):
        load_head_tile(q_desc, b, h, start_m + c * ROWS, q_ready, q_smem.index(c))

    lse_ptrs = LSE + bh.to(gl.int64) * seq_len_q
    outs = (o_desc, b, h, lse_ptrs, seq_len_q)
    qk_scale = softmax_scale * LOG2E
    rng = (seed, offset_lo, offset_hi, bh, dropout_threshold)  # this head's dropout stream
    rows = (
        (start_m, shift, seq_len_k, window_size, docs, rng, dropout_scale),
        (start_m + ROWS, shift, seq_len_k, window_size, docs, rng, dropout_scale),
        (start_m + 2 * ROWS, shift, seq_len_k, window_size, docs, rng, dropout_scale),
    )
    shared = (q_ready, ring, tiles, outs, qk_scale, kept)
    # The producer's walk; a block mask's may keep no tile, and then takes one step, masked whole (`kept_tile`).
    walk = (tiles[0], gl.maximum(tiles[3], tiles[0] + 1) if SPARSE else tiles[3], kept[0], kept[1])
    # Constexprs go into each partition's argument tuple directly: a tuple assigned to a name first turns them into
    # run-time values, and their branches into run-time branches.
    if CONSUMERS == 1:
        gl.warp_specialize(
            [
                (_consumer, (q_smem.index(0), shared, rows[0], CAUSAL, WINDOW, DOCS, SPARSE, DROPOUT)),
                (_producer, ((k_desc, v_desc), ring, walk, b, h, SPARSE)),
            ],
            [1],
            [24],
        )
    elif CONSUMERS == 2:
        gl.warp_specialize(
            [
                (_consumer, (q_smem.index(0), shared, rows[0], CAUSAL, WINDOW, DOCS, SPARSE, DROPOUT)),
                (_consumer, (q_smem.index(1), shared, rows[1], CAUSAL, WINDOW, DOCS, SPARSE, DROPOUT)),
                (_producer, ((k_desc, v_desc), ring, walk, b, h, SPARSE)),
            ],
            [4, 1],
            [232, 24],
        )
    else:
        gl.warp_specialize(
            [
                (_consumer, (q_smem.index(0), shared, rows[0], CAUSAL, WINDOW, DOCS, SPARSE, DROPOUT)),
                (_consumer, (q_smem.index(1), shared, rows[1], CAUSAL, WINDOW, DOCS, SPARSE, DROPOUT)),
                (_consumer, (q_smem.index(2), shared, rows[2], CAUSAL, WINDOW, DOCS, SPARSE, DROPOUT)),
                (_producer, ((k_desc, v_desc), ring, walk, b, h, SPARSE)),
            ],
            [4, 4, 1],
            [160, 160, 24],
        )
