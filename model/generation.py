"""Autoregressive generation with a KV cache: prefill the prompt once, then one token per step.

A step feeds only the new token, whose query attends over the cached keys and values (Tq = 1 < Tk, causal
aligned bottom-right) under the model's masks: its window, its block-sparse pattern (the row of the token's
position) and, with document masking, the documents that `<|endoftext|>` starts. The cache holds the model's
whole context (its block_size). With rotary positions (rope) each cached key was turned once, at its absolute
position, and each new token's query and key at theirs (the cache's length). Beyond block_size, a token is predicted
from the last block_size tokens, as nanoGPT does; moving that window changes every position, so from then on each
step recomputes the window (the cache cannot be reused). Either way the tokens are those of recomputing the
cropped sequence at every step (tests/test_masks_model.py and tests/test_rope.py check it).
"""

import torch
from torch import Tensor

from flashgpt.data.documents import document_ids
from flashgpt.model.gpt import GPT
from flashgpt.model.kv_cache import KVCache


def sample_next(
    logits: Tensor, *, temperature: float, top_k: int | None, generator: torch.Generator | None = None
) -> Tensor:
    """(B, V) logits -> (B, 1) token ids: the argmax at temperature 0, else a draw from softmax(logits /
    temperature) restricted to the top_k largest (all when None)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None:
        kth_largest = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)


@torch.no_grad()
def generate(
    model: GPT,
    prompt: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    n_vocab: int | None = None,
    document_mask: bool = False,
    generator: torch.Generator | None = None,
) -> Tensor:
    """prompt (B, T0) token ids -> (B, T0 + max_new_tokens): the prompt and the generated tokens.

    n_vocab: sample only ids below it (the tokenizer's vocabulary; the model's table is padded past it).
    document_mask: as in training with data.document_mask=true, tokens attend only within their document.
    generator: the random stream of the draws (temperature > 0).
    """
    if prompt.dim() != 2 or prompt.size(1) < 1:
        raise ValueError(f"prompt must have shape (B, T0) with T0 >= 1, got {tuple(prompt.shape)}")
    if max_new_tokens < 0 or temperature < 0 or (top_k is not None and top_k < 1):
        raise ValueError(
            f"need max_new_tokens >= 0, temperature >= 0, top_k >= 1 or None; got {max_new_tokens}, "
            f"{temperature}, {top_k}"
        )
    was_training = model.training
    model.eval()
    context = model.block_size

    def next_logits(tokens: Tensor, cache: KVCache | None) -> Tensor:
        """Logits of the token after `tokens`, feeding only what the cache does not hold yet."""
        window = tokens[:, -context:]
        ids = document_ids(window) if document_mask else None
        new = window if cache is None else window[:, cache.length :]
        logits = model(new, document_ids=ids, cache=cache)[:, -1]  # (B, V)
        return logits if n_vocab is None else logits[:, :n_vocab]

    tokens = prompt
    cache = KVCache(len(model.blocks), context) if prompt.size(1) < context else None
    for _ in range(max_new_tokens):
        if cache is not None and cache.length == context:
            cache = None  # the window starts to move: recompute it from here on
        token = sample_next(next_logits(tokens, cache), temperature=temperature, top_k=top_k, generator=generator)
        tokens = torch.cat([tokens, token], dim=1)
    model.train(was_training)
    return tokens
