"""Token windows -> model inputs and targets."""

import numpy as np
import torch


def get_batch(
    tokens: np.ndarray, starts: np.ndarray, seq_len: int, device: str | torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs x = tokens[s : s + seq_len] and targets y = tokens[s + 1 : s + seq_len + 1] for each start s.

    Both int64 (batch, seq_len) on `device`; on CUDA the copy comes from pinned memory and does not block.
    """
    starts = np.asarray(starts, dtype=np.int64)
    if starts.min() < 0 or starts.max() + seq_len + 1 > len(tokens):
        raise ValueError(
            f"windows of {seq_len + 1} tokens at starts {starts.min()}..{starts.max()} do not fit "
            f"in {len(tokens)} tokens"
        )
    windows = tokens[starts[:, None] + np.arange(seq_len + 1)].astype(np.int64)
    x = torch.from_numpy(np.ascontiguousarray(windows[:, :-1]))
    y = torch.from_numpy(np.ascontiguousarray(windows[:, 1:]))
    if torch.device(device).type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)
