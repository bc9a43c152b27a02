"""What the Gluon passes for Hopper (`flash_fwd_hopper.py`, `flash_bwd_dq_hopper.py`, `flash_bwd_dkdv_hopper.py`,
`flash_bwd_fused_hopper.py`) share: the layout of a warpgroup product's accumulator and of a shared-memory tile,
and tensor descriptors of one head's matrix, made on the host and read in the kernel."""

import functools

import torch
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import constexpr_function

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)


@constexpr_function
def mma_layout(num_warps, n):
    """The accumulator layout of a warpgroup product with n columns: warps split its rows."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16])


@constexpr_function
def tile_layout(rows, head_dim, dtype):
    """The shared-memory layout of a (rows, head_dim) tile that TMA fills and warpgroup products read."""
    return gl.NVMMASharedLayout.get_default_for([rows, head_dim], dtype)


@gluon.jit
def load_head_tile(desc, b, h, row, bar, dst):
    """TMA of rows [row, row + BLOCK) of head (b, h) from a (B, H, T, D) descriptor made by `head_descriptor` into
    the (BLOCK, D) buffer dst, completing on bar (whose expected bytes the caller sets); rows past T read as
    zeros."""
    tma.async_copy_global_to_shared(desc, [b, h, row, 0], bar, dst.reshape(desc.block_type.shape))


@gluon.jit
def store_head_tile(desc, b, h, row, src):
    """TMA of the (BLOCK, D) buffer src into rows [row, row + BLOCK) of head (b, h) of a (B, H, T, D) descriptor
    made by `head_descriptor`; rows past T are clipped. The caller fences src's writes before and waits for the
    store (`tma.store_wait`) before src is reused or the program ends."""
    tma.async_copy_shared_to_global(desc, [b, h, row, 0], src.reshape(desc.block_type.shape))


@builtin
def _async_tma_reduce_add(desc, coord, src, _semantic=None):
    """Hopper's bulk tensor reduce-add (cp.reduce.async.bulk.tensor .add) of shared memory src into desc's tile at
    coord. Triton has the operation (the Triton language's `atomic_add` on a descriptor lowers to it); Gluon does
    not export it."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, desc.handle, coord, src.handle)


@gluon.jit
def reduce_add_head_tile(desc, b, h, row, src):
    """Adds the (BLOCK, D) buffer src into rows [row, row + BLOCK) of head (b, h) of a (B, H, T, D) descriptor
    made by `head_descriptor`, in one bulk operation; rows past T are clipped. As for `store_head_tile`, the caller
    fences src's writes before and waits (`tma.store_wait`) before src is rewritten."""
    _async_tma_reduce_add(desc, [b, h, row, 0], src.reshape(desc.block_type.shape))


@gluon.jit
def tile_and_head(HEADS_FASTEST: gl.constexpr):
    """(tile, b · H + h) of this program, in a grid of (tiles, B·H), or with HEADS_FASTEST of (B·H, tiles)
    (`launch.heads_fastest`)."""
    if HEADS_FASTEST:
        tile, bh = gl.program_id(1), gl.program_id(0)
    else:
        tile, bh = gl.program_id(0), gl.program_id(1)
    return tile, bh


@gluon.jit
def long_walks_first(order, HEADS_FASTEST: gl.constexpr):
    """(tile, b · H + h) of this program under a block mask, from its walk order = (n_long, tiles in order)
    (`tile_schedule._long_walks_first`): in the order programs start (the grid's first axis fastest), the first
    n_long · B·H take the long walks' tiles, heads fastest, so that every head's long walks start first; the rest
    take the other tiles tile-fastest, head after head, which keeps a head's rows together in L2."""
    if HEADS_FASTEST:
        n_bh, n_tiles = gl.num_programs(0), gl.num_programs(1)
    else:
        n_tiles, n_bh = gl.num_programs(0), gl.num_programs(1)
    pid = gl.program_id(0) + gl.program_id(1) * gl.num_programs(0)
    n_long = gl.load(order)
    first = n_long * n_bh
    late = gl.maximum(pid - first, 0)
    n_rest = gl.maximum(n_tiles - n_long, 1)
    rank = gl.where(pid < first, pid // n_bh, n_long + late % n_rest)
    bh = gl.where(pid < first, pid % n_bh, late // n_rest)
    return gl.load(order + 1 + rank), bh


@gluon.jit
def query_tile_program(seq_len_q, n_heads, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr, HEADS_FASTEST: gl.constexpr):
    """(start_m, b, h, bh) of this program's query tile, for the passes whose programs own query rows: its tile
    (`tile_and_head`) counts query tiles, causal from the last, which sees the most key tiles, so that those launch
    first."""
    tile, bh = tile_and_head(HEADS_FASTEST)
    n_blocks_m = gl.cdiv(seq_len_q, BLOCK_M)
    pid_m = (n_blocks_m - 1 - tile) if CAUSAL else tile
    return pid_m * BLOCK_M, bh // n_heads, bh % n_heads, bh


@gluon.jit
def key_tiles(start_m, seq_len_q, seq_len_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """(n_tiles, n_full): key tiles [0, n_tiles) hold keys that query rows [start_m, start_m + BLOCK_M) see, and
    the first n_full of them are seen whole by every row (causal: aligned to the bottom right, n ≤ m + Tk − Tq)."""
    if CAUSAL:
        shift = seq_len_k - seq_len_q
        n_tiles = gl.cdiv(gl.minimum(start_m + BLOCK_M + shift, seq_len_k), BLOCK_N)
        n_full = (start_m + shift + 1) // BLOCK_N
    else:
        n_tiles = gl.cdiv(seq_len_k, BLOCK_N)
        n_full = seq_len_k // BLOCK_N
    return n_tiles, n_full


@gluon.jit
def split_runs(lo, hi, full_lo, full_hi, TILE: gl.constexpr):
    """Columns [lo, hi), of which [full_lo, full_hi) are seen by every row (all ≥ 0), as runs of tile indices
    (t_lo, a, b, t_hi): [t_lo, a) masked, [a, b) mask-free, [b, t_hi) masked, at least one tile
    (`tile_ranges.split_tiles`)."""
    t_lo = lo // TILE
    t_hi = gl.maximum(gl.cdiv(hi, TILE), t_lo + 1)
    a = gl.minimum(gl.maximum(gl.cdiv(full_lo, TILE), t_lo), t_hi)
    b = gl.maximum(gl.minimum(full_hi, hi) // TILE, a)
    return t_lo, a, b, t_hi


@gluon.jit
def load_range(ranges):
    """The (lo, hi, full_lo, full_hi) a documents schedule holds for one tile (`tile_schedule.py`)."""
    return gl.load(ranges), gl.load(ranges + 1), gl.load(ranges + 2), gl.load(ranges + 3)


@gluon.jit
def masked_key_runs(
    start_m,
    seq_len_q,
    seq_len_k,
    window_size,
    doc_range,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    WINDOW: gl.constexpr,
    DOCS: gl.constexpr,
):
    """The key tiles of query rows [start_m, start_m + BLOCK_M) under causal masking (query row i, at position
    p = i + Tk − Tq, sees keys j ≤ p) and a sliding window (p − W < j) and/or documents (doc_range: the tile's
    column ranges, `load_range`), as `split_runs` (`tile_ranges.key_range` and `intersect_ranges`)."""
    shift = seq_len_k - seq_len_q
    first = shift + start_m  # the positions of the tile's first and last in-bounds rows
    last = shift + gl.minimum(start_m + BLOCK_M, seq_len_q) - 1
    lo = first * 0
    full_lo = lo
    hi = last + 1
    full_hi = first + 1
    if WINDOW:
        lo = gl.maximum(first - window_size + 1, 0)
        full_lo = gl.maximum(last - window_size + 1, 0)
    if DOCS:
        doc_lo, doc_hi, doc_full_lo, doc_full_hi = doc_range
        lo = gl.maximum(lo, doc_lo)
        hi = gl.minimum(hi, doc_hi)
        full_lo = gl.maximum(full_lo, doc_full_lo)
        full_hi = gl.minimum(full_hi, doc_full_hi)
    return split_runs(lo, hi, full_lo, full_hi, BLOCK_N)


@gluon.jit
def tile_documents(documents, b, tile):
    """(docs, doc_range) of tile `tile` of this tiling under documents = (DocIds, stride_doc, DocRanges,
    stride_ranges): the batch's document ids and the tile's ranges in their schedule (`load_range`); (0, 0) where
    DocIds is None."""
    DocIds, stride_doc, DocRanges, stride_ranges = documents
    if DocIds is not None:
        docs = DocIds + b.to(gl.int64) * stride_doc
        doc_range = load_range(DocRanges + b.to(gl.int64) * stride_ranges + tile * 4)
    else:
        docs = 0
        doc_range = 0
    return docs, doc_range


@gluon.jit
def tile_kept_list(blocks, h, tile):
    """(kept, n_kept) of tile `tile` of this tiling for head h under a block mask blocks = (KeptCount,
    stride_count_h, KeptIndex, stride_index_h, stride_index_r), as the Triton passes take it without its block mask:
    the ascending list kept[0:n_kept] of the tiles it keeps (`tile_schedule.py`); (0, 0) where KeptIndex is None."""
    KeptCount, stride_count_h, KeptIndex, stride_index_h, stride_index_r = blocks
    if KeptIndex is not None:
        kept = KeptIndex + h * stride_index_h + tile * stride_index_r
        n_kept = gl.load(KeptCount + h * stride_count_h + tile)
    else:
        kept = 0
        n_kept = 0
    return kept, n_kept


@gluon.jit
def masked_query_tile(
    start_m,
    b,
    h,
    seq_len_q,
    seq_len_k,
    masks,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    WINDOW: gl.constexpr,
):
    """For a pass whose programs own query tile [start_m, start_m + BLOCK_M) of head (b, h), under masks (causal; a
    sliding window, documents and a block mask: the kernel's masks = (window_size, documents, blocks), as
    `tile_documents` and `tile_kept_list` take the last two, with their schedules for this tiling): (docs, kept,
    runs), the batch's document ids (0 without), the tile's kept-tile list (kept, n_kept) ((0, 0) without a block
    mask), and its key tiles' runs (`masked_key_runs`; under a block mask as positions in the list, `kept_runs`)."""
    window_size, documents, blocks = masks
    DOCS: gl.constexpr = documents[0] is not None
    row_tile = start_m // BLOCK_M
    docs, doc_range = tile_documents(documents, b, row_tile)
    runs = masked_key_runs(start_m, seq_len_q, seq_len_k, window_size, doc_range, BLOCK_M, BLOCK_N, WINDOW, DOCS)
    kept = tile_kept_list(blocks, h, row_tile)
    if blocks[0] is not None:
        runs = kept_runs(runs, kept[0], kept[1])
    return docs, kept, runs


@gluon.jit
def lower_bound(sorted_ptr, n, value):
    """The first position in the ascending sorted_ptr[0:n] whose entry is ≥ value (n if none): binary search."""
    lo = n * 0
    hi = n
    while lo < hi:
        mid = (lo + hi) // 2
        below = gl.load(sorted_ptr + mid) < value
        lo = gl.where(below, mid + 1, lo)
        hi = gl.where(below, hi, mid)
    return lo


@gluon.jit
def kept_runs(runs, kept, n_kept):
    """Runs of tile indices (`split_runs`) as positions in the ascending list kept[0:n_kept] of the tiles a block
    mask keeps (`tile_schedule.py`): the walk visits only those."""
    t_lo, a, b, t_hi = runs
    first = lower_bound(kept, n_kept, t_lo)
    return first, lower_bound(kept, n_kept, a), lower_bound(kept, n_kept, b), lower_bound(kept, n_kept, t_hi)


@gluon.jit
def kept_tile(kept, n_kept, position):
    """The tile at `position` of a kept-tile list; a walk with no kept tile still takes one step, fully masked, on
    tile 0 (`kept_runs`' callers mask every position outside their runs)."""
    return gl.load(kept + gl.minimum(gl.maximum(position, 0), gl.maximum(n_kept - 1, 0)), mask=n_kept > 0, other=0)


@functools.cache
def _descriptor_layout(dtype: torch.dtype, rows: int, head_dim: int) -> gl.NVMMASharedLayout:
    element = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}[dtype]
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, head_dim], element)


def head_descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A host-made tensor descriptor of t (B, H, T, D) in tiles of (1, 1, rows, D): one head's rows, those past T
    read as zeros. Made on the host, it reaches the kernel as a launch parameter: a descriptor made in the kernel
    costs every program a global-memory round trip before its first load, which at 1K-4K tokens cost the forward
    10-30% (`results/tuning/h200-2026-11-27-gluon-fwd/`)."""
    layout = _descriptor_layout(t.dtype, rows, t.shape[-1])
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, t.shape[-1]], layout)
