"""Tile schedules for the data-dependent masks, built once per batch and shared by every pass of every layer.

Causal and window masks are functions of the tile's coordinates, so the kernels derive their loop bounds from
scalars (`tile_ranges.py`). Document ids and block masks are data. A pass whose programs own a tile of rows (queries, or
keys for the passes in KEY_ROW_PASSES) and walk tiles of columns reads, for its tiling (rows, row tile, column
tile) and per row tile:

- documents: (B, n_row_tiles, 4) int32 (lo, hi, full_lo, full_hi), the column range holding every column that
  shares an id with some row of the tile, and the range whose columns all share the one id of every row (empty
  unless the tile lies in a single document whose columns are contiguous, as they are in packed sequences);
- block-sparse: how many column tiles touch a kept block (counts, (H or 1, n_row_tiles)) and their indices in
  ascending order (indices, (H or 1, n_row_tiles, n_col_tiles)), compacted like FlexAttention's kv_num_blocks /
  kv_indices, so a program loops over those tiles only. When the tiles divide block_size (the launcher shrinks
  them to make it so when block_size is a multiple of 16) a tile lies in one block and is kept or dropped whole;
  otherwise a kept tile may hold dropped pairs, and the kernel also looks the block mask up per element
  (`block_exact` is False). For tiles of keys also the order their programs start in (order, (n_row_tiles + 1,)):
  how many walks are long, those tiles longest first, then the others in ascending order (`_long_walks_first`).

These take a few dozen small tensor operations, each a kernel launch on a GPU, which is why `FlashMask` builds them
once per batch (FlexAttention's BlockMask plays the same role) for every tiling the passes launch with, and packs
them into one int32 tensor: the `torch.library` operators take it as a tensor argument, with the tilings as a list
of ints, so they run no schedule operation themselves and a compiled model builds the schedule once per forward.
"""

import functools
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from .tuning import KEY_ROW_PASSES, LaunchConfig

TileKey = tuple[str, int, int]  # (rows: "queries" or "keys", rows per tile, columns per tile)
ROWS = ("queries", "keys")  # a TileKey's rows, encoded by position in the operators' schedule_tiles
# Every tensor in a schedule starts on a 16-byte boundary (4 int32 entries), as a tensor of its own would: Triton
# specialises kernels on their pointers' 16-byte alignment, so views at other offsets would compile other variants.
ALIGN = 4


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _aligned_size(shape: tuple[int, ...]) -> int:
    """Entries a tensor of `shape` takes in a schedule, padding included."""
    return _cdiv(math.prod(shape), ALIGN) * ALIGN


def _aligned(piece: Tensor) -> Tensor:
    """piece flattened and zero-padded to `_aligned_size`."""
    flat = piece.reshape(-1)
    pad = -flat.numel() % ALIGN
    return F.pad(flat, (0, pad)) if pad else flat


def tile_key(kernel_pass: str, cfg: LaunchConfig) -> TileKey:
    """The tiling that `kernel_pass` walks when launched with `cfg`."""
    if kernel_pass in KEY_ROW_PASSES:
        return ("keys", cfg.block_n, cfg.block_m)
    return ("queries", cfg.block_m, cfg.block_n)


def describe_tiles(tiles: tuple[TileKey, ...]) -> str:
    return ", ".join(f"{rows} {row_tile}x{col_tile}" for rows, row_tile, col_tile in tiles) or "none"


def effective_window(window_size: int | None, seq_len_k: int) -> int | None:
    """A window of Tk or more keys masks nothing, so it is dropped (which also keeps p ± W within int32)."""
    return None if window_size is not None and window_size >= seq_len_k else window_size


View = tuple[tuple[int, ...], tuple[int, ...], int]  # (shape, strides, offset) of one tensor in a schedule


