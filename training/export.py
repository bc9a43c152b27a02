"""Export a training checkpoint as a transformers GPT-2 directory (config.json and model.safetensors):

    python -m flashgpt.training.export runs/<date>/<time>/checkpoints/latest.pt gpt2-ours
    python -c "from transformers import GPT2LMHeadModel; GPT2LMHeadModel.from_pretrained('gpt2-ours')"

The weights map as `flashgpt.model.hf` describes. GPT-2 in transformers attends to every earlier token with
learned absolute positions, so a model trained with a window, a block-sparse pattern, document masking or rotary
positions is refused, naming the setting: its export would compute something else.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from flashgpt.model.gpt import GPT
from flashgpt.model.hf import GPT2_VOCAB, check_learned_positions, export
from flashgpt.training.saved_model import model_from_checkpoint


def exportable_model(checkpoint: Path) -> GPT:
    """The checkpoint's model, if GPT-2 in transformers computes what it computes; else a ValueError naming why."""
    model, config, _ = model_from_checkpoint(checkpoint, attention="sdpa")  # the backend does not matter to weights
    window, pattern = config.attention.window_size, config.attention.block_sparse.pattern
    if window is not None or pattern is not None or config.data.document_mask:
        raise ValueError(
            f"{checkpoint} was trained with attention.window_size={window}, attention.block_sparse.pattern={pattern}, "
            f"data.document_mask={config.data.document_mask}: GPT-2 in transformers attends to every earlier token, "
            "so its export would compute something else"
        )
    check_learned_positions(config.model, f"GPT-2 export of {checkpoint}")
    return model


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="e.g. runs/<date>/<time>/checkpoints/latest.pt")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--vocab-size", type=int, default=GPT2_VOCAB, help="token rows to keep (GPT-2: 50257)")
    parser.add_argument("--force", action="store_true", help="replace out_dir if it is not empty")
    args = parser.parse_args(argv)
    if not args.checkpoint.is_file():
        parser.error(f"{args.checkpoint}: no such checkpoint file")
    try:
        out = export(exportable_model(args.checkpoint), args.out_dir, args.vocab_size, args.force)
    except (ValueError, FileExistsError) as error:  # CheckpointError is a ValueError
        parser.error(str(error))
    print(f"wrote {out}: load it with transformers.GPT2LMHeadModel.from_pretrained({str(out)!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
