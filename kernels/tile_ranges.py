"""Mask helpers shared by the forward and both backward kernels: which tiles to visit, and which elements to keep.

The semantics are those of `flashgpt.attention_masks` (query i at absolute position p = Tk − Tq + i; causal j <= p;
window p − W < j, and j < p + W without causal; same document id; kept block). A program owns one tile of rows
and walks tiles of columns. For each mask it computes, from scalars only, two column ranges:

    [lo, hi)            columns that SOME row of the tile may see: tiles outside it are never loaded
    [full_lo, full_hi)  columns that EVERY row of the tile sees: tiles inside it skip the elementwise mask

`split_tiles` turns the two ranges into three runs of tiles: masked, mask-free, masked. Only the masked runs pay
for `visible` (a handful of integer compares per element); the mask-free run is the dense kernel's fast path.
Under a block mask a program walks an ascending list of kept tiles instead; `lower_bound` finds where the three
runs start in it, so the list splits the same way. A pass walks the runs in three loops, or in one where its loops
are short (`launch.one_loop`), each tile then testing whether it lies outside the mask-free run (`outside_fast`).
"""

import triton
import triton.language as tl


@triton.jit
def key_range(
    start_m,
    seq_len_q,
    seq_len_k,
    window_size,
    BLOCK_M: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
):
    """Key ranges (lo, hi, full_lo, full_hi) for the query tile [start_m, start_m + BLOCK_M)."""
    offset = seq_len_k - seq_len_q
    first = offset + start_m  # absolute position of the tile's first and last (in-bounds) query
    last = offset + tl.minimum(start_m + BLOCK_M, seq_len_q) - 1
    lo = first * 0
    full_lo = lo
    hi = lo + seq_len_k
    full_hi = hi
    if CAUSAL:  # j <= p
        hi = tl.minimum(hi, last + 1)
        full_hi = tl.minimum(full_hi, first + 1)
    if WINDOW:  # p − W < j, and j < p + W without causal
        lo = tl.maximum(lo, first - window_size + 1)
        full_lo = tl.maximum(full_lo, last - window_size + 1)
        if not CAUSAL:
            hi = tl.minimum(hi, last + window_size)
            full_hi = tl.minimum(full_hi, first + window_size)
    return lo, hi, full_lo, full_hi


@triton.jit
def query_range(
    start_n,
    seq_len_q,
    seq_len_k,
    window_size,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
):
    """Query-index ranges (lo, hi, full_lo, full_hi) for the key tile [start_n, start_n + BLOCK_N): the same
    inequalities as `key_range`, solved for i = p − (Tk − Tq) instead of j."""
    offset = seq_len_k - seq_len_q
    first = start_n - offset  # the tile's first and last (in-bounds) key, in query-index coordinates
    last = tl.minimum(start_n + BLOCK_N, seq_len_k) - 1 - offset
    lo = first * 0
    full_lo = lo
    hi = lo + seq_len_q
    full_hi = hi
    if CAUSAL:  # i >= j − offset
        lo = tl.maximum(lo, first)
        full_lo = tl.maximum(full_lo, last)
    if WINDOW:  # i < j − offset + W, and i > j − offset − W without causal
        hi = tl.minimum(hi, last + window_size)
        full_hi = tl.minimum(full_hi, first + window_size)
        if not CAUSAL:
            lo = tl.maximum(lo, first - window_size + 1)
            full_lo = tl.maximum(full_lo, last - window_size + 1)
    return lo, hi, full_lo, full_hi


@triton.jit
def intersect_ranges(lo, hi, full_lo, full_hi, other_lo, other_hi, other_full_lo, other_full_hi):
    """Both masks hold: the visible ranges and the fully visible ranges intersect."""
    return (
        tl.maximum(lo, other_lo),
        tl.minimum(hi, other_hi),
        tl.maximum(full_lo, other_full_lo),
        tl.minimum(full_hi, other_full_hi),
    )


@triton.jit
def load_ranges(ranges_ptr):
    """The four int32 (lo, hi, full_lo, full_hi) that the host stored for one tile (see `tile_schedule.py`)."""
    return tl.load(ranges_ptr), tl.load(ranges_ptr + 1), tl.load(ranges_ptr + 2), tl.load(ranges_ptr + 3)


@triton.jit
def document_ranges(documents, b, tile, positions, in_bounds, ranges, DOCS: tl.constexpr):
    """(doc_row, docs, ranges) for tile `tile` of batch row b under documents = (DocIds, stride_doc_b, DocRanges,
    stride_ranges_b): the row's document ids, those of `positions` (a column; 0 where not in_bounds), and `ranges`
    (lo, hi, full_lo, full_hi) intersected with the tile's in the documents' schedule for this tiling. Without
    DOCS: (0, 0, ranges), placeholders that nothing reads (a tuple cannot hold the None that DocIds is)."""
    DocIds, stride_doc_b, DocRanges, stride_ranges_b = documents
    if DOCS:
        doc_row = DocIds + b.to(tl.int64) * stride_doc_b
        docs = tl.load(doc_row + positions, mask=in_bounds, other=0)[:, None]
        doc_lo, doc_hi, doc_full_lo, doc_full_hi = load_ranges(DocRanges + b * stride_ranges_b + tile * 4)
        lo, hi, full_lo, full_hi = ranges
        ranges = intersect_ranges(lo, hi, full_lo, full_hi, doc_lo, doc_hi, doc_full_lo, doc_full_hi)
    else:
        doc_row = 0
        docs = 0
    return doc_row, docs, ranges


