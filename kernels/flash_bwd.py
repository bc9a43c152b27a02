"""FlashAttention backward: dQ, dK, dV from Q, K, V, O, dO and the forward's log-sum-exp, with no Tq×Tk buffer.

With S = Q·Kᵀ·scale, P = softmax(S) = exp(S − LSE), dropout keep-mask Z and keep-scale c = 1/(1 − p_drop):

    P̃  = c·(P ∘ Z)            the probabilities the forward multiplied with V
    dV = P̃ᵀ·dO
    dP = c·Z ∘ (dO·Vᵀ)
    dS = P ∘ (dP − δ),        δ = rowsum(dP ∘ P) = rowsum(dO ∘ O)
    dQ = scale · dS·K,        dK = scale · dSᵀ·Q

P and Z are recomputed tile by tile from Q, K, the LSE and the dropout seed. Two schedules:

- fused (5 matrix products per tile pair, 3 launches): the preprocess computes δ and zeroes an fp32 dQ
  accumulator; one program per key tile walks the query tiles that see it, accumulates dK and dV in registers and
  adds each tile's dS·K to the accumulator (DQ_REDUCE: element-wise atomics, or a bulk tensor reduce-add on
  Hopper); the convert kernel scales and casts dQ. Float atomics sum in whatever order programs arrive, so dQ
  varies in its last bits from run to run; the dropout mask is drawn once per tile pair.
- deterministic (7 products, 2 launches): every sum has a single owner and runs in a fixed order. One program per
  query tile accumulates its dQ over key tiles and stores δ (FUSED_DELTA); then one program per key tile
  accumulates its dK and dV over query tiles. The price is recomputing S and dP (and the dropout mask) in both.

Masks (see `tile_ranges.py`) bound the loops exactly as in the forward: the dK/dV program of a key tile visits only the
query tiles that can see it. A masked element has P = 0, so it adds nothing to any sum; a query row that saw no
key (LSE = −inf, O = 0, δ = 0) is masked in every tile it meets, so its gradients are exactly 0.

Arguments are grouped below the kernels as in the forward (`rows`, `masking`, `rng`, `MASKS`), plus `scales` =
(scale·log2 e, dropout keep-scale), the rows' LSE and δ (`row_stats`), and in the dK/dV pass the program's key
columns `cols` = (indices, first key, document ids). RAGGED in MASKS says the loop's last tile runs past the
sequence (Tq is not a multiple of BLOCK_M in the dK/dV pass, Tk of BLOCK_N in the dQ pass), so its loads are
bounds-checked.
"""

import triton
import triton.language as tl

