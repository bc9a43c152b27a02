"""Named block-sparse attention patterns: which (query block, key block) tiles attention computes at all.

A pattern is a bool tensor (1, n_blocks, n_blocks) over blocks of `attention.block_size` tokens: block (i, j) kept
means the queries of block i may see the keys of block j (the other masks, causal first, still apply inside it).
The leading 1 is the head axis: one pattern serves every head. Every pattern keeps the diagonal blocks, so no
causal query row is left without keys. With causal=True the blocks above the diagonal are dropped (the causal mask
removes them anyway), so the kept blocks are exactly the tiles computed.

Density is the kept fraction of the tiles dense attention computes: the n(n+1)/2 blocks of the lower triangle
with the diagonal when causal, all n² otherwise. Attention FLOPs and time fall in proportion to it.

- local_global (Longformer, BigBird): a band of `local_blocks` blocks ending at the diagonal (|i - j| <
  local_blocks), plus `global_blocks` global blocks: the first key blocks, which every query sees, and the first
  query blocks, which see every key.
- strided (the Sparse Transformer's strided pattern, Child et al. 2019): the band of `local_blocks`, plus every
  `stride`-th block back from the diagonal, (i - j) % stride == 0.
- butterfly (the pattern of block-sparse FlashAttention, sec. 3.3 of the FlashAttention paper: Pixelated
  Butterfly's flat butterfly, Chen et al. 2021): blocks grouped into units of `unit_blocks`; units a and b are
  connected when a XOR b is 0 or a power of two, the union of the supports of the butterfly factors (the factor
  of stride 2^l connects exactly the indices that differ in bit l), plus `global_blocks` as in local_global (the
  low-rank part of pixelated butterfly).

Each pattern has one size parameter (local_global: local_blocks, strided: stride, butterfly: unit_blocks): give it,
or give a target `density` and the size whose density is nearest is chosen for the run's number of blocks.
"""

import logging
from dataclasses import dataclass

import torch
from torch import Tensor

log = logging.getLogger(__name__)


@dataclass
class BlockSparseConfig:
    """The `attention.block_sparse:` node. Sizes are in blocks of attention.block_size tokens."""

    pattern: str | None = None  # local_global | strided | butterfly; null: dense attention
    density: float | None = None  # target kept fraction in (0, 1]; chooses the pattern's size parameter
    local_blocks: int | None = None  # local_global (its size), strided (default 2)
    global_blocks: int | None = None  # local_global (default 1), butterfly (default 0)
    stride: int | None = None  # strided (its size)
    unit_blocks: int | None = None  # butterfly (its size; a power of two)


def _indices(n_blocks: int) -> tuple[Tensor, Tensor]:
    """Query block index i (n, 1) and key block index j (1, n), to broadcast into an (n, n) grid."""
    index = torch.arange(n_blocks, device="cpu")  # a small table, built on the CPU even under torch.device("meta")
    return index[:, None], index[None, :]


def _finish(keep: Tensor, causal: bool) -> Tensor:
    """Add the diagonal, drop what causal removes, add the head axis: (1, n, n)."""
    keep = keep | torch.eye(keep.size(0), dtype=torch.bool, device=keep.device)
    if causal:
        keep = keep.tril()
    return keep.unsqueeze(0)


def _global(i: Tensor, j: Tensor, global_blocks: int) -> Tensor:
    return (j < global_blocks) | (i < global_blocks)


def local_global_blocks(n_blocks: int, *, local_blocks: int, global_blocks: int = 1, causal: bool = True) -> Tensor:
    """Band of local_blocks around the diagonal plus global_blocks global rows and columns: (1, n, n) bool."""
    i, j = _indices(n_blocks)
    return _finish(((i - j).abs() < local_blocks) | _global(i, j, global_blocks), causal)


def strided_blocks(n_blocks: int, *, stride: int, local_blocks: int = 2, causal: bool = True) -> Tensor:
    """Band of local_blocks plus every stride-th block from the diagonal (both ways unless causal): (1, n, n)."""
    i, j = _indices(n_blocks)
    distance = (i - j).abs()
    return _finish((distance < local_blocks) | (distance % stride == 0), causal)


