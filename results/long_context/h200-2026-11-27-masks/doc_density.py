"""Density of document masking (kept fraction of causal pairs) in 64K-token windows of long_prose's training split.

    python results/long_context/h200-2026-11-27-masks/doc_density.py   # needs the prepared long_prose shards

200 windows at random offsets (seed 0), as the training sampler draws them: for documents of n_i tokens in a
window of T, density = Σ n_i (n_i + 1) / 2 ÷ T (T + 1) / 2.
"""

import numpy as np
import torch

from flashgpt.data.config import DataConfig
from flashgpt.data.documents import document_ids
from flashgpt.data.shards import load_splits

T = 65536


def main() -> None:
    tokens = np.asarray(load_splits(DataConfig(name="long_prose"), prepare_if_missing=False).train)
    starts = np.random.default_rng(0).integers(0, len(tokens) - T - 1, size=200)
    densities = []
    for start in starts:
        ids = document_ids(torch.from_numpy(tokens[start : start + T].astype(np.int64))[None])[0]
        counts = torch.unique_consecutive(ids, return_counts=True)[1].double()
        densities.append(float((counts * (counts + 1) / 2).sum() / (T * (T + 1) / 2)))
    d = np.array(densities)
    low, high = np.percentile(d, [10, 90])
    print(f"{len(tokens):,} training tokens; density over 200 windows of {T}: mean {d.mean():.3f}, median "
          f"{np.median(d):.3f}, 10th-90th percentile {low:.3f}-{high:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
