"""Host-side tile schedules for the data-dependent masks: a few small tensor ops per call, no device sync.

Causal and window masks are functions of the tile's coordinates, so the kernels derive their loop bounds from
scalars (`masks.py`). Document ids and block masks are data, so each pass gets, for its tile of rows:

- documents: (B, n_row_tiles, 4) int32 (lo, hi, full_lo, full_hi), the column range holding every column that
  shares an id with some row of the tile, and the range whose columns all share the one id of every row (empty
  unless the tile lies in a single document whose columns are contiguous, as they are in packed sequences);
- block-sparse: per row tile, how many column tiles touch a kept block and their indices in ascending order,
  compacted like FlexAttention's kv_num_blocks / kv_indices, so a program loops over those tiles only. When the
  tiles divide block_size (the launcher shrinks them to make it so when block_size is a multiple of 16) a tile
  lies in one block and is kept or dropped whole; otherwise a kept tile may hold dropped pairs, and the kernel
  also looks the block mask up per element (`block_exact` is False).
"""

import math
from dataclasses import dataclass, field

import torch


def document_tile_ranges(row_ids: torch.Tensor, col_ids: torch.Tensor, tile: int) -> torch.Tensor:
    """(B, ceil(R / tile), 4) int32 column ranges (lo, hi, full_lo, full_hi) for rows carrying row_ids (B, R)
    against columns carrying col_ids (B, C); see the module docstring. Ids need not be contiguous or sorted."""
    batch, n_cols = col_ids.shape
    n_rows = row_ids.shape[1]
    # Within each group of equal ids the stable sort keeps column order, so a group's first and last entries are
    # the first and last column carrying that id.
    sorted_ids, order = torch.sort(col_ids, dim=1, stable=True)
    left = torch.searchsorted(sorted_ids, row_ids.contiguous())
    right = torch.searchsorted(sorted_ids, row_ids.contiguous(), right=True)
    present = right > left
    first = order.gather(1, left.clamp(max=n_cols - 1))
    last = order.gather(1, (right - 1).clamp(min=0))
    contiguous = present & (last - first + 1 == right - left)

    # Pad the last tile by repeating the last row: neutral for min, max and "every row carries one id".
    n_tiles = math.ceil(n_rows / tile)
    pad = torch.arange(n_tiles * tile, device=row_ids.device).clamp(max=n_rows - 1)

    def tiled(t: torch.Tensor) -> torch.Tensor:
        return t[:, pad].view(batch, n_tiles, tile)

    lo = tiled(torch.where(present, first, n_cols)).amin(-1)
    hi = tiled(torch.where(present, last + 1, 0)).amax(-1)
    ids = tiled(row_ids)
    one_doc = (ids.amin(-1) == ids.amax(-1)) & tiled(contiguous)[..., 0]
    zero = torch.zeros_like(lo)
    full_lo, full_hi = torch.where(one_doc, lo, zero), torch.where(one_doc, hi, zero)
    return torch.stack([lo, hi, full_lo, full_hi], dim=-1).to(torch.int32).contiguous()


