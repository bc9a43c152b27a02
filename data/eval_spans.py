"""The fixed evaluation tokens that every model, at every context length, is scored on."""

import warnings

import numpy as np


def held_out_spans(tokens: np.ndarray, doc_starts: np.ndarray, span_len: int, n_spans: int) -> np.ndarray:
    """`n_spans` spans of span_len + 1 tokens (int64, shape (n_spans, span_len + 1)) of a validation split.

    The spans depend on the tokens only, never on a seed. They are cut at stride span_len + 1 from the start
    of each document long enough to hold one, so a span never crosses into another document, and the n_spans
    taken are evenly spaced over all such slots (long documents give more). If the documents are too short for
    n_spans slots, spans are cut the same way from the split as a whole, across document boundaries.
    """
    if span_len < 1 or n_spans < 1:
        raise ValueError(f"need span_len >= 1 and n_spans >= 1, got span_len={span_len}, n_spans={n_spans}")
    width = span_len + 1
    n_slots = (np.append(doc_starts, len(tokens))[1:] - doc_starts) // width  # per document
    per_doc = [start + width * np.arange(n) for start, n in zip(doc_starts, n_slots, strict=True)]
    slots = np.concatenate([np.empty(0, dtype=np.int64), *per_doc]).astype(np.int64)
    if len(slots) < n_spans:
        slots = width * np.arange(len(tokens) // width, dtype=np.int64)
        if len(slots) < n_spans:
            raise ValueError(
                f"the validation split has {len(tokens)} tokens; {n_spans} spans of span_len + 1 = {width} "
                f"tokens need at least {n_spans * width}; lower the span length or count, or use a larger "
                "corpus such as data=long_prose"
            )
        warnings.warn(
            f"the validation documents are too short for {n_spans} spans of {width} tokens each; "
            "the spans cross document boundaries",
            stacklevel=2,
        )
    chosen = slots[np.arange(n_spans) * len(slots) // n_spans]
    return np.asarray(tokens)[chosen[:, None] + np.arange(width)].astype(np.int64)