@triton.jit
def kept_blocks(blocks, h, tile, SPARSE: tl.constexpr):
    """(kept, n_kept, block_row, stride_block_row) for tile `tile` of head h under a block mask blocks = (KeptCount,
    stride_count_h, KeptIndex, stride_index_h, stride_index_r, BlockMask, stride_block_h, stride_block_row): the
    ascending list kept[0:n_kept] of the tiles of the other axis that touch a kept block of this tile (built on the
    host; head strides are 0 where one mask serves every head), and the head's block mask, in rows of
    stride_block_row. Without SPARSE: (0, 0, 0, stride_block_row), placeholders that nothing reads."""
    KeptCount, stride_count_h, KeptIndex, stride_index_h, stride_index_r, BlockMask, stride_block_h, stride_row = blocks
    if SPARSE:
        n_kept = tl.load(KeptCount + h * stride_count_h + tile)
        kept = KeptIndex + h * stride_index_h + tile * stride_index_r
        block_row = BlockMask + h * stride_block_h
    else:
        n_kept = 0
        kept = 0
        block_row = 0
    return kept, n_kept, block_row, stride_row


@triton.jit
def split_tiles(lo, hi, full_lo, full_hi, TILE: tl.constexpr):
    """Tile starts [start, a) masked, [a, b) mask-free, [b, hi) masked, covering [lo, hi); start, and a and b when
    the mask-free run is not empty, are multiples of TILE.

    A tile is mask-free only if it lies wholly inside both [full_lo, full_hi) and [lo, hi); callers pass hi <= the
    number of columns, so mask-free tiles never read out of bounds. lo and full_lo are >= 0 here (they only grow
    from 0), so the divisions below round down."""
    start = lo // TILE * TILE
    hi = tl.where(hi > lo, hi, start)  # an empty range visits nothing, not the tile holding lo
    # Without a mask-free run, a = b and the two masked runs [start, a) and [a, hi) cover the range. Clamping
    # (rather than selecting start for a and b) matters on Hopper: a run bound that is a select on "no mask-free
    # run" lets LLVM turn the accumulators after the first loop into selects, and ptxas then serialises the
    # loop's wgmma pipeline (warning C7515), which cost the dK/dV pass 9-13%.
    a = tl.minimum(tl.maximum((full_lo + TILE - 1) // TILE * TILE, start), hi)
    b = tl.maximum(tl.minimum(tl.maximum(full_hi, 0) // TILE * TILE, hi // TILE * TILE), a)
    return start, a, b, hi


@triton.jit
def tile_runs(ranges, kept, n_kept, TILE: tl.constexpr, SPARSE: tl.constexpr, GATHER: tl.constexpr):
    """The three runs a program walks over the tiles of ranges = (lo, hi, full_lo, full_hi) (`split_tiles`): masked,
    mask-free, masked, as four bounds (lead_start, fast_start, tail_start, tail_end). They are tile starts; under a
    block mask (SPARSE), positions in the ascending list kept[0:n_kept] of the tiles it keeps. GATHER: a kept tile
    may still hold dropped pairs, so every tile is masked (the mask-free run is empty)."""
    lo, hi, full_lo, full_hi = ranges
    start, fast_lo, fast_hi, end = split_tiles(lo, hi, full_lo, full_hi, TILE)
    if SPARSE:
        if GATHER:
            fast_lo = start
            fast_hi = start
        bounds = (
            lower_bound(kept, n_kept, start // TILE),
            lower_bound(kept, n_kept, fast_lo // TILE),
            lower_bound(kept, n_kept, fast_hi // TILE),
            lower_bound(kept, n_kept, tl.cdiv(end, TILE)),
        )
    else:
        bounds = (start, fast_lo, fast_hi, end)
    return bounds


@triton.jit
def outside_fast(position, fast, MASKED: tl.constexpr):
    """Whether the tile at this loop position applies the elementwise mask. MASKED: False (no tile does), True (every
    tile does) or "outside_fast" (the tiles at positions outside fast = (fast_lo, fast_hi), the mask-free run, which
    lets one loop walk all three runs)."""
    if MASKED == "outside_fast":
        return (position < fast[0]) | (position >= fast[1])
    else:
        return MASKED


@triton.jit
def visible(
    q_pos,
    k_idx,
    in_bounds,
    window_size,
    q_doc,
    k_doc,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    DOCS: tl.constexpr,
):
    """Elementwise visibility of query positions q_pos against key indices k_idx (any broadcastable shapes)."""
    keep = in_bounds
    if CAUSAL:
        keep = keep & (k_idx <= q_pos)
    if WINDOW:
        keep = keep & (q_pos - window_size < k_idx)
        if not CAUSAL:
            keep = keep & (k_idx < q_pos + window_size)
    if DOCS:
        keep = keep & (q_doc == k_doc)
    return keep


@triton.jit
def block_visible(block_row, q_idx, k_idx, in_bounds, stride_row, BLOCK_SIZE: tl.constexpr):
    """block_mask[h, i // block_size, j // block_size] per element, for tiles that straddle blocks; block_row is
    the head's mask (uint8, rows of stride_row). Out-of-bounds elements read nothing and are not visible."""
    kept = tl.load(block_row + (q_idx // BLOCK_SIZE) * stride_row + k_idx // BLOCK_SIZE, mask=in_bounds, other=0)
    return in_bounds & (kept != 0)


@triton.jit
def lower_bound(sorted_ptr, n, value):
    """The first position in the ascending sorted_ptr[0:n] whose entry is >= value (n if none): binary search."""
    lo = n * 0
    hi = n
    while lo < hi:
        mid = (lo + hi) // 2
        below = tl.load(sorted_ptr + mid) < value
        lo = tl.where(below, mid + 1, lo)
        hi = tl.where(below, hi, mid)
    return lo