def _tile_blocks(length: int, tile: int, block_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """For each tile of `tile` positions out of `length`: its first block and one past its last block."""
    starts = torch.arange(0, length, tile, device=device)
    ends = (starts + tile).clamp(max=length)
    return starts // block_size, (ends - 1) // block_size + 1


def kept_tile_lists(
    block_mask: torch.Tensor, block_size: int, n_rows: int, n_cols: int, row_tile: int, col_tile: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """For an (H, ceil(n_rows / block_size), ceil(n_cols / block_size)) bool block mask: counts (H, R) int32 of
    the column tiles that overlap a kept block, per row tile, and indices (H, R, C) int32 whose first counts[h, r]
    entries are those column tiles in ascending order (R, C: the numbers of row and column tiles)."""
    # Kept blocks in any rectangle of blocks, from 2-D prefix sums: prefix[h, i, j] counts kept blocks above-left.
    prefix = torch.nn.functional.pad(block_mask.to(torch.int32).cumsum(1).cumsum(2), (1, 0, 1, 0))
    r0, r1 = _tile_blocks(n_rows, row_tile, block_size, block_mask.device)
    c0, c1 = _tile_blocks(n_cols, col_tile, block_size, block_mask.device)
    r0, r1, c0, c1 = r0[:, None], r1[:, None], c0[None, :], c1[None, :]
    kept = (prefix[:, r1, c1] - prefix[:, r0, c1] - prefix[:, r1, c0] + prefix[:, r0, c0]) > 0
    counts = kept.sum(-1, dtype=torch.int32)
    # A stable sort of "dropped" (0 for kept) moves the kept tiles to the front and keeps them in order.
    indices = torch.argsort((~kept).to(torch.uint8), dim=-1, stable=True)
    return counts.contiguous(), indices.to(torch.int32).contiguous()


@dataclass
class KernelMasks:
    """The masks of one call, validated by the caller, and their schedules, built once and shared by the passes.

    window_size is None or < Tk; document_ids is (B, Tk) with unit stride, block_mask (H or 1, ceil(Tq / block_size),
    ceil(Tk / block_size)) bool, both on the device of q. `build` makes them so."""

    window_size: int | None = None
    document_ids: torch.Tensor | None = None
    block_mask: torch.Tensor | None = None
    block_size: int = 128
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def build(
        cls,
        seq_len_k: int,
        window_size: int | None = None,
        document_ids: torch.Tensor | None = None,
        block_mask: torch.Tensor | None = None,
        block_size: int = 128,
    ) -> "KernelMasks":
        """From flash_attention's (validated) arguments: a window of Tk or more keys masks nothing, so it is dropped
        (which also keeps p ± W within int32); the kernels read document ids with unit stride."""
        if window_size is not None and window_size >= seq_len_k:
            window_size = None
        if document_ids is not None:
            document_ids = document_ids.contiguous()
        return cls(window_size, document_ids, block_mask, block_size)

    @property
    def any(self) -> bool:
        return self.window_size is not None or self.document_ids is not None or self.block_mask is not None

    def document_ranges(self, seq_len_q: int, tile: int, rows: str) -> torch.Tensor:
        """Column ranges per tile of `tile` rows; rows='queries' (columns are keys) or 'keys' (columns are
        queries). A query's id is the entry at its absolute position Tk − Tq + i."""
        key = ("docs", seq_len_q, tile, rows)
        if key not in self._cache:
            ids = self.document_ids
            query_ids = ids[:, ids.shape[1] - seq_len_q :]
            row_ids, col_ids = (query_ids, ids) if rows == "queries" else (ids, query_ids)
            self._cache[key] = document_tile_ranges(row_ids, col_ids, tile)
        return self._cache[key]

    def block_exact(self, row_tile: int, col_tile: int) -> bool:
        """Whether every tile lies inside one block, so the block mask keeps or drops it whole."""
        return self.block_size % row_tile == 0 and self.block_size % col_tile == 0

    def kept_tiles(
        self, seq_len_q: int, seq_len_k: int, row_tile: int, col_tile: int, transposed: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Kept key tiles per query tile, or with `transposed` (rows are keys) kept query tiles per key tile."""
        key = ("tiles", seq_len_q, seq_len_k, row_tile, col_tile, transposed)
        if key not in self._cache:
            mask, rows, cols = self.block_mask, seq_len_q, seq_len_k
            if transposed:
                mask, rows, cols = mask.transpose(1, 2), seq_len_k, seq_len_q
            self._cache[key] = kept_tile_lists(mask, self.block_size, rows, cols, row_tile, col_tile)
        return self._cache[key]

    def block_mask_bytes(self) -> torch.Tensor:
        """The block mask as contiguous uint8, for the kernels' per-element lookup."""
        if "bytes" not in self._cache:
            self._cache["bytes"] = self.block_mask.to(torch.uint8).contiguous()
        return self._cache["bytes"]