@functools.lru_cache(maxsize=256)
def schedule_layout(
    seq_len_q: int, seq_len_k: int, id_rows: int | None, mask_heads: int | None, tiles: tuple[TileKey, ...]
) -> tuple[dict[TileKey, tuple[View, ...]], int]:
    """Where each tiling's tensors lie in a schedule, and its total length: documents' ranges (id_rows, row tiles,
    4) if there are document ids (of id_rows rows), then kept-tile counts (heads, row tiles) and indices (heads,
    row tiles, column tiles) if there is a block mask (of mask_heads heads), and for tiles of keys their walk order
    (row tiles + 1). Pure integers, so computed once per shape rather than in every pass of every call."""
    layout: dict[TileKey, tuple[View, ...]] = {}
    offset = 0
    for key in tiles:
        rows, row_tile, col_tile = key
        n_rows, n_cols = (seq_len_q, seq_len_k) if rows == "queries" else (seq_len_k, seq_len_q)
        n_row_tiles, n_col_tiles = _cdiv(n_rows, row_tile), _cdiv(n_cols, col_tile)
        shapes: list[tuple[int, ...]] = []
        if id_rows is not None:
            shapes.append((id_rows, n_row_tiles, 4))
        if mask_heads is not None:
            shapes += [(mask_heads, n_row_tiles), (mask_heads, n_row_tiles, n_col_tiles)]
            if rows == "keys":
                shapes.append((n_row_tiles + 1,))
        views = []
        for shape in shapes:
            strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
            views.append((shape, strides, offset))
            offset += _aligned_size(shape)
        layout[key] = tuple(views)
    return layout, offset


def canonical_document_ids(document_ids: Tensor) -> Tensor:
    """(B, Tk) int32: for each position, the first position of its row that carries the same id. Two positions get
    equal values exactly where their ids are equal, so the kernels compare one 32-bit word per pair: int64 ids took
    two compares an element, and the masked steps ran out of predicate registers (ptxas packed the comparisons'
    bits into a register, three more instructions an element)."""
    sorted_ids, order = torch.sort(document_ids, dim=1, stable=True)
    return order.gather(1, torch.searchsorted(sorted_ids, document_ids)).to(torch.int32)


