"""FlashAttention forward: O = softmax(Q·Kᵀ·scale + mask)·V, tiled, with the Tq×Tk matrix never materialised.

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

Masks (see `tile_ranges.py`) only change which key tiles a program visits and which of them apply the elementwise mask.
A row can see nothing in a tile while its running max is still −inf (a window or document starts further right, or
a block-sparse row is empty). With EXTRA_MASKS (a window, documents or a block mask given) the kernel then
subtracts 0 instead of −inf, so such rows add exp2(−inf) = 0, and a row that sees no key at all ends with l = 0,
which gives o = 0 and LSE = −inf. Plain causal masking needs none of this: every row sees key 0 first.

Arguments: the kernel takes flat launch arguments (tensors, strides, scalars, the masks' schedules). What every
tile reads travels below it in a few tuples built once per program: `rows` (query indices, absolute positions,
document ids), `masking` (Tq, Tk, the window, this batch's document ids and this head's block-mask rows with their
stride), `rng` (this head's dropout stream: seed, offset, head, threshold), and the masks given as one constexpr
tuple `MASKS` = (CAUSAL, WINDOW, DOCS, GATHER, SPARSE_BLOCK, EXTRA_MASKS, RAGGED), where RAGGED says the last
key tile runs past Tk, so key loads are bounds-checked. The grouping changes no machine code
(`scripts/kernel_sass.py --same-as` compares the sm_90a code of every pass).
"""

import triton
import triton.language as tl

from .addressing import head_rows
from .dropout import dropout_keep_mask
from .tile_ranges import block_visible, document_ranges, kept_blocks, key_range, outside_fast, tile_runs, visible

LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _seen(rows, offs_n, k_doc, in_bounds, masking, MASKS: tl.constexpr):
    """Which (query row, key) pairs of the tile the masks keep (k_doc: the keys' document ids, (1, BLOCK_N))."""
    offs_m, q_pos, q_doc, _ = rows
    seq_len_q, _, window_size, _, block_row, stride_block_row = masking
    CAUSAL, WINDOW, DOCS, GATHER, SPARSE_BLOCK, _, _ = MASKS
    seen = visible(q_pos[:, None], offs_n[None, :], in_bounds[None, :], window_size, q_doc, k_doc, CAUSAL, WINDOW, DOCS)
    if GATHER:  # the tile straddles blocks of the block mask
        in_range = (offs_m < seq_len_q)[:, None] & in_bounds[None, :]
        seen = seen & block_visible(
            block_row, offs_m[:, None], offs_n[None, :], in_range, stride_block_row, SPARSE_BLOCK
        )
    return seen