from .addressing import head_rows
from .dropout import dropout_keep_mask, dropout_keep_mask_t
from .tile_ranges import (
    block_visible,
    document_ranges,
    kept_blocks,
    key_range,
    outside_fast,
    query_range,
    tile_runs,
    visible,
)

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _row_block(n_heads, seq_len, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """The (batch, head) and block of query rows a program of the row-wise kernels below owns: (b, h, row offsets,
    head-dim offsets, in-bounds rows, the rows' int64 index into (B·H·T)-long per-row tensors)."""
    bh = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row = bh.to(tl.int64) * seq_len + offs_m
    return bh // n_heads, bh % n_heads, offs_m, tl.arange(0, HEAD_DIM), offs_m < seq_len, row


@triton.jit
def flash_bwd_preprocess_kernel(
    O,
    DO,
    DLSE,
    Delta,
    DQAcc,
    o_strides,
    do_strides,
    n_heads,
    seq_len,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """Before the fused dK/dV/dQ pass: δ' = rowsum(dO ∘ O) − dlse in fp32 per query row (dlse: the gradient of the
    returned LSE, or None), and zeros in this program's rows of the fp32 dQ accumulator (if given)."""
    b, h, offs_m, offs_d, row_ok, row = _row_block(n_heads, seq_len, HEAD_DIM, BLOCK_M)
    o_ptrs, stride_ot, stride_od = head_rows(O, b, h, o_strides)
    do_ptrs, stride_dot, stride_dod = head_rows(DO, b, h, do_strides)
    o = tl.load(o_ptrs + offs_m[:, None] * stride_ot + offs_d[None, :] * stride_od, mask=row_ok[:, None], other=0.0)
    do = tl.load(do_ptrs + offs_m[:, None] * stride_dot + offs_d[None, :] * stride_dod, mask=row_ok[:, None], other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    if DLSE is not None:
        delta -= tl.load(DLSE + row, mask=row_ok, other=0.0)
    tl.store(Delta + row, delta, mask=row_ok)
    if DQAcc is not None:
        zeros = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
        tl.store(DQAcc + row[:, None] * HEAD_DIM + offs_d[None, :], zeros, mask=row_ok[:, None])


@triton.jit
def flash_bwd_dq_convert_kernel(
    DQAcc,
    DQ,
    dq_strides,
    n_heads,
    seq_len,
    softmax_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """After the fused pass: dQ = scale · (the fp32 sum of dS·K over key tiles), cast to dQ's dtype."""
    b, h, offs_m, offs_d, row_ok, row = _row_block(n_heads, seq_len, HEAD_DIM, BLOCK_M)
    dq = tl.load(DQAcc + row[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    dq = dq * tl.cast(softmax_scale, tl.float32)
    dq_ptrs, stride_dqt, stride_dqd = head_rows(DQ, b, h, dq_strides)
    tl.store(
        dq_ptrs + offs_m[:, None] * stride_dqt + offs_d[None, :] * stride_dqd,
        dq.to(DQ.dtype.element_ty),
        mask=row_ok[:, None],
    )


@triton.jit
def _dkdv_tile(
    state,
    k,
    v,
    cols,
    q_src,
    do_src,
    dq_head,
    row_stats,
    start_m,
    masked_tile,
    masking,
    rng,
    scales,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKS: tl.constexpr,
    DROPOUT: tl.constexpr,
    UPCAST: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DQ_REDUCE: tl.constexpr,
    TMA: tl.constexpr,
):
    """Accumulate state = (dK, dV) of one key tile over the query tile at start_m, in the transposed (key-major)
    layout. q_src, do_src: tensor descriptors of this head's Q and dO (TMA), or pointers to the tile's Qᵀ and dO.
    masked_tile: whether the tile pays for the elementwise mask (a constant, or decided per tile at run time).
    cols, row_stats, masking, rng, scales and MASKS: as built by `flash_bwd_dkdv_kernel`."""
    dk, dv = state
    offs_n, start_n, k_doc = cols
    lse_row, delta_row = row_stats
    seq_len_q, seq_len_k, window_size, doc_row, block_row, stride_block_row = masking
    qk_scale, dropout_scale = scales
    CAUSAL, WINDOW, DOCS, GATHER, SPARSE_BLOCK, _, RAGGED = MASKS
    offs_m = start_m + tl.arange(0, BLOCK_M)
    row_ok = offs_m < seq_len_q
    if TMA:  # rows past Tq arrive as zeros
        qT = tl.trans(q_src.load([start_m, 0]))
        do = do_src.load([start_m, 0])
    elif RAGGED:
        qT = tl.load(q_src, mask=row_ok[None, :], other=0.0)
        do = tl.load(do_src, mask=row_ok[:, None], other=0.0)
    else:
        qT = tl.load(q_src)
        do = tl.load(do_src)
    if RAGGED:
        lse2 = tl.load(lse_row + offs_m, mask=row_ok, other=0.0) * LOG2E
        delta = tl.load(delta_row + offs_m, mask=row_ok, other=0.0)
    else:
        lse2 = tl.load(lse_row + offs_m) * LOG2E
        delta = tl.load(delta_row + offs_m)
    if UPCAST:
        qT = qT.to(tl.float32)
        do = do.to(tl.float32)

    sT = tl.dot(k, qT, input_precision=INPUT_PRECISION)  # (BLOCK_N, BLOCK_M)
    if DROPOUT:
        # Drawn after the product is issued, so that ptxas overlaps the two (H200, D = 64: 5% faster than drawing
        # before it, and than after dP's product). Key-major, as the tile is: each thread draws the numbers of
        # the elements it holds (see dropout.py), with no exchange through shared memory.
        keepT = dropout_keep_mask_t(rng, start_m, start_n, seq_len_k, BLOCK_M, BLOCK_N)
    pT = tl.exp2(sT * qk_scale - lse2[None, :])
    q_pos = offs_m + (seq_len_k - seq_len_q)
    # Loaded outside the branch so that the pipeline prefetches it (see the forward); dropped where unused.
    q_doc = tl.load(doc_row + q_pos, mask=row_ok, other=0)[None, :] if DOCS else 0
    if masked_tile:
        # Keys past Tk (a ragged last key tile) are out of bounds too: their P must be exactly 0, or a row
        # that sees no key (LSE = −inf, P = inf) turns the fused pass's dS·K into inf · 0 = NaN.
        in_range = row_ok[None, :] & (offs_n < seq_len_k)[:, None]
        seen = visible(q_pos[None, :], offs_n[:, None], in_range, window_size, q_doc, k_doc, CAUSAL, WINDOW, DOCS)
        if GATHER:  # the tile straddles blocks of the block mask
            seen = seen & block_visible(
                block_row, offs_m[None, :], offs_n[:, None], in_range, stride_block_row, SPARSE_BLOCK
            )
        pT = tl.where(seen, pT, 0.0)
    dpT = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)  # (dO·Vᵀ)ᵀ, (BLOCK_N, BLOCK_M)
    if DROPOUT:
        # dS = P ∘ (c·Z ∘ dP − δ): one FFMA and a select per element; dV's c is applied once, after the loop.
        dv += tl.dot(tl.where(keepT, pT, 0.0).to(do.dtype), do, input_precision=INPUT_PRECISION)
        dsT = (pT * tl.where(keepT, dpT * dropout_scale - delta[None, :], -delta[None, :])).to(qT.dtype)
    else:
        dv += tl.dot(pT.to(do.dtype), do, input_precision=INPUT_PRECISION)
        dsT = (pT * (dpT - delta[None, :])).to(qT.dtype)
    if DQ_REDUCE != "none":
        # Before the dK product, so that the reduction's memory traffic overlaps it (measured: 3-6% faster).
        _add_dq(dq_head, dsT, k, offs_m, seq_len_q, start_m, rng[3], BLOCK_M, RAGGED, DQ_REDUCE, INPUT_PRECISION)
    dk += tl.dot(dsT, tl.trans(qT), input_precision=INPUT_PRECISION)
    return dk, dv


@triton.jit
def _add_dq(
    dq_head,
    dsT,
    k,
    offs_m,
    seq_len_q,
    start_m,
    bh,
    BLOCK_M: tl.constexpr,
    RAGGED: tl.constexpr,
    DQ_REDUCE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """This tile's share of dQ = dS·K (unscaled), added to the fp32 accumulator that the other key tiles add to:
    the fifth product, instead of recomputing S and dP in a separate dQ pass."""
    head_dim: tl.constexpr = k.shape[1]
    dq = tl.dot(tl.trans(dsT), k, input_precision=INPUT_PRECISION)  # (BLOCK_M, D)
    if DQ_REDUCE == "tma":
        # One bulk tensor reduce-add of the tile; rows past Tq are clipped by the descriptor.
        dq_head.atomic_add([bh, start_m, 0], tl.reshape(dq, (1, BLOCK_M, head_dim)))
    else:
        dq_ptrs = dq_head + offs_m[:, None] * head_dim + tl.arange(0, head_dim)[None, :]
        if RAGGED:  # rows past Tq
            tl.atomic_add(dq_ptrs, dq, mask=(offs_m < seq_len_q)[:, None], sem="relaxed")
        else:
            tl.atomic_add(dq_ptrs, dq, sem="relaxed")


@triton.jit
def _dkdv_tiles(
    state,
    k,
    v,
    cols,
    q_head,
    do_head,
    qdo_strides,
    dq_head,
    row_stats,
    kept,
    lo,
    hi,
    fast,
    masking,
    rng,
    scales,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    INDEXED: tl.constexpr,
    MASKS: tl.constexpr,
    DROPOUT: tl.constexpr,
    UPCAST: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DQ_REDUCE: tl.constexpr,
    TMA: tl.constexpr,
):
    """Query tiles starting at lo, lo + BLOCK_M, ... below hi; INDEXED: the tiles kept[lo], ..., kept[hi − 1].
    MASKED: which tiles pay for the elementwise mask: none (False: the loop holds no mask code), all (True), or
    "outside_fast", those at positions outside fast = [fast_lo, fast_hi). The last lets one loop walk masked and
    mask-free tiles: every loop costs a program a pipeline fill and drain, which short loops (windows, documents)
    cannot amortise.
    q_head, do_head: this head's Q and dO, as tensor descriptors (TMA) or pointers with qdo_strides =
    (stride_qt, stride_qd, stride_dot, stride_dod)."""
    stride_qt, stride_qd, stride_dot, stride_dod = qdo_strides
    offs_d = tl.arange(0, HEAD_DIM)
    if INDEXED:
        for i in range(lo, hi):
            start_m = tl.multiple_of(tl.load(kept + i) * BLOCK_M, BLOCK_M)
            q_tile = q_head
            do_tile = do_head
            if not TMA:
                offs_m = start_m + tl.arange(0, BLOCK_M)
                q_tile = q_head + offs_m[None, :] * stride_qt + offs_d[:, None] * stride_qd  # (D, BLOCK_M)
                do_tile = do_head + offs_m[:, None] * stride_dot + offs_d[None, :] * stride_dod  # (BLOCK_M, D)
            state = _dkdv_tile(
                state, k, v, cols, q_tile, do_tile, dq_head, row_stats, start_m, outside_fast(i, fast, MASKED), masking,
                rng, scales, BLOCK_M, BLOCK_N, MASKS, DROPOUT, UPCAST, INPUT_PRECISION, DQ_REDUCE, TMA,
            )  # fmt: skip
    elif TMA:
        for start_m in range(lo, hi, BLOCK_M):
            start_m = tl.multiple_of(start_m, BLOCK_M)
            state = _dkdv_tile(
                state, k, v, cols, q_head, do_head, dq_head, row_stats, start_m, outside_fast(start_m, fast, MASKED),
                masking, rng, scales, BLOCK_M, BLOCK_N, MASKS, DROPOUT, UPCAST, INPUT_PRECISION, DQ_REDUCE, TMA,
            )  # fmt: skip
    else:
        offs_m = lo + tl.arange(0, BLOCK_M)
        qT_ptrs = q_head + offs_m[None, :] * stride_qt + offs_d[:, None] * stride_qd  # (D, BLOCK_M)
        do_ptrs = do_head + offs_m[:, None] * stride_dot + offs_d[None, :] * stride_dod  # (BLOCK_M, D)
        for start_m in range(lo, hi, BLOCK_M):
            start_m = tl.multiple_of(start_m, BLOCK_M)
            state = _dkdv_tile(
                state, k, v, cols, qT_ptrs, do_ptrs, dq_head, row_stats, start_m, outside_fast(start_m, fast, MASKED),
                masking, rng, scales, BLOCK_M, BLOCK_N, MASKS, DROPOUT, UPCAST, INPUT_PRECISION, DQ_REDUCE, TMA,
            )  # fmt: skip
            qT_ptrs += BLOCK_M * stride_qt
            do_ptrs += BLOCK_M * stride_dot
    return state


@triton.jit
def _dkdv_query_range(
    state,
    k,
    v,
    cols,
    q_head,
    do_head,
    qdo_strides,
    dq_head,
    row_stats,
    kept,
    n_kept,
    ranges,
    masking,
    rng,
    scales,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SPARSE: tl.constexpr,
    MASKS: tl.constexpr,
    ONE_LOOP: tl.constexpr,
    DROPOUT: tl.constexpr,
    UPCAST: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DQ_REDUCE: tl.constexpr,
    TMA: tl.constexpr,
):
    """Query tiles of ranges = (lo, hi, full_lo, full_hi): a masked run (the causal diagonal band), the mask-free
    run inside [full_lo, full_hi), and a masked run (the end of a window, or the ragged last tile). Under a block
    mask, only the listed tiles. ONE_LOOP: the three runs are one loop (`launch.one_loop` says when)."""
    lead_start, fast_start, tail_start, tail_end = tile_runs(ranges, kept, n_kept, BLOCK_M, SPARSE, MASKS[3])
    if ONE_LOOP:
        state = _dkdv_tiles(
            state, k, v, cols, q_head, do_head, qdo_strides, dq_head, row_stats, kept, lead_start, tail_end,
            (fast_start, tail_start), masking, rng, scales, BLOCK_M, BLOCK_N, HEAD_DIM, "outside_fast", SPARSE, MASKS,
            DROPOUT, UPCAST, INPUT_PRECISION, DQ_REDUCE, TMA,
        )  # fmt: skip
    else:
        # The masked loops bounds-check their rows whatever Tq, as the dense fused pass does (`_dkdv_dense`).
        EDGE_MASKS: tl.constexpr = MASKS[:6] + (True,)  # noqa: RUF005 (Triton takes no starred tuple)
        state = _dkdv_tiles(
            state, k, v, cols, q_head, do_head, qdo_strides, dq_head, row_stats, kept, lead_start, fast_start,
            (fast_start, fast_start), masking, rng, scales, BLOCK_M, BLOCK_N, HEAD_DIM, True, SPARSE, EDGE_MASKS,
            DROPOUT, UPCAST, INPUT_PRECISION, DQ_REDUCE, TMA,
        )  # fmt: skip
        state = _dkdv_tiles(
            state, k, v, cols, q_head, do_head, qdo_strides, dq_head, row_stats, kept, fast_start, tail_start,
            (fast_start, tail_start), masking, rng, scales, BLOCK_M, BLOCK_N, HEAD_DIM, False, SPARSE, MASKS, DROPOUT,
            UPCAST, INPUT_PRECISION, DQ_REDUCE, TMA,
        )  # fmt: skip
        state = _dkdv_tiles(
            state, k, v, cols, q_head, do_head, qdo_strides, dq_head, row_stats, kept, tail_start, tail_end,
            (tail_start, tail_start), masking, rng, scales, BLOCK_M, BLOCK_N, HEAD_DIM, True, SPARSE, EDGE_MASKS,
            DROPOUT, UPCAST, INPUT_PRECISION, DQ_REDUCE, TMA,
        )  # fmt: skip
    return state


@triton.jit
def _dkdv_dense(
    state,
    k,
    v,
    cols,
    q_head,
    do_head,
    qdo_strides,
    dq_head,
    row_stats,
    seq_len,
    rng,
    scales,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    RAGGED: tl.constexpr,
    DROPOUT: tl.constexpr,
    UPCAST: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DQ_REDUCE: tl.constexpr,
    TMA: tl.constexpr,
):
    """No window, document or block mask and Tq == Tk: the causal diagonal band (masked), the mask-free bulk and,
    if Tq is not a multiple of BLOCK_M (RAGGED), the ragged last tile (masked), with bounds written out directly.
    `_dkdv_query_range` visits the same tiles, but its bounds, computed through selects, make ptxas serialize the
    loop's wgmma pipeline on Hopper (warning C7515: 3.4x the WARPGROUP sync instructions), which cost the dense
    backward 9-13%. The bulk loop holds no mask code: merged into one masked loop with the band, it ran 2% slower
    at 16K (H100)."""
    start_n = cols[1]
    full_rows = (seq_len // BLOCK_M) * BLOCK_M
    masking = (seq_len, seq_len, 0, 0, 0, 0)  # no window, documents or block mask: nothing else is read
    MASKS: tl.constexpr = (CAUSAL, False, False, False, 1, False, RAGGED)
    # The fused pass bounds-checks the band's rows and keeps the (empty) ragged-tail loop even where Tq is a
    # multiple of BLOCK_M: without them ptxas spilled registers there with dropout, and the pass ran 3-5% slower.
    EDGE_MASKS: tl.constexpr = (CAUSAL, False, False, False, 1, False, RAGGED or DQ_REDUCE != "none")
    if CAUSAL:  # query rows above the band never see this key tile
        band_hi = tl.minimum(start_n + BLOCK_N, seq_len)
        state = _dkdv_tiles(
            state, k, v, cols, q_head, do_head, qdo_strides, dq_head, row_stats, None, start_n, band_hi,
            (start_n, start_n), masking, rng, scales, BLOCK_M, BLOCK_N, HEAD_DIM, True, False, EDGE_MASKS, DROPOUT,
            UPCAST, INPUT_PRECISION, DQ_REDUCE, TMA,
        )  # fmt: skip
        bulk_lo = start_n + BLOCK_N
    else:
        bulk_lo = 0
    bulk_hi = tl.maximum(bulk_lo, full_rows)
    state = _dkdv_tiles(
        state, k, v, cols, q_head, do_head, qdo_strides, dq_head, row_stats, None, bulk_lo, bulk_hi, (bulk_lo, bulk_hi),
        masking, rng, scales, BLOCK_M, BLOCK_N, HEAD_DIM, False, False, MASKS, DROPOUT, UPCAST, INPUT_PRECISION,
        DQ_REDUCE, TMA,
    )  # fmt: skip
    if RAGGED or DQ_REDUCE != "none":
        state = _dkdv_tiles(
            state, k, v, cols, q_head, do_head, qdo_strides, dq_head, row_stats, None, bulk_hi, seq_len,
            (bulk_hi, bulk_hi), masking, rng, scales, BLOCK_M, BLOCK_N, HEAD_DIM, True, False, EDGE_MASKS, DROPOUT,
            UPCAST, INPUT_PRECISION, DQ_REDUCE, TMA,
        )  # fmt: skip
    return state


@triton.jit(do_not_specialize=["seed", "offset_lo", "offset_hi", "dropout_threshold", "window_size"])
def flash_bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    Delta,
    DK,
    DV,
    DQAcc,
    q_strides,
    k_strides,
    v_strides,
    do_strides,
    dk_strides,
    dv_strides,
    n_heads,
    seq_len_q,
    seq_len_k,
    softmax_scale,
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
    DENSE: tl.constexpr,
    RAGGED: tl.constexpr,
    ONE_LOOP: tl.constexpr,
    DROPOUT: tl.constexpr,
    UPCAST: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    DQ_REDUCE: tl.constexpr,
    TMA: tl.constexpr,
):
    # Scalars may arrive as Python floats baked in as fp64 constants (torch.compile does this); the math is fp32.
    softmax_scale = tl.cast(softmax_scale, tl.float32)
    qk_scale = tl.cast(qk_scale, tl.float32)
    dropout_scale = tl.cast(dropout_scale, tl.float32)
    # Causal key tiles near the start see the most query rows: launch them first.
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    q_head, stride_qt, stride_qd = head_rows(Q, b, h, q_strides)
    k_head, stride_kt, stride_kd = head_rows(K, b, h, k_strides)
    v_head, stride_vt, stride_vd = head_rows(V, b, h, v_strides)
    do_head, stride_dot, stride_dod = head_rows(DO, b, h, do_strides)
    lse_row = LSE + bh.to(tl.int64) * seq_len_q
    delta_row = Delta + bh.to(tl.int64) * seq_len_q

    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n < seq_len_k
    k = tl.load(k_head + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd, mask=col_ok[:, None], other=0.0)
    v = tl.load(v_head + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd, mask=col_ok[:, None], other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), dtype=tl.float32)
    if TMA:  # bulk tensor copies of whole query tiles; the descriptors' bounds zero-fill rows past Tq
        q_head = tl.make_tensor_descriptor(q_head, [seq_len_q, HEAD_DIM], [stride_qt, 1], [BLOCK_M, HEAD_DIM])
        do_head = tl.make_tensor_descriptor(do_head, [seq_len_q, HEAD_DIM], [stride_dot, 1], [BLOCK_M, HEAD_DIM])
    # DQ_REDUCE: this pass also adds dS·K into DQAcc, fp32 (B·H, Tq, D) contiguous, zeroed by the preprocess.
    if DQ_REDUCE == "tma":
        dq_head = tl.make_tensor_descriptor(
            DQAcc,
            shape=[tl.num_programs(1), seq_len_q, HEAD_DIM],
            strides=[seq_len_q * HEAD_DIM, HEAD_DIM, 1],
            block_shape=[1, BLOCK_M, HEAD_DIM],
        )
    elif DQ_REDUCE == "atomic":
        dq_head = DQAcc + bh.to(tl.int64) * seq_len_q * HEAD_DIM
    else:
        dq_head = DQAcc  # None: dQ has its own pass

    # What the query tiles share, grouped: this program's key columns (index, start, document), the pointers to
    # the per-row LSE and δ, this head's dropout stream, and the two scales.
    rng = (seed, offset_lo, offset_hi, bh, dropout_threshold)
    scales = (qk_scale, dropout_scale)
    row_stats = (lse_row, delta_row)
    qdo_strides = (stride_qt, stride_qd, stride_dot, stride_dod)
    if DENSE:
        dk, dv = _dkdv_dense(
            (dk, dv), k, v, (offs_n, start_n, 0), q_head, do_head, qdo_strides, dq_head, row_stats, seq_len_q, rng,
            scales, BLOCK_M, BLOCK_N, HEAD_DIM, CAUSAL, RAGGED, DROPOUT, UPCAST, INPUT_PRECISION, DQ_REDUCE, TMA,
        )  # fmt: skip
    else:
        # Only the query tiles that can see this key tile; query rows above the causal band are skipped.
        ranges = query_range(start_n, seq_len_q, seq_len_k, window_size, BLOCK_N, CAUSAL, WINDOW)
        doc_row, k_doc, ranges = document_ranges(documents, b, pid_n, offs_n, col_ok, ranges, DOCS)
        # The query tiles that touch a kept block of this key tile (the transposed mask, compacted on the host).
        kept, n_kept, block_row, stride_block_row = kept_blocks(blocks, h, pid_n, SPARSE)
        masking = (seq_len_q, seq_len_k, window_size, doc_row, block_row, stride_block_row)
        MASKS: tl.constexpr = (CAUSAL, WINDOW, DOCS, GATHER, SPARSE_BLOCK, False, RAGGED)
        dk, dv = _dkdv_query_range(
            (dk, dv), k, v, (offs_n, start_n, k_doc), q_head, do_head, qdo_strides, dq_head, row_stats, kept, n_kept,
            ranges, masking, rng, scales, BLOCK_M, BLOCK_N, HEAD_DIM, SPARSE, MASKS, ONE_LOOP,
            DROPOUT, UPCAST, INPUT_PRECISION, DQ_REDUCE, TMA,
        )  # fmt: skip

    dk_head, stride_dkt, stride_dkd = head_rows(DK, b, h, dk_strides)
    dv_head, stride_dvt, stride_dvd = head_rows(DV, b, h, dv_strides)
    dk = dk * softmax_scale
    if DROPOUT:  # dV = c·(P ∘ Z)ᵀ·dO: the keep-scale of every tile at once
        dv = dv * dropout_scale
    tl.store(
        dk_head + offs_n[:, None] * stride_dkt + offs_d[None, :] * stride_dkd,
        dk.to(DK.dtype.element_ty),
        mask=col_ok[:, None],
    )
    tl.store(
        dv_head + offs_n[:, None] * stride_dvt + offs_d[None, :] * stride_dvd,
        dv.to(DV.dtype.element_ty),
        mask=col_ok[:, None],
    )


@triton.jit
def _dq_tile(
    dq,
    q,
    do,
    rows,
    row_stats,
    k_src,
    v_src,
    start_n,
    masked_tile,
    masking,
    rng,
    scales,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKS: tl.constexpr,
    DROPOUT: tl.constexpr,
    UPCAST: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    TMA: tl.constexpr,
):
    """Accumulate dQ of one query tile over the key tile at start_n. k_src, v_src: tensor descriptors of this
    head's K and V (TMA), or pointers to the tile's Kᵀ and Vᵀ. masked_tile: whether the tile pays for the length
    mask and every mask (a constant, or decided per tile at run time; see `_dkdv_tiles`). rows, row_stats = (LSE·
    log2 e, δ) of the rows, masking, rng, scales and MASKS: as built by `flash_bwd_dq_kernel`."""
    offs_m, q_pos, q_doc, start_m = rows
    lse2, delta = row_stats
    seq_len_q, seq_len_k, window_size, doc_row, block_row, stride_block_row = masking
    qk_scale, dropout_scale = scales
    CAUSAL, WINDOW, DOCS, GATHER, SPARSE_BLOCK, _, RAGGED = MASKS  # EXTRA_MASKS acts on the loops, not on a tile
    offs_n = start_n + tl.arange(0, BLOCK_N)
    col_ok = offs_n < seq_len_k
    if TMA:  # rows past Tk arrive as zeros
        kT = tl.trans(k_src.load([start_n, 0]))
        vT = tl.trans(v_src.load([start_n, 0]))
    elif RAGGED:
        kT = tl.load(k_src, mask=col_ok[None, :], other=0.0)
        vT = tl.load(v_src, mask=col_ok[None, :], other=0.0)
    else:
        kT = tl.load(k_src)
        vT = tl.load(v_src)
    if UPCAST:
        kT = kT.to(tl.float32)
        vT = vT.to(tl.float32)

    s = tl.dot(q, kT, input_precision=INPUT_PRECISION)  # (BLOCK_M, BLOCK_N)
    if DROPOUT:  # drawn after the product is issued, so that ptxas overlaps the two (as in `_dkdv_tile`)
        keep = dropout_keep_mask(rng, start_m, start_n, seq_len_k, BLOCK_M, BLOCK_N)
    p = tl.exp2(s * qk_scale - lse2[:, None])
    # Loaded outside the branch so that the pipeline prefetches it (see the forward); dropped where unused.
    k_doc = tl.load(doc_row + offs_n, mask=col_ok, other=0)[None, :] if DOCS else 0
    if masked_tile:
        seen = visible(
            q_pos[:, None], offs_n[None, :], col_ok[None, :], window_size, q_doc, k_doc, CAUSAL, WINDOW, DOCS
        )
        if GATHER:  # the tile straddles blocks of the block mask
            in_range = (offs_m < seq_len_q)[:, None] & col_ok[None, :]
            seen = seen & block_visible(
                block_row, offs_m[:, None], offs_n[None, :], in_range, stride_block_row, SPARSE_BLOCK
            )
        p = tl.where(seen, p, 0.0)
    dp = tl.dot(do, vT, input_precision=INPUT_PRECISION)  # (BLOCK_M, BLOCK_N)
    if DROPOUT:  # dS = P ∘ (c·Z ∘ dP − δ)
        ds = p * tl.where(keep, dp * dropout_scale - delta[:, None], -delta[:, None])
    else:
        ds = p * (dp - delta[:, None])
    dq += tl.dot(ds.to(kT.dtype), tl.trans(kT), input_precision=INPUT_PRECISION)
    return dq


@triton.jit
def _dq_tiles(
    dq,
    q,
    do,
    rows,
    row_stats,
    k_head,
    v_head,
    kv_strides,
    kept,
    lo,
    hi,
    fast,
    masking,
    rng,
    scales,
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
    """Key tiles starting at lo, lo + BLOCK_N, ... below hi; INDEXED: the tiles kept[lo], ..., kept[hi − 1]. MASKED
    and fast: which tiles pay for the elementwise mask, as in `_dkdv_tiles`. k_head, v_head: this head's K and V, as
    tensor descriptors (TMA) or pointers with kv_strides = (stride_kt, stride_kd, stride_vt, stride_vd)."""
    stride_kt, stride_kd, stride_vt, stride_vd = kv_strides
    offs_d = tl.arange(0, HEAD_DIM)
    if INDEXED:
        for i in range(lo, hi):
            start_n = tl.multiple_of(tl.load(kept + i) * BLOCK_N, BLOCK_N)
            k_tile = k_head
            v_tile = v_head
            if not TMA:
                offs_n = start_n + tl.arange(0, BLOCK_N)
                k_tile = k_head + offs_n[None, :] * stride_kt + offs_d[:, None] * stride_kd  # (D, BLOCK_N)
                v_tile = v_head + offs_n[None, :] * stride_vt + offs_d[:, None] * stride_vd  # (D, BLOCK_N)
            dq = _dq_tile(
                dq, q, do, rows, row_stats, k_tile, v_tile, start_n, outside_fast(i, fast, MASKED), masking, rng,
                scales, BLOCK_M, BLOCK_N, MASKS, DROPOUT, UPCAST, INPUT_PRECISION, TMA,
            )  # fmt: skip
    elif TMA:
        for start_n in range(lo, hi, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            dq = _dq_tile(
                dq, q, do, rows, row_stats, k_head, v_head, start_n, outside_fast(start_n, fast, MASKED), masking, rng,
                scales, BLOCK_M, BLOCK_N, MASKS, DROPOUT, UPCAST, INPUT_PRECISION, TMA,
            )  # fmt: skip
    else:
        offs_n = lo + tl.arange(0, BLOCK_N)
        kT_ptrs = k_head + offs_n[None, :] * stride_kt + offs_d[:, None] * stride_kd  # (D, BLOCK_N)
        vT_ptrs = v_head + offs_n[None, :] * stride_vt + offs_d[:, None] * stride_vd  # (D, BLOCK_N)
        for start_n in range(lo, hi, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            dq = _dq_tile(
                dq, q, do, rows, row_stats, kT_ptrs, vT_ptrs, start_n, outside_fast(start_n, fast, MASKED), masking,
                rng, scales, BLOCK_M, BLOCK_N, MASKS, DROPOUT, UPCAST, INPUT_PRECISION, TMA,
            )  # fmt: skip
            kT_ptrs += BLOCK_N * stride_kt
            vT_ptrs += BLOCK_N * stride_vt
    return dq


@triton.jit
def _dq_key_range(
    dq,
    q,
    do,
    rows,
    row_stats,
    k_head,
    v_head,
    kv_strides,
    kept,
    n_kept,
    ranges,
    masking,
    rng,
    scales,
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
    """Key tiles of ranges = (lo, hi, full_lo, full_hi), split as in the forward: masked run, mask-free run, masked
    run (causal band or ragged tail). ONE_LOOP: the three runs are one loop (`launch.one_loop` says when)."""
    EXTRA_MASKS: tl.constexpr = MASKS[5]
    lead_start, fast_start, tail_start, tail_end = tile_runs(ranges, kept, n_kept, BLOCK_N, SPARSE, MASKS[3])
    if ONE_LOOP:
        dq = _dq_tiles(
            dq, q, do, rows, row_stats, k_head, v_head, kv_strides, kept, lead_start, tail_end,
            (fast_start, tail_start), masking, rng, scales, BLOCK_M, BLOCK_N, HEAD_DIM, "outside_fast", SPARSE, MASKS,
            DROPOUT, UPCAST, INPUT_PRECISION, TMA,
        )  # fmt: skip
    else:
        if EXTRA_MASKS:  # causal masking alone has no leading masked run (see the forward)
            dq = _dq_tiles(
                dq, q, do, rows, row_stats, k_head, v_head, kv_strides, kept, lead_start, fast_start, (0, 0), masking,
                rng, scales, BLOCK_M, BLOCK_N, HEAD_DIM, True, SPARSE, MASKS, DROPOUT, UPCAST, INPUT_PRECISION, TMA,
            )  # fmt: skip
        dq = _dq_tiles(
            dq, q, do, rows, row_stats, k_head, v_head, kv_strides, kept, fast_start, tail_start, (0, 0), masking,
            rng, scales, BLOCK_M, BLOCK_N, HEAD_DIM, False, SPARSE, MASKS, DROPOUT, UPCAST, INPUT_PRECISION, TMA,
        )  # fmt: skip
        dq = _dq_tiles(
            dq, q, do, rows, row_stats, k_head, v_head, kv_strides, kept, tail_start, tail_end, (0, 0), masking, rng,
            scales, BLOCK_M, BLOCK_N, HEAD_DIM, True, SPARSE, MASKS, DROPOUT, UPCAST, INPUT_PRECISION, TMA,
        )  # fmt: skip
    return dq


@triton.jit(do_not_specialize=["seed", "offset_lo", "offset_hi", "dropout_threshold", "window_size"])
def flash_bwd_dq_kernel(
    Q,
    K,
    V,
    DO,
    O,
    LSE,
    DLSE,
    Delta,
    DQ,
    q_strides,
    k_strides,
    v_strides,
    do_strides,
    dq_strides,
    o_strides,
    n_heads,
    seq_len_q,
    seq_len_k,
    softmax_scale,
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
    FUSED_DELTA: tl.constexpr,
    DROPOUT: tl.constexpr,
    UPCAST: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    TMA: tl.constexpr,
):
    # Scalars may arrive as Python floats baked in as fp64 constants (torch.compile does this); the math is fp32.
    softmax_scale = tl.cast(softmax_scale, tl.float32)
    qk_scale = tl.cast(qk_scale, tl.float32)
    dropout_scale = tl.cast(dropout_scale, tl.float32)
    # Causal query tiles near the end see the most key tiles: launch them first.
    n_blocks_m = tl.cdiv(seq_len_q, BLOCK_M)
    pid_m = (n_blocks_m - 1 - tl.program_id(0)) if CAUSAL else tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    q_head, stride_qt, stride_qd = head_rows(Q, b, h, q_strides)
    k_head, stride_kt, stride_kd = head_rows(K, b, h, k_strides)
    v_head, stride_vt, stride_vd = head_rows(V, b, h, v_strides)
    do_head, stride_dot, stride_dod = head_rows(DO, b, h, do_strides)

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len_q
    q_pos = offs_m + (seq_len_k - seq_len_q)
    q = tl.load(q_head + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)
    do = tl.load(do_head + offs_m[:, None] * stride_dot + offs_d[None, :] * stride_dod, mask=row_ok[:, None], other=0.0)
    lse2 = tl.load(LSE + bh.to(tl.int64) * seq_len_q + offs_m, mask=row_ok, other=0.0) * LOG2E
    delta_row = Delta + bh.to(tl.int64) * seq_len_q
    if FUSED_DELTA:
        # δ = rowsum(dO ∘ O) − dlse for this program's rows (a gradient dlse into the returned LSE adds dlse·P to
        # dS, the same as lowering δ by dlse), stored for the dK/dV kernel that runs next.
        o_head, stride_ot, stride_od = head_rows(O, b, h, o_strides)
        o = tl.load(o_head + offs_m[:, None] * stride_ot + offs_d[None, :] * stride_od, mask=row_ok[:, None], other=0.0)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
        if DLSE is not None:
            delta -= tl.load(DLSE + bh.to(tl.int64) * seq_len_q + offs_m, mask=row_ok, other=0.0)
        tl.store(delta_row + offs_m, delta, mask=row_ok)
    else:
        delta = tl.load(delta_row + offs_m, mask=row_ok, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    dq = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    if TMA:  # bulk tensor copies of whole key tiles; the descriptors' bounds zero-fill rows past Tk
        k_head = tl.make_tensor_descriptor(k_head, [seq_len_k, HEAD_DIM], [stride_kt, 1], [BLOCK_N, HEAD_DIM])
        v_head = tl.make_tensor_descriptor(v_head, [seq_len_k, HEAD_DIM], [stride_vt, 1], [BLOCK_N, HEAD_DIM])

    ranges = key_range(start_m, seq_len_q, seq_len_k, window_size, BLOCK_M, CAUSAL, WINDOW)
    doc_row, q_doc, ranges = document_ranges(documents, b, pid_m, q_pos, row_ok, ranges, DOCS)
    kept, n_kept, block_row, stride_block_row = kept_blocks(blocks, h, pid_m, SPARSE)
    # What the key tiles share, grouped as in the forward, plus the rows' LSE·log2 e and δ.
    rows = (offs_m, q_pos, q_doc, start_m)
    masking = (seq_len_q, seq_len_k, window_size, doc_row, block_row, stride_block_row)
    rng = (seed, offset_lo, offset_hi, bh, dropout_threshold)
    MASKS: tl.constexpr = (CAUSAL, WINDOW, DOCS, GATHER, SPARSE_BLOCK, EXTRA_MASKS, RAGGED)
    dq = _dq_key_range(
        dq, q, do, rows, (lse2, delta), k_head, v_head, (stride_kt, stride_kd, stride_vt, stride_vd), kept, n_kept,
        ranges, masking, rng, (qk_scale, dropout_scale), BLOCK_M, BLOCK_N, HEAD_DIM, SPARSE,
        MASKS, ONE_LOOP, DROPOUT, UPCAST, INPUT_PRECISION, TMA,
    )  # fmt: skip

    dq_head, stride_dqt, stride_dqd = head_rows(DQ, b, h, dq_strides)
    dq = dq * softmax_scale
    tl.store(
        dq_head + offs_m[:, None] * stride_dqt + offs_d[None, :] * stride_dqd,
        dq.to(DQ.dtype.element_ty),
        mask=row_ok[:, None],
    )