def _document_spans(row_ids: Tensor, col_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per row of row_ids (B, R) against col_ids (B, C): the first column carrying its id (C if none), one past
    the last (0 if none), and whether exactly the columns in between carry it. Ids need not be sorted."""
    n_cols = col_ids.shape[1]
    # Within each group of equal ids the stable sort keeps column order, so a group's first and last entries are
    # the first and last column carrying that id.
    sorted_ids, order = torch.sort(col_ids, dim=1, stable=True)
    left = torch.searchsorted(sorted_ids, row_ids)
    right = torch.searchsorted(sorted_ids, row_ids, right=True)
    present = right > left
    first = order.gather(1, left.clamp(max=n_cols - 1))
    last = order.gather(1, (right - 1).clamp(min=0))
    contiguous = present & (last - first + 1 == right - left)
    return torch.where(present, first, n_cols), torch.where(present, last + 1, 0), contiguous


def _document_tile_ranges(row_ids: Tensor, spans: tuple[Tensor, Tensor, Tensor], tile: int) -> Tensor:
    """(B, ceil(R / tile), 4) int32 (lo, hi, full_lo, full_hi) per tile of rows, from `_document_spans`."""
    first, end, contiguous = spans
    batch, n_rows = row_ids.shape
    n_tiles = _cdiv(n_rows, tile)
    per_row = torch.stack([first, end, row_ids.to(first.dtype), contiguous.to(first.dtype)], dim=-1)
    # Pad the last tile by repeating the last row: neutral for min, max and "every row carries one id".
    pad = torch.arange(n_tiles * tile, device=row_ids.device).clamp(max=n_rows - 1)
    tiled = per_row[:, pad].view(batch, n_tiles, tile, 4)
    lo, hi = tiled[..., 0].amin(-1), tiled[..., 1].amax(-1)
    ids = tiled[..., 2]
    one_doc = (ids.amin(-1) == ids.amax(-1)) & (tiled[:, :, 0, 3] != 0)
    full_lo, full_hi = torch.where(one_doc, lo, 0), torch.where(one_doc, hi, 0)
    return torch.stack([lo, hi, full_lo, full_hi], dim=-1).to(torch.int32)


def _block_prefix(block_mask: Tensor) -> Tensor:
    """2-D prefix sums (H, n + 1, m + 1) of an (H, n, m) block mask: [h, i, j] counts the kept blocks above-left.
    The prefix sums of the transposed mask are its transpose."""
    return F.pad(block_mask.to(torch.int32).cumsum(1).cumsum(2), (1, 0, 1, 0))


def _tile_blocks(length: int, tile: int, block_size: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """For each tile of `tile` positions out of `length`: its first block and one past its last block."""
    starts = torch.arange(0, length, tile, device=device)
    ends = (starts + tile).clamp(max=length)
    return starts // block_size, (ends - 1) // block_size + 1


def _kept_tile_lists(
    prefix: Tensor, row_blocks: tuple[Tensor, Tensor], col_blocks: tuple[Tensor, Tensor]
) -> tuple[Tensor, Tensor]:
    """From the prefix sums of a block mask and the blocks each row and column tile spans (`_tile_blocks`): counts
    (H, R) int32 of the column tiles that overlap a kept block, per row tile, and indices (H, R, C) int32 whose
    first counts[h, r] entries are those column tiles in ascending order (R, C: the numbers of row and column
    tiles)."""
    (r0, r1), (c0, c1) = row_blocks, col_blocks
    r0, r1, c0, c1 = r0[:, None], r1[:, None], c0[None, :], c1[None, :]
    kept = (prefix[:, r1, c1] - prefix[:, r0, c1] - prefix[:, r1, c0] + prefix[:, r0, c0]) > 0
    counts = kept.sum(-1, dtype=torch.int32)
    # A stable sort of "dropped" (0 for kept) moves the kept tiles to the front and keeps them in order.
    indices = torch.argsort((~kept).to(torch.uint8), dim=-1, stable=True)
    return counts, indices.to(torch.int32)


def _long_walks_first(counts: Tensor) -> Tensor:
    """(R + 1,) int32 from the kept-tile counts (H, R) of a block mask's tiles of keys: n_long, the number of key
    tiles whose longest walk (over heads) exceeds twice the mean, then every key tile, those n_long first, longest
    first, and the rest in ascending order. A pattern with a global column (local + global: every query sees the
    first keys) has a few walks across all of T among walks of a few tiles; launched with the rest of their head,
    the last heads' long walks would start last and finish long after everything else (the dK/dV pass under local
    + global ran 1.55x faster with them first). Built on the device, with no synchronisation."""
    walks = counts.amax(0)
    n_tiles = walks.numel()
    long = walks > 2 * walks.sum() / n_tiles
    position = torch.arange(n_tiles, device=counts.device, dtype=walks.dtype)
    order = torch.argsort(torch.where(long, -walks, n_tiles + position), stable=True)
    return torch.cat([long.sum(dtype=torch.int32).reshape(1), order.to(torch.int32)])


@dataclass(frozen=True)
class TileSchedule:
    """One tiling's schedule as the kernels read it (see the module docstring); None where a mask is not given."""

    ranges: Tensor | None
    counts: Tensor | None
    indices: Tensor | None
    order: Tensor | None


