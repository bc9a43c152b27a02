"""Keys and values of the tokens seen so far, so that generation computes each new token's attention over the
cache (Tq = 1 query against Tk keys) instead of recomputing the whole sequence."""

import torch
from torch import Tensor


class KVCache:
    """Every layer's keys and values, preallocated for max_len tokens: (n_layer, B, H, max_len, D) each.

    The model appends one call's keys and values per layer (`append`) and then moves `length` on (`advance`), so
    all layers of a call see the same past.
    """

    def __init__(
        self,
        n_layer: int,
        batch: int,
        n_head: int,
        head_dim: int,
        max_len: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (n_layer, batch, n_head, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0  # tokens cached

    @property
    def max_len(self) -> int:
        return self.keys.size(-2)

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v (B, H, T, D) of `layer` after the cached tokens; returns all of that layer's keys and values,
        (B, H, length + T, D) views of the cache."""
        end = self.length + k.size(-2)
        if end > self.max_len:
            raise ValueError(f"the KV cache holds {self.max_len} tokens; {self.length} cached + {k.size(-2)} new")
        self.keys[layer, :, :, self.length : end] = k
        self.values[layer, :, :, self.length : end] = v
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def advance(self, n_tokens: int) -> None:
        """Count the n_tokens that every layer has just appended."""
        self.length += n_tokens