@triton.jit
def _forward_tile(
    state,
    q,
    rows,
    k_src,
    v_src,
    start_n,
    masked_tile,
    masking,
    rng,
    qk_scale,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    MASKS: tl.constexpr,
    DROPOUT: tl.constexpr,
    UPCAST: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    TMA: tl.constexpr,
):
    """Online-softmax update of state = (acc, l, m) with the key tile at start_n. MASKED and masked_tile: whether the
    tile applies the masks (MASKED "outside_fast": decided at run time by masked_tile; see `_forward_tiles`).
    k_src, v_src: tensor descriptors of this head's K and V (TMA), or pointers to the tile's Kᵀ and V. rows,
    masking, rng and MASKS: as built by `flash_fwd_kernel`."""
    acc, l_i, m_i = state
    start_m = rows[3]
    seq_len_k, doc_row = masking[1], masking[3]
    DOCS: tl.constexpr = MASKS[2]
    EXTRA_MASKS: tl.constexpr = MASKS[5]
    RAGGED: tl.constexpr = MASKS[6]
    offs_n = start_n + tl.arange(0, BLOCK_N)
    in_bounds = offs_n < seq_len_k
    if TMA:  # rows past Tk arrive as zeros
        kT = tl.trans(k_src.load([start_n, 0]))
        v = v_src.load([start_n, 0])
    elif RAGGED:
        kT = tl.load(k_src, mask=in_bounds[None, :], other=0.0)
        v = tl.load(v_src, mask=in_bounds[:, None], other=0.0)
    else:
        kT = tl.load(k_src)
        v = tl.load(v_src)
    if UPCAST:
        kT = kT.to(tl.float32)
        v = v.to(tl.float32)

    # The dropout draw is independent of the products. Where in the program it goes decides how ptxas overlaps it
    # with them (H200, same-process A/B): with descriptor tiles, after QKᵀ is issued (D = 64: 1-2% faster,
    # D = 128: 7%); with pointer tiles, before it (D = 128: 11% faster than after).
    if DROPOUT and not TMA:
        keep = dropout_keep_mask(rng, start_m, start_n, seq_len_k, BLOCK_M, BLOCK_N)
    qk = tl.dot(q, kT, input_precision=INPUT_PRECISION)  # (BLOCK_M, BLOCK_N), unscaled
    if DROPOUT and TMA:
        keep = dropout_keep_mask(rng, start_m, start_n, seq_len_k, BLOCK_M, BLOCK_N)
    # The keys' document ids, loaded where the pipeline can prefetch them: inside the run-time branch below, every
    # masked tile waited for the load (one loop over documents' tiles ran 0.79-0.92x of three loops). Unused, as in
    # mask-free loops, the load is dropped.
    k_doc = tl.load(doc_row + offs_n, mask=in_bounds, other=0)[None, :] if DOCS else 0
    if MASKED == "outside_fast":
        # One loop walks masked and mask-free tiles: only the scores pass through the run-time branch, so every tile
        # scales them with a multiple of its own and guards the row max (cheaper than a second pipeline fill).
        s = qk * qk_scale
        if masked_tile:
            s = tl.where(_seen(rows, offs_n, k_doc, in_bounds, masking, MASKS), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_sub[:, None])
    elif MASKED:
        s = tl.where(_seen(rows, offs_n, k_doc, in_bounds, masking, MASKS), qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # Under plain causal masking every row has seen a visible column by now; with other masks a row may not.
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new) if EXTRA_MASKS else m_new
        p = tl.exp2(s - m_sub[:, None])
    else:
        # qk_scale ≥ 0 (`flash_attention` negates q for a negative scale) and rounding is monotonic, so
        # rowmax(qk)·scale is exactly rowmax(qk·scale): the scores are scaled inside the exponent's FFMA, not by a
        # multiply of their own before the row max (one fp32 instruction less per score).
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_sub = m_new
        p = tl.exp2(qk * qk_scale - m_sub[:, None])
    alpha = tl.exp2(m_i - m_sub)
    l_i = l_i * alpha + tl.sum(p, 1)
    if DROPOUT:
        p = tl.where(keep, p, 0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def _forward_tiles(
    state,
    q,
    rows,
    k_src,
    v_src,
    kv_strides,
    kept,
    lo,
    hi,
    fast,
    masking,
    rng,
    qk_scale,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    INDEXED: tl.constexpr,
    MASKS: tl.constexpr,
    DROPOUT: tl.constexpr,
    UPCAST: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    TMA: tl.constexpr,
):
    """Key tiles starting at lo, lo + BLOCK_N, ... below hi; INDEXED: the tiles kept[lo], ..., kept[hi − 1].
    MASKED: which tiles apply the elementwise mask: none (False: the loop holds no mask code), all (True), or
    "outside_fast", those at positions outside fast = (fast_lo, fast_hi), so that one loop walks masked and
    mask-free tiles (a loop costs each program a pipeline fill and drain). k_src, v_src: this head's K and V, as
    tensor descriptors (TMA) or pointers with kv_strides = (stride_kt, stride_kd, stride_vt, stride_vd)."""
    stride_kt, stride_kd, stride_vt, stride_vd = kv_strides
    offs_d = tl.arange(0, HEAD_DIM)
    if INDEXED:
        for i in range(lo, hi):
            start_n = tl.multiple_of(tl.load(kept + i) * BLOCK_N, BLOCK_N)
            kT_tile = k_src
            v_tile = v_src
            if not TMA:
                offs_n = start_n + tl.arange(0, BLOCK_N)
                kT_tile = k_src + offs_n[None, :] * stride_kt + offs_d[:, None] * stride_kd  # (D, BLOCK_N)
                v_tile = v_src + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd  # (BLOCK_N, D)
            state = _forward_tile(
                state, q, rows, kT_tile, v_tile, start_n, outside_fast(i, fast, MASKED), masking, rng, qk_scale,
                BLOCK_M, BLOCK_N, MASKED, MASKS, DROPOUT, UPCAST, INPUT_PRECISION, TMA,
            )  # fmt: skip
    elif TMA:
        for start_n in range(lo, hi, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            state = _forward_tile(
                state, q, rows, k_src, v_src, start_n, outside_fast(start_n, fast, MASKED), masking, rng, qk_scale,
                BLOCK_M, BLOCK_N, MASKED, MASKS, DROPOUT, UPCAST, INPUT_PRECISION, TMA,
            )  # fmt: skip
    else:
        offs_n = lo + tl.arange(0, BLOCK_N)
        kT_ptrs = k_src + offs_n[None, :] * stride_kt + offs_d[:, None] * stride_kd  # (D, BLOCK_N)
        v_ptrs = v_src + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd  # (BLOCK_N, D)
        for start_n in range(lo, hi, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            state = _forward_tile(
                state, q, rows, kT_ptrs, v_ptrs, start_n, outside_fast(start_n, fast, MASKED), masking, rng, qk_scale,
                BLOCK_M, BLOCK_N, MASKED, MASKS, DROPOUT, UPCAST, INPUT_PRECISION, TMA,
            )  # fmt: skip
            kT_ptrs += BLOCK_N * stride_kt
            v_ptrs += BLOCK_N * stride_vt
    return state


@triton.jit
def _forward_key_range(
    state,
    q,
    rows,
    k_src,
    v_src,
    kv_strides,
    kept,
    n_kept,
    ranges,
    masking,
    rng,
    qk_scale,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SPARSE: tl.constexpr,
    MASKS: tl.constexpr,
    ONE_LOOP: tl.constexpr,
    DROPOUT: tl.constexpr,
    UPCAST: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    TMA: tl.constexpr,
):
    """Key tiles of ranges = (lo, hi, full_lo, full_hi): a masked run, the mask-free run inside [full_lo, full_hi),
    and a masked run. With plain causal masking the first run is empty (and not compiled) and the last is the
    diagonal band; without masks the last is the ragged tile when Tk is not a multiple of BLOCK_N. Under a block
    mask, only the listed tiles of each run. ONE_LOOP: the three runs are one loop (`launch.one_loop` says when)."""
    EXTRA_MASKS: tl.constexpr = MASKS[5]
    lead_start, fast_start, tail_start, tail_end = tile_runs(ranges, kept, n_kept, BLOCK_N, SPARSE, MASKS[3])
    if ONE_LOOP:
        state = _forward_tiles(
            state, q, rows, k_src, v_src, kv_strides, kept, lead_start, tail_end, (fast_start, tail_start), masking,
            rng, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, "outside_fast", SPARSE, MASKS, DROPOUT, UPCAST, INPUT_PRECISION,
            TMA,
        )  # fmt: skip
    else:
        if EXTRA_MASKS:  # causal masking alone starts every row at key 0, which it sees: no leading masked run
            state = _forward_tiles(
                state, q, rows, k_src, v_src, kv_strides, kept, lead_start, fast_start, (0, 0), masking, rng,
                qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, True, SPARSE, MASKS, DROPOUT, UPCAST, INPUT_PRECISION, TMA,
            )  # fmt: skip
        state = _forward_tiles(
            state, q, rows, k_src, v_src, kv_strides, kept, fast_start, tail_start, (0, 0), masking, rng, qk_scale,
            BLOCK_M, BLOCK_N, HEAD_DIM, False, SPARSE, MASKS, DROPOUT, UPCAST, INPUT_PRECISION, TMA,
        )  # fmt: skip
        state = _forward_tiles(
            state, q, rows, k_src, v_src, kv_strides, kept, tail_start, tail_end, (0, 0), masking, rng, qk_scale,
            BLOCK_M, BLOCK_N, HEAD_DIM, True, SPARSE, MASKS, DROPOUT, UPCAST, INPUT_PRECISION, TMA,
        )  # fmt: skip
    return state


@triton.jit(do_not_specialize=["seed", "offset_lo", "offset_hi", "dropout_threshold", "window_size"])
def flash_fwd_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    q_strides,
    k_strides,
    v_strides,
    o_strides,
    n_heads,
    seq_len_q,
    seq_len_k,
    qk_scale,
    seed,
    offset_lo,
    offset_hi,
    dropout_threshold,
    dropout_scale,
    window_size,
    documents,
    blocks,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    DOCS: tl.constexpr,
    SPARSE: tl.constexpr,
    GATHER: tl.constexpr,
    SPARSE_BLOCK: tl.constexpr,
    EXTRA_MASKS: tl.constexpr,
    RAGGED: tl.constexpr,
    ONE_LOOP: tl.constexpr,
    DROPOUT: tl.constexpr,
    UPCAST: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    TMA: tl.constexpr,
):
    # Scalars may arrive as Python floats baked in as fp64 constants (torch.compile does this); the math is fp32.
    qk_scale = tl.cast(qk_scale, tl.float32)
    dropout_scale = tl.cast(dropout_scale, tl.float32)
    # Causal row blocks near the end do the most work: launch them first so the tail of the grid is short.
    n_blocks_m = tl.cdiv(seq_len_q, BLOCK_M)
    pid_m = (n_blocks_m - 1 - tl.program_id(0)) if CAUSAL else tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads

    q_head, stride_qt, stride_qd = head_rows(Q, b, h, q_strides)
    k_head, stride_kt, stride_kd = head_rows(K, b, h, k_strides)
    v_head, stride_vt, stride_vd = head_rows(V, b, h, v_strides)
    o_head, stride_ot, stride_od = head_rows(O, b, h, o_strides)
    k_src = k_head
    v_src = v_head
    if TMA:  # bulk tensor copies (TMA) of whole tiles; the descriptor's bounds zero-fill rows past Tk
        k_src = tl.make_tensor_descriptor(k_head, [seq_len_k, HEAD_DIM], [stride_kt, 1], [BLOCK_N, HEAD_DIM])
        v_src = tl.make_tensor_descriptor(v_head, [seq_len_k, HEAD_DIM], [stride_vt, 1], [BLOCK_N, HEAD_DIM])

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len_q
    q_pos = offs_m + (seq_len_k - seq_len_q)  # absolute positions: the queries are the last Tq of Tk

    q = tl.load(q_head + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)

    ranges = key_range(start_m, seq_len_q, seq_len_k, window_size, BLOCK_M, CAUSAL, WINDOW)
    doc_row, q_doc, ranges = document_ranges(documents, b, pid_m, q_pos, row_ok, ranges, DOCS)
    kept, n_kept, block_row, stride_block_row = kept_blocks(blocks, h, pid_m, SPARSE)
    # What the tiles share, grouped: the query rows (index, absolute position, document), what the elementwise mask
    # reads, this head's dropout stream, and the masks given (compile-time flags).
    rows = (offs_m, q_pos, q_doc, start_m)
    masking = (seq_len_q, seq_len_k, window_size, doc_row, block_row, stride_block_row)
    rng = (seed, offset_lo, offset_hi, bh, dropout_threshold)
    MASKS: tl.constexpr = (CAUSAL, WINDOW, DOCS, GATHER, SPARSE_BLOCK, EXTRA_MASKS, RAGGED)
    acc, l_i, m_i = _forward_key_range(
        (acc, l_i, m_i), q, rows, k_src, v_src, (stride_kt, stride_kd, stride_vt, stride_vd), kept, n_kept, ranges,
        masking, rng, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, SPARSE, MASKS, ONE_LOOP, DROPOUT, UPCAST, INPUT_PRECISION,
        TMA,
    )  # fmt: skip

    if EXTRA_MASKS:  # a row that saw no key has l = 0 and acc = 0: o = 0 and LSE = −inf + log2(1) = −inf
        l_i = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc * (dropout_scale / l_i)[:, None]
    tl.store(
        o_head + offs_m[:, None] * stride_ot + offs_d[None, :] * stride_od,
        o.to(O.dtype.element_ty),
        mask=row_ok[:, None],
    )
    lse = (m_i + tl.log2(l_i)) * LN2
    tl.store(LSE + bh.to(tl.int64) * seq_len_q + offs_m, lse, mask=row_ok)
