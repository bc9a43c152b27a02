"""Deterministic, resumable sampling of training windows.

A window is seq_len + 1 tokens (inputs and the targets shifted by one). An epoch is a seeded permutation of
windows laid end to end at stride seq_len from a per-epoch random shift: within an epoch no token is a target
twice, all but fewer than 2 * seq_len of them are targets once, and the windows do not start at the same
offsets every epoch. Consecutive global batches of batch_size * world_size windows walk through the epochs;
rank r takes the r-th slice of batch_size of each. The state is one number (windows consumed), so a resumed
run continues with exactly the windows it would have drawn, even under another batch size or world size.
"""

from typing import Any

import numpy as np


class WindowSampler:
    """Start offsets of training windows in a split of n_tokens tokens, for one rank of world_size."""

    def __init__(
        self, n_tokens: int, seq_len: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1
    ) -> None:
        if seed < 0:
            raise ValueError(f"seed={seed}: need seed >= 0")
        if seq_len < 1 or batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
            got = f"seq_len={seq_len} batch_size={batch_size} rank={rank} world_size={world_size}"
            raise ValueError(f"need seq_len, batch_size, world_size >= 1, 0 <= rank < world_size; {got}")
        if n_tokens < seq_len + 1:
            raise ValueError(
                f"the split has {n_tokens} tokens; seq_len={seq_len} needs at least {seq_len + 1}; "
                "use a larger corpus such as data=long_prose"
            )
        self.n_tokens, self.seq_len, self.seed = n_tokens, seq_len, seed
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        # The shift may not push the last window past the end, so it is capped by what one window leaves over.
        self.max_shift = min(seq_len - 1, n_tokens - 1 - seq_len)
        self.windows_per_epoch = (n_tokens - 1 - self.max_shift) // seq_len
        self.consumed = 0  # windows taken by all ranks together
        self._epoch_cache: tuple[int, np.ndarray] | None = None

    def epoch_starts(self, epoch: int) -> np.ndarray:
        """The window starts of an epoch, in the order they are drawn."""
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            shift = int(rng.integers(0, self.max_shift + 1))
            order = rng.permutation(self.windows_per_epoch)
            self._epoch_cache = (epoch, shift + order.astype(np.int64) * self.seq_len)
        return self._epoch_cache[1]

    def next_starts(self) -> np.ndarray:
        """The start offsets, shape (batch_size,), of this rank's windows in the next global batch."""
        first = self.consumed + self.rank * self.batch_size
        epochs, indices = np.divmod(np.arange(first, first + self.batch_size), self.windows_per_epoch)
        starts = np.empty(self.batch_size, dtype=np.int64)
        for epoch in np.unique(epochs):  # a batch may straddle the end of an epoch
            here = epochs == epoch
            starts[here] = self.epoch_starts(int(epoch))[indices[here]]
        self.consumed += self.batch_size * self.world_size
        return starts

    def state_dict(self) -> dict[str, Any]:
        return {
            "consumed": self.consumed,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "n_tokens": self.n_tokens,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = self.state_dict()
        changed = [key for key in ("seed", "seq_len", "n_tokens") if state[key] != mine[key]]
        if changed:
            saved = ", ".join(f"{key}={state[key]}" for key in changed)
            now = ", ".join(f"{key}={mine[key]}" for key in changed)
            raise ValueError(
                f"the sampler state has {saved}, this run {now}: it cannot resume; resume with the same seed, "
                "seq_len and data, or start a fresh run dir"
            )
        self.consumed = int(state["consumed"])
