"""Which tokens of a probe's answer a trained model gets right: per-token argmax hit rates at two distances, and two
trials' targets and predictions. A diagnostic for the study's all-or-nothing retrieval accuracy.

    python scripts/study.py run context_code --recipes rope-fixed-1k,rope-ext-16k-75-abf --seeds 0   # GPU
    python results/context_code/identifier_tokens.py runs/context_code/seed0/rope/1024 ...
"""

import sys
from pathlib import Path

import numpy as np
import torch

from flashgpt.data import load_splits
from flashgpt.data.shards import read_doc_ids
from flashgpt.data.tokenizer import get_tokenizer
from flashgpt.training.context_eval import PROBES, long_documents, passkey_trials
from flashgpt.training.saved_model import model_from_checkpoint

encoding = get_tokenizer()
device = torch.device("cuda")
for run in sys.argv[1:]:
    model, config, _ = model_from_checkpoint(Path(run) / "checkpoints" / "latest.pt", device)
    model.eval()
    splits = load_splits(config.data, prepare_if_missing=False)
    docs = long_documents(splits.val, splits.val_docs, read_doc_ids(Path(splits.meta["shard_dir"]))["val"], 16384)
    for name in ("identifier", "prose"):
        for distance, group in passkey_trials(docs, [128, 512], 40, 0, PROBES[name]).items():
            hits: dict[int, list[np.ndarray]] = {}  # by answer length (a number key takes 1 to 3 tokens)
            for i, trial in enumerate(group):
                tokens = torch.from_numpy(trial.tokens[-(config.seq_len + 1) :]).to(device)[None]
                with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
                    logits = model(tokens[:, :-1]).float()
                n_answer = len(trial.tokens) - trial.answer_start
                target, predicted = tokens[0, -n_answer:], logits[0, -n_answer:].argmax(-1)
                hits.setdefault(n_answer, []).append((predicted == target).cpu().numpy())
                if distance == 128 and i < 2:
                    shown = [[encoding.decode([t]) for t in x.tolist()] for x in (target, predicted)]
                    print(f"{run} {name}: target {shown[0]} predicted {shown[1]}")
            for n_answer, rows in sorted(hits.items()):
                rate = np.stack(rows).mean(0).round(2).tolist()
                print(f"{run} {name} d={distance}, {len(rows)} trials of {n_answer} tokens: per-token hit rate {rate}")
