"""Keys and values of the tokens seen so far, so that generation computes each new token's attention over the
cache (Tq = 1 query against Tk keys) instead of recomputing the whole sequence."""

from torch import Tensor


class KVCache:
    """Every layer's keys and values, (B, H, max_len, D) each, allocated at a layer's first call with the dtype
    and device of its keys (bf16 under autocast).

    The model appends one call's keys and values per layer (`append`), then counts the call's tokens once
    (`advance`), so that every layer of a call sees the same past.
    """

    def __init__(self, n_layer: int, max_len: int) -> None:
        self.max_len = max_len
        self.keys: list[Tensor | None] = [None] * n_layer
        self.values: list[Tensor | None] = [None] * n_layer
        self.length = 0  # tokens cached

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v (B, H, T, D) of `layer` after the cached tokens; returns all of that layer's keys and values,
        (B, H, length + T, D) views of the cache."""
        end = self.length + k.size(-2)
        if end > self.max_len:
            raise ValueError(f"the KV cache holds {self.max_len} tokens; {self.length} cached + {k.size(-2)} new")
        if self.keys[layer] is None:
            batch, heads, _, head_dim = k.shape
            self.keys[layer] = k.new_empty(batch, heads, self.max_len, head_dim)
            self.values[layer] = v.new_empty(batch, heads, self.max_len, head_dim)
        keys, values = self.keys[layer], self.values[layer]
        keys[:, :, self.length : end] = k
        values[:, :, self.length : end] = v
        return keys[:, :, :end], values[:, :, :end]

    def advance(self, n_tokens: int) -> None:
        """Count the n_tokens that every layer has just appended."""
        self.length += n_tokens