@dataclass(frozen=True, eq=False)
class FlashMask:
    """The masks of one batch and their tile schedules for the tilings in `tiles`, which `attention_op.flash_mask`
    builds for the tiles the passes launch with. Pass it to every call with these masks: `flash_attention(q, k, v,
    mask=...)`; the operators get it back from `operator_args`.

    window_size is None or < Tk; document_ids (B, Tk) with unit stride (`build` makes them int32,
    `canonical_document_ids`) and block_mask (H or 1, ceil(Tq / block_size), ceil(Tk / block_size)) bool,
    contiguous, both on one device. schedule: every tiling's tensors, flattened one after another in the order of
    `tiles` (documents' ranges, then kept-tile counts and indices, each padded to a multiple of ALIGN entries); None
    without documents and block mask. passes: those the tiles were chosen for (flash_mask's `backward`)."""

    seq_len_q: int = 0
    seq_len_k: int = 0
    window_size: int | None = None
    document_ids: Tensor | None = None
    block_mask: Tensor | None = None
    block_size: int = 128
    schedule: Tensor | None = None
    tiles: tuple[TileKey, ...] = ()
    passes: tuple[str, ...] = ()
    # Each tiling's views, made on first use: a mask built once per batch serves every layer's passes.
    _views: dict[TileKey, "TileSchedule"] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def build(
        cls,
        seq_len_q: int,
        seq_len_k: int,
        tiles: tuple[TileKey, ...],
        *,
        window_size: int | None = None,
        document_ids: Tensor | None = None,
        block_mask: Tensor | None = None,
        block_size: int = 128,
        passes: tuple[str, ...] = (),
    ) -> "FlashMask":
        """The schedules of (validated) masks for each tiling in `tiles`; what several tilings share is built once."""
        tiles = tuple(dict.fromkeys(tiles)) if document_ids is not None or block_mask is not None else ()
        length = {"queries": seq_len_q, "keys": seq_len_k}

        def at(rows: str) -> str:
            """The positions rows sit at: in self-attention queries and keys share theirs (and their ids)."""
            return "queries" if seq_len_q == seq_len_k else rows

        if document_ids is not None:
            document_ids = canonical_document_ids(document_ids)  # int32, unit stride, as the kernels read them
            query_ids = document_ids[:, seq_len_k - seq_len_q :].contiguous()
            ids = {"queries": (query_ids, document_ids), "keys": (document_ids, query_ids)}  # (rows, columns)
            spans: dict[str, tuple[Tensor, Tensor, Tensor]] = {}
            ranges: dict[tuple[str, int], Tensor] = {}  # by (positions, row tile): the column tile does not matter
        if block_mask is not None:
            block_mask = block_mask.contiguous()
            prefix = _block_prefix(block_mask)
            spanned: dict[tuple[str, int], tuple[Tensor, Tensor]] = {}  # the blocks each tile spans

            def tile_blocks(rows: str, tile: int) -> tuple[Tensor, Tensor]:
                if (at(rows), tile) not in spanned:
                    spanned[at(rows), tile] = _tile_blocks(length[rows], tile, block_size, block_mask.device)
                return spanned[at(rows), tile]

        pieces: list[Tensor] = []
        for rows, row_tile, col_tile in tiles:
            if document_ids is not None:
                if (at(rows), row_tile) not in ranges:
                    if at(rows) not in spans:
                        spans[at(rows)] = _document_spans(*ids[rows])
                    ranges[at(rows), row_tile] = _document_tile_ranges(ids[rows][0], spans[at(rows)], row_tile)
                pieces.append(ranges[at(rows), row_tile])
            if block_mask is not None:
                cols = "keys" if rows == "queries" else "queries"
                rows_prefix = prefix if rows == "queries" else prefix.transpose(1, 2)
                tile_spans = (tile_blocks(rows, row_tile), tile_blocks(cols, col_tile))
                counts, indices = _kept_tile_lists(rows_prefix, *tile_spans)
                pieces += [counts, indices, _long_walks_first(counts)] if rows == "keys" else [counts, indices]
        schedule = torch.cat([_aligned(piece) for piece in pieces]) if pieces else None
        window_size = effective_window(window_size, seq_len_k)
        return cls(seq_len_q, seq_len_k, window_size, document_ids, block_mask, block_size, schedule, tiles, passes)

    def operator_args(self) -> tuple:
        """(window_size, document_ids, block_mask, block_size, schedule, schedule_tiles) as the operators take
        them; schedule_tiles lists each tiling as three ints (rows as its position in ROWS, row tile, col tile)."""
        encoded = [n for rows, row_tile, col_tile in self.tiles for n in (ROWS.index(rows), row_tile, col_tile)]
        masks = (self.window_size, self.document_ids, self.block_mask, self.block_size)
        return (*masks, self.schedule, encoded or None)

    @classmethod
    def from_operator_args(
        cls,
        seq_len_q: int,
        seq_len_k: int,
        window_size: int | None,
        document_ids: Tensor | None,
        block_mask: Tensor | None,
        block_size: int,
        schedule: Tensor | None,
        schedule_tiles: list[int] | None,
    ) -> "FlashMask":
        """The operators' mask arguments as one FlashMask, after checking that the schedule holds exactly what
        its tilings need (so a schedule built for other shapes fails here rather than being misread)."""
        encoded = schedule_tiles or []
        tiles = tuple((ROWS[encoded[i]], encoded[i + 1], encoded[i + 2]) for i in range(0, len(encoded), 3))
        # The kernels read ids with unit stride and block-mask rows with unit column stride.
        document_ids = document_ids.contiguous() if document_ids is not None else None
        block_mask = block_mask.contiguous() if block_mask is not None else None
        mask = cls(seq_len_q, seq_len_k, effective_window(window_size, seq_len_k), document_ids, block_mask,
                   block_size, schedule, tiles)  # fmt: skip
        mask.check_schedule("flashgpt::flash_attention operators")
        return mask

    def check_schedule(self, caller: str) -> None:
        """With document ids or a block mask, the schedule holds exactly what its tilings need (so a schedule built
        for other shapes fails here rather than being misread)."""
        if self.document_ids is None and self.block_mask is None:
            return
        if (self.document_ids is not None and self.document_ids.stride(-1) != 1) or (
            self.block_mask is not None and not self.block_mask.is_contiguous()
        ):
            raise ValueError(f"{caller}: a FlashMask's document_ids need unit stride and its block_mask contiguity")
        schedule, tiles = self.schedule, self.tiles
        if schedule is None or not tiles:
            raise ValueError(
                f"{caller}: document_ids and block_mask need their tile schedule (schedule and schedule_tiles, "
                "e.g. from flash_mask(...).operator_args())"
            )
        expected = self._layout()[1]
        if (
            schedule.dtype != torch.int32
            or schedule.dim() != 1
            or schedule.numel() != expected
            or schedule.stride(0) != 1
        ):
            raise ValueError(
                f"{caller}: the schedule is {schedule.dtype} of shape {tuple(schedule.shape)}, but these masks need "
                f"an int32 vector of {expected} entries for the tiles {describe_tiles(tiles)}: it was built for "
                "other masks or shapes"
            )

    @property
    def any(self) -> bool:
        return self.window_size is not None or self.document_ids is not None or self.block_mask is not None

    def block_exact(self, row_tile: int, col_tile: int) -> bool:
        """Whether every tile lies inside one block, so the block mask keeps or drops it whole."""
        return self.block_size % row_tile == 0 and self.block_size % col_tile == 0

    def _layout(self) -> tuple[dict[TileKey, tuple[View, ...]], int]:
        id_rows = self.document_ids.shape[0] if self.document_ids is not None else None
        mask_heads = self.block_mask.shape[0] if self.block_mask is not None else None
        # torch.compile traces the function itself (it warns on, and bypasses, the cache).
        layout = schedule_layout.__wrapped__ if torch.compiler.is_compiling() else schedule_layout
        return layout(self.seq_len_q, self.seq_len_k, id_rows, mask_heads, self.tiles)

    def tile_schedule(self, kernel_pass: str, cfg: LaunchConfig) -> TileSchedule:
        """The schedule of the tiling `kernel_pass` walks with `cfg`, as views into `schedule`."""
        key = tile_key(kernel_pass, cfg)
        if key not in self.tiles:
            raise ValueError(
                f"flash_attention: the {kernel_pass} pass launches with the tiles {describe_tiles((key,))}, but the "
                f"mask's schedule holds {describe_tiles(self.tiles)}: build the mask (flash_mask) for this call's "
                "head dim, dtype, causal and dropout_p"
            )
        if key in self._views:
            return self._views[key]
        base = self.schedule.storage_offset()
        # One operator per view (a slice and a view would be two): this runs in every pass of every call.
        views = [self.schedule.as_strided(shape, strides, base + offset) for shape, strides, offset in
                 self._layout()[0][key]]  # fmt: skip
        ranges = views.pop(0) if self.document_ids is not None else None
        counts = indices = order = None
        if self.block_mask is not None:  # tiles of keys also have their walk order
            counts, indices, order = views if len(views) == 3 else (*views, None)
        schedule = self._views[key] = TileSchedule(ranges, counts, indices, order)
        return schedule