def butterfly_blocks(n_blocks: int, *, unit_blocks: int, global_blocks: int = 0, causal: bool = True) -> Tensor:
    """Flat butterfly over units of unit_blocks blocks, plus global_blocks global rows and columns: (1, n, n)."""
    if unit_blocks < 1 or unit_blocks & (unit_blocks - 1):
        raise ValueError(f"butterfly: unit_blocks={unit_blocks} must be a power of two")
    i, j = _indices(n_blocks)
    differ = torch.bitwise_xor(i // unit_blocks, j // unit_blocks)
    one_bit = differ & (differ - 1) == 0  # 0, or a power of two
    return _finish(one_bit | _global(i, j, global_blocks), causal)


PATTERNS = {"local_global": local_global_blocks, "strided": strided_blocks, "butterfly": butterfly_blocks}
# Each pattern's parameters with their defaults; None marks the size parameter, which the target density can set.
PARAMETERS: dict[str, dict[str, int | None]] = {
    "local_global": {"local_blocks": None, "global_blocks": 1},
    "strided": {"stride": None, "local_blocks": 2},
    "butterfly": {"unit_blocks": None, "global_blocks": 0},
}
_ALL_PARAMETERS = ("local_blocks", "global_blocks", "stride", "unit_blocks")


def block_density(block_mask: Tensor, causal: bool = True) -> float:
    """Kept fraction of the tiles dense attention computes (lower triangle with the diagonal when causal)."""
    n_q, n_k = block_mask.shape[-2:]
    kept = block_mask.expand(-1, n_q, n_k)
    if causal:
        kept = kept.tril(diagonal=n_k - n_q)  # bottom-right aligned, as the kernel's causal mask
        dense = torch.ones(n_q, n_k, dtype=torch.bool, device=kept.device).tril(diagonal=n_k - n_q).sum().item()
    else:
        dense = n_q * n_k
    return kept.sum().item() / (dense * kept.size(0))


def _size_candidates(pattern: str, n_blocks: int) -> list[int]:
    if pattern == "butterfly":
        return [1 << power for power in range(max(n_blocks - 1, 1).bit_length() + 1)]
    return list(range(1, n_blocks + 1))


def check_block_sparse_config(cfg: BlockSparseConfig) -> None:
    """Reject an unknown pattern, parameters it does not read, and a missing or doubled size; raises ValueError."""
    key = "attention.block_sparse"
    if cfg.pattern is None:
        stray = [name for name in ("density", *_ALL_PARAMETERS) if getattr(cfg, name) is not None]
        if stray:
            raise ValueError(
                f"{key}.{stray[0]} is set but {key}.pattern is null (dense attention); name a pattern: "
                f"{', '.join(PATTERNS)}"
            )
        return
    if cfg.pattern not in PATTERNS:
        raise ValueError(f"{key}.pattern={cfg.pattern!r}; choose one of: {', '.join(PATTERNS)}")
    own = PARAMETERS[cfg.pattern]
    foreign = [name for name in _ALL_PARAMETERS if name not in own and getattr(cfg, name) is not None]
    if foreign:
        raise ValueError(
            f"{key}.pattern={cfg.pattern} does not read {', '.join(f'{key}.{name}' for name in foreign)}; its "
            f"parameters are: {', '.join(own)} (and density)"
        )
    size = next(name for name, default in own.items() if default is None)
    if (cfg.density is None) == (getattr(cfg, size) is None):
        raise ValueError(
            f"{key}.pattern={cfg.pattern}: give exactly one of {key}.{size} (its size) and {key}.density (a target "
            "kept fraction that chooses the size)"
        )
    if cfg.density is not None and not 0.0 < cfg.density <= 1.0:
        raise ValueError(f"{key}.density={cfg.density} must be in (0, 1]")
    for name in own:
        value = getattr(cfg, name)
        lowest = 0 if name == "global_blocks" else 1
        if value is not None and value < lowest:
            raise ValueError(f"{key}.{name}={value} must be >= {lowest}")
    if cfg.pattern == "butterfly" and cfg.unit_blocks is not None and cfg.unit_blocks & (cfg.unit_blocks - 1):
        raise ValueError(f"{key}.unit_blocks={cfg.unit_blocks} must be a power of two")


def _nearest_size(cfg: BlockSparseConfig, params: dict[str, int], size: str, n_blocks: int, causal: bool) -> int:
    """The size whose density is nearest cfg.density (on a tie the sparser). Density is monotone in the size (up
    in local_blocks and unit_blocks, down in stride), so a bisection over the candidates finds it."""
    candidates = _size_candidates(cfg.pattern, n_blocks)
    build = PATTERNS[cfg.pattern]

    def density(index: int) -> float:
        return block_density(build(n_blocks, **{**params, size: candidates[index]}, causal=causal), causal)

    rising = density(len(candidates) - 1) >= density(0)
    lo, hi = 0, len(candidates) - 1  # invariant: the first index at or past the target lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        past = density(mid) >= cfg.density if rising else density(mid) <= cfg.density
        lo, hi = (lo, mid) if past else (mid + 1, hi)
    nearby = {max(lo - 1, 0), lo}
    return candidates[min(nearby, key=lambda index: (abs(density(index) - cfg.density), density(index)))]


def resolve_parameters(cfg: BlockSparseConfig, n_blocks: int, causal: bool = True) -> dict[str, int]:
    """The pattern's parameters for n_blocks blocks: defaults filled in, the size chosen from the target density
    when one is given (the nearest; on a tie the sparser)."""
    check_block_sparse_config(cfg)
    own = PARAMETERS[cfg.pattern]
    params = {name: default if getattr(cfg, name) is None else getattr(cfg, name) for name, default in own.items()}
    size = next(name for name, default in own.items() if default is None)
    if cfg.density is not None:
        params[size] = _nearest_size(cfg, params, size, n_blocks, causal)
        built = block_density(PATTERNS[cfg.pattern](n_blocks, **params, causal=causal), causal)
        if not cfg.density / 2 <= built <= 2 * cfg.density:  # too few blocks for the pattern to get near it
            log.warning(
                f"attention.block_sparse.density={cfg.density}: over {n_blocks} blocks the nearest {cfg.pattern} "
                f"pattern keeps {built:.2f} of the blocks dense attention computes ({size}={params[size]}); to get "
                f"near {cfg.density}, use a longer seq_len or a smaller attention.block_size"
            )
    return params


def build_block_mask(cfg: BlockSparseConfig, n_blocks: int, causal: bool = True) -> Tensor | None:
    """The configured pattern over n_blocks x n_blocks blocks: (1, n_blocks, n_blocks) bool; None when dense."""
    if cfg.pattern is None:
        return None
    return PATTERNS[cfg.pattern](n_blocks, **resolve_parameters(cfg, n_blocks, causal), causal=causal)


def block_mask_for(layout: Tensor, seq_len_q: int, seq_len_k: int, block_size: int) -> Tensor:
    """The rows and columns of a model's (1, n, n) layout that a call with Tq queries and Tk keys needs.

    The queries are the last Tq of the Tk positions (bottom-right, as the kernel aligns causal), but a block mask
    is indexed by query block i // block_size counted from the first query. The two agree when the queries start
    on a block boundary, and for a single query (a decoding step), whose one row is its position's row.
    """
    n_q, n_k = -(-seq_len_q // block_size), -(-seq_len_k // block_size)
    if n_k > layout.size(-1):
        raise ValueError(f"{seq_len_k} keys need {n_k} blocks of {block_size}; the layout has {layout.size(-1)}")
    first = seq_len_k - seq_len_q
    if seq_len_q == 1:
        return layout[:, (seq_len_k - 1) // block_size, :n_k].unsqueeze(1)
    if first % block_size:
        raise ValueError(
            f"a block-sparse call with {seq_len_q} queries after {first} cached keys: the queries must start on a "
            f"block boundary (a multiple of attention.block_size={block_size}) or be a single query"
        )
    return layout[:, first // block_size : first // block_size + n_q, :n_k]


def visible_fraction(seq_len: int, *, window_size: int | None, layout: Tensor | None, block_size: int) -> float:
    """Visible (query, key) pairs of causal self-attention over seq_len tokens under a window and a block layout
    (1, n, n), as a fraction of plain causal attention's seq_len·(seq_len + 1)/2: how much attention work is left."""
    if window_size is None and layout is None:
        return 1.0
    # Query p sees the keys [lo, p] of the causal window, intersected with the kept key blocks of its query block.
    visible = 0
    starts = torch.arange(0, seq_len, block_size, dtype=torch.int64)
    ends = (starts + block_size).clamp(max=seq_len)
    for block, start in enumerate(starts.tolist()):
        p = torch.arange(start, min(start + block_size, seq_len), dtype=torch.int64)[:, None]  # (rows, 1)
        lo = p - window_size + 1 if window_size is not None else torch.zeros_like(p)
        overlap = (torch.minimum(p + 1, ends) - torch.maximum(lo, starts)).clamp(min=0)  # (rows, n): keys per block
        if layout is not None:
            overlap = overlap * layout[0, block, : len(starts)].cpu()
        visible += int(overlap.sum())
    return visible / (seq_len * (seq_len + 1) / 2)
