"""Write text with a trained model: load a checkpoint, prefill the prompt, decode token by token with a KV cache.

    python scripts/sample.py runs/<date>/<time>/checkpoints/latest.pt --prompt "ROMEO:" --max-new-tokens 200
    python scripts/sample.py CKPT --temperature 0 --max-new-tokens 50        # greedy
    python scripts/sample.py CKPT --attention sdpa --num-samples 3 --top-k 50 --seed 1

The model is rebuilt from the checkpoint's own config: its size, its context (seq_len) and its attention masks
(window, block-sparse pattern, and document masking when it was trained with data.document_mask=true). Each
decoding step is one query against the cached keys (flashgpt.model.generation). Samples go to stdout, one after
another under a `--- sample i ---` line; the speed goes to stderr.
"""

import argparse
import math
import sys
import time
from pathlib import Path

import torch

from flashgpt.data.tokenizer import EOT_ID, VOCAB_SIZE, get_tokenizer
from flashgpt.model.backends import ATTENTION_BACKENDS
from flashgpt.model.generation import generate
from flashgpt.training.checkpoint import CheckpointError
from flashgpt.training.distributed import resolve_device
from flashgpt.training.precision import autocast
from flashgpt.training.saved_model import model_from_checkpoint


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a training checkpoint: <run dir>/checkpoints/latest.pt")
    parser.add_argument("--prompt", default="", help="text to continue (default: a new document, <|endoftext|>)")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8, help="0: greedy (the most likely token)")
    parser.add_argument("--top-k", type=int, default=200, help="sample among the k most likely tokens; 0: all")
    parser.add_argument("--num-samples", type=int, default=1, help="samples drawn side by side, as one batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--attention", choices=sorted(ATTENTION_BACKENDS), help="backend (default: the checkpoint's own)"
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    for flag, value, valid in (
        ("--max-new-tokens", args.max_new_tokens, args.max_new_tokens >= 0),
        ("--num-samples", args.num_samples, args.num_samples >= 1),
        ("--temperature", args.temperature, math.isfinite(args.temperature) and args.temperature >= 0),
        ("--top-k", args.top_k, args.top_k >= 0),
    ):
        if not valid:
            sys.exit(
                f"{flag} {value} is out of range: need --max-new-tokens >= 0, --num-samples >= 1, a finite "
                "--temperature >= 0 and --top-k >= 0"
            )
    try:
        device = resolve_device(args.device)
    except RuntimeError as error:  # cuda asked for, none there
        sys.exit(str(error))
    try:
        model, config, _ = model_from_checkpoint(args.checkpoint, device, args.attention)
    except CheckpointError as error:
        sys.exit(str(error))
    model.eval()
    tokenizer = get_tokenizer()
    prompt_ids = tokenizer.encode(args.prompt, allowed_special="all") if args.prompt else [EOT_ID]
    prompt = torch.tensor([prompt_ids] * args.num_samples, dtype=torch.long, device=device)
    generator = torch.Generator(device).manual_seed(args.seed)

    started = time.perf_counter()
    with autocast(device):
        tokens = generate(
            model,
            prompt,
            args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k or None,
            n_vocab=VOCAB_SIZE,
            document_mask=config.data.document_mask,
            generator=generator,
        )
    elapsed = time.perf_counter() - started
    for i, sample in enumerate(tokens.tolist()):
        print(f"--- sample {i} ---")
        print(tokenizer.decode(sample))
    new_tokens = args.max_new_tokens * args.num_samples
    print(
        f"{new_tokens} tokens in {elapsed:.2f} s ({new_tokens / elapsed:,.0f} tokens/s), attention="
        f"{model.attention.name}, context {model.block_size}, device {device}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
