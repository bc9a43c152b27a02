"""Attention masks: the one definition of what each query may see, shared by every backend and every test.

q has Tq rows and k, v have Tk >= Tq rows. Query i sits at absolute position p = Tk − Tq + i (aligned bottom-right,
as in KV-cache decoding and chunked prefill: the last query is the last key). A key j is visible to query i when
every given mask allows it (they combine by AND):

- causal:          j <= p
- window_size W:   p − W < j  (and, without causal, also j < p + W): a band of W keys ending at p, or 2W − 1 keys
                   centred on p
- document_ids:    document_ids[b, j] == document_ids[b, p]  (packed sequences attend within their document)
- block_mask:      block_mask[h, i // block_size, j // block_size]  (block-sparse attention; h indexes a mask per
                   head, or one mask for all heads)

A query row that sees no key at all returns o = 0 and LSE = −inf. This module is pure PyTorch (no Triton), so the
naive and sdpa backends, the float64 test references and the benchmarks can all use it.
"""

import math
import numbers

import torch

_INTEGER_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def num_blocks(seq_len: int, block_size: int) -> int:
    """How many blocks of block_size cover seq_len positions (the last one may be partial)."""
    return math.ceil(seq_len / block_size)


def validate_masks(
    seq_len_q: int,
    seq_len_k: int,
    *,
    window_size: int | None = None,
    document_ids: torch.Tensor | None = None,
    block_mask: torch.Tensor | None = None,
    block_size: int = 128,
    batch: int | None = None,
    heads: int | None = None,
    device: torch.device | None = None,
    caller: str = "attention",
) -> None:
    """Raise a ValueError/TypeError naming the bad argument; batch, heads and device are checked when given."""
    if seq_len_q > seq_len_k:
        raise ValueError(
            f"{caller}: q has {seq_len_q} rows but k/v only {seq_len_k}; queries are aligned to the last keys, so "
            "Tq <= Tk is required"
        )
    if window_size is not None and (
        isinstance(window_size, bool) or not isinstance(window_size, numbers.Integral) or window_size < 1
    ):
        raise ValueError(f"{caller}: window_size must be an int >= 1 (or None for no window), got {window_size!r}")
    if document_ids is not None:
        if not isinstance(document_ids, torch.Tensor):
            raise TypeError(f"{caller}: document_ids must be a torch.Tensor, got {type(document_ids).__name__}")
        if document_ids.dtype not in _INTEGER_DTYPES:
            raise TypeError(f"{caller}: document_ids must be an integer tensor, got dtype {document_ids.dtype}")
        expected = f"({'B' if batch is None else batch}, {seq_len_k})"
        if (
            document_ids.dim() != 2
            or document_ids.shape[1] != seq_len_k
            or (batch is not None and document_ids.shape[0] != batch)
        ):
            raise ValueError(
                f"{caller}: document_ids must have shape (B, Tk) = {expected}, one id per key position, "
                f"got {tuple(document_ids.shape)}"
            )
        if device is not None and document_ids.device != device:
            raise ValueError(f"{caller}: document_ids is on {document_ids.device} but q is on {device}")
    if block_mask is not None:
        if isinstance(block_size, bool) or not isinstance(block_size, numbers.Integral) or block_size < 1:
            raise ValueError(f"{caller}: block_size must be an int >= 1, got {block_size!r}")
        if not isinstance(block_mask, torch.Tensor):
            raise TypeError(f"{caller}: block_mask must be a torch.Tensor, got {type(block_mask).__name__}")
        if block_mask.dtype != torch.bool:
            raise TypeError(f"{caller}: block_mask must be a bool tensor, got dtype {block_mask.dtype}")
        n_q, n_k = num_blocks(seq_len_q, block_size), num_blocks(seq_len_k, block_size)
        heads_ok = block_mask.dim() == 3 and (block_mask.shape[0] == 1 or heads is None or block_mask.shape[0] == heads)
        if not heads_ok or block_mask.shape[1:] != (n_q, n_k):
            raise ValueError(
                f"{caller}: block_mask must have shape (H or 1, ceil(Tq / block_size), ceil(Tk / block_size)) = "
                f"({'H' if heads is None else heads} or 1, {n_q}, {n_k}) for Tq={seq_len_q}, Tk={seq_len_k}, "
                f"block_size={block_size}; got {tuple(block_mask.shape)}"
            )
        if device is not None and block_mask.device != device:
            raise ValueError(f"{caller}: block_mask is on {block_mask.device} but q is on {device}")


def dense_mask(
    seq_len_q: int,
    seq_len_k: int,
    *,
    causal: bool,
    window_size: int | None = None,
    document_ids: torch.Tensor | None = None,
    block_mask: torch.Tensor | None = None,
    block_size: int = 128,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The (Tq, Tk) visibility of every query/key pair, True = visible, as a bool tensor broadcastable to
    (B, H, Tq, Tk): its batch dim is B with document_ids (else 1), its head dim that of block_mask (else 1)."""
    validate_masks(
        seq_len_q, seq_len_k, window_size=window_size, document_ids=document_ids, block_mask=block_mask,
        block_size=block_size, caller="dense_mask",
    )  # fmt: skip
    if device is None:
        device = next((t.device for t in (document_ids, block_mask) if t is not None), torch.device("cpu"))
    pos_q = torch.arange(seq_len_k - seq_len_q, seq_len_k, device=device)[:, None]  # absolute query positions
    pos_k = torch.arange(seq_len_k, device=device)[None, :]
    visible = torch.ones(seq_len_q, seq_len_k, dtype=torch.bool, device=device)
    if causal:
        visible &= pos_k <= pos_q
    if window_size is not None:
        visible &= pos_q - window_size < pos_k
        if not causal:
            visible &= pos_k < pos_q + window_size
    visible = visible[None, None]
    if document_ids is not None:
        ids = document_ids.to(device)
        same_doc = ids[:, seq_len_k - seq_len_q :, None] == ids[:, None, :]  # (B, Tq, Tk)
        visible = visible & same_doc[:, None]
    if block_mask is not None:
        rows = torch.arange(seq_len_q, device=device) // block_size
        cols = torch.arange(seq_len_k, device=device) // block_size
        visible = visible & block_mask.to(device)[:, rows][:, :, cols][None]  # (1, H, Tq, Tk)
    return visible
