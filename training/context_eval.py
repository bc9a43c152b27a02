"""Evaluations that isolate what a longer context buys, for any trained model (scripts/study.py runs them).

All three read long held-out documents: the validation documents of at least `length + 1` tokens, each cut to its
first `length + 1` (its leading `<|endoftext|>`, then text). Target i of a document is its token i + 1, predicted
from tokens 0..i: i is the target's absolute position in the document.

1. Loss by absolute position. Every target is predicted with as much preceding context as the model is given,
   `context` tokens at most (at most its block size): windows of `context` tokens slide over the document in steps
   of `stride`, and each window scores only the targets the previous one did not reach, so every target is scored
   once, with between context - stride + 1 and context tokens of history (all of it in the first window). Losses
   are averaged in bins of absolute position, [0, 1K), [1K, 2K), [2K, 4K), ...: a model that uses distant context
   shows loss falling with position, beyond the first bin.
2. Same tokens, different context. The per-target losses above, averaged over every target: every model, at every
   context, scores exactly the same targets, and only how much history each target gets differs. Scoring one model
   at contexts 1K, 2K, ... up to its block size isolates the value of context with the weights held fixed.
3. Passkey retrieval. A sentence holding a random five-digit key is put into held-out text, `distance` tokens of
   text before a question about it; the model is right if, teacher-forced, every token of the key is its most
   likely next token. Accuracy against distance shows how far back the model retrieves; a key more than the model's
   context back is cut off and cannot be found. Four probes word the needle and the question. In English ("prose")
   the question ends with the needle's own words, so copying what followed them answers it (an induction head
   can). As Python ("code": `PASS_KEY = <key>`, then `assert PASS_KEY ==`) it asks for the value bound to a name,
   which copying cannot answer. The third ("identifier") is the copy that source code itself asks for: a made-up
   snake_case name of five random words is assigned in the needle, and the question starts a line with its first
   two words; the answer is the rest of the name (`_w3_w4_w5`: six tokens, one per word and separator), as a
   later use of a rare identifier in a file continues it. A perfect induction head answers it, and no model can
   without the needle. The fourth ("repeat") is the plainest copy: a run of eight distinct rare words (one token
   each) stands in the text, and `distance` tokens later its first three words come again; the answer is the other
   five. Every token of it follows its own earlier occurrence, with no separator between words that the text
   around also uses, so it is the probe an induction head that reaches the needle passes most easily.
   Exact recall asks every answer token to be the model's argmax, which a small model that retrieves only part of
   the key fails. Each trial therefore also carries CHOICES - 1 distractors, answers of other keys of the answer's
   token length. "Choice accuracy" is the share of trials where the model finds the true answer strictly more
   likely than every distractor, as multiple-choice evaluations score a model. A model that cannot see the needle
   is at chance, 1 / CHOICES, and below it where it ties.
"""

import itertools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flashgpt.data.tokenizer import EOT_ID, get_tokenizer
from flashgpt.training.precision import autocast


@dataclass(frozen=True)
class Probe:
    """How a passkey trial words its needle, question and answer, each formatted with the key: a random five-digit
    number (`key`), or with `words` > 0 that many distinct random words of `vocabulary` joined by `separator`
    (`key`), split after its first `head_words` into `head` and `tail` (the tail starting with a separator)."""

    needle: str
    question: str
    answer: str = " {key}"
    words: int = 0
    vocabulary: tuple[str, ...] = ()
    separator: str = "_"
    head_words: int = 2


# Lowercase words of one GPT-2 token each. In a snake_case name GPT-2's pre-tokenizer splits at every "_", so a
# name's tokens are the same wherever it stands: the needle holds exactly the answer's tokens.
KEY_WORDS = (
    "apple", "amber", "arrow", "berry", "blade", "bridge", "cloud", "carbon", "river", "silver", "planet", "pillar",
    "forest", "dragon", "shadow", "window", "table", "chair", "paper", "stone", "water", "light", "night", "field",
    "green", "orange", "yellow", "hammer", "rocket", "engine", "castle", "pocket", "button", "wallet", "ticket",
    "finger", "winter", "spring", "monkey", "wolf", "bear", "horse", "storm", "flame", "rain", "wind", "metal",
    "glass", "steel", "gold", "iron", "wood", "leaf", "root", "seed", "flower", "tree", "grass", "sand", "rock",
    "hill", "lake", "moon", "star", "market", "doctor", "driver", "player", "hunter", "camera", "melon", "cookie",
)  # fmt: skip

# Nouns that are one GPT-2 token each after a space and rare in source code and in prose alike: in a run of them
# every word is its own token, whose earlier occurrence is the needle.
RARE_WORDS = (
    "quartz", "lobster", "violin", "maple", "turtle", "lemon", "mango", "peach", "plum", "cherry", "olive", "ginger",
    "almond", "velvet", "marble", "canyon", "glacier", "harbor", "lantern", "compass", "kettle", "ladder", "blanket",
    "pillow", "candle", "violet", "crimson", "ivory", "coral", "amber", "pearl", "dolphin", "squid", "salmon",
    "trout", "rabbit", "donkey", "camel", "raven", "owl", "goose", "frog", "snail", "beetle", "moth", "butterfly",
    "piano", "trumpet", "guitar",
)  # fmt: skip

PROBES = {
    "prose": Probe(
        " The pass key is {key}. Remember it. {key} is the pass key.", " What is the pass key? The pass key is"
    ),
    "code": Probe("\nPASS_KEY = {key}  # the pass key\n", "\nassert PASS_KEY =="),
    "identifier": Probe("\n{key} = None\n", "\n{head}", "{tail}", words=5, vocabulary=KEY_WORDS),
    "repeat": Probe(" {key}", " {head}", "{tail}", words=8, vocabulary=RARE_WORDS, separator=" ", head_words=3),
}
CHOICES = 10  # a trial's answer and its nine distractors: chance is 0.1


def _keys(probe: Probe, rng: np.random.Generator, n: int) -> list[dict[str, str]]:
    """n random keys, as the fields the probe's texts are formatted with."""
    if not probe.words:
        return [{"key": str(key)} for key in rng.integers(10_000, 100_000, size=n)]
    words = probe.vocabulary
    runs = [[words[i] for i in rng.choice(len(words), size=probe.words, replace=False)] for _ in range(n)]
    join, head = probe.separator.join, probe.head_words
    return [{"key": join(w), "head": join(w[:head]), "tail": probe.separator + join(w[head:])} for w in runs]


def _distractors(probe: Probe, key: dict[str, str], length: int, rng: np.random.Generator, encoding) -> np.ndarray:
    """(CHOICES - 1, length) int64: the answers of other keys, each of the true answer's `length` tokens. A word
    probe keeps the question's head words and draws the rest from the vocabulary without them, so a distractor
    could follow the question as well as the answer does; a number key is any other five-digit number that
    encodes to as many tokens."""
    answers: list[list[int]] = []
    while len(answers) < CHOICES - 1:
        if probe.words:
            head = key["head"].split(probe.separator)
            pool = [word for word in probe.vocabulary if word not in head]
            rest = [pool[i] for i in rng.choice(len(pool), size=probe.words - len(head), replace=False)]
            other = {**key, "tail": probe.separator + probe.separator.join(rest)}
            if other["tail"] == key["tail"]:
                continue
        else:
            other = {"key": str(rng.integers(10_000, 100_000))}
            if other["key"] == key["key"]:
                continue
        tokens = encoding.encode_ordinary(probe.answer.format(**other))
        if len(tokens) == length:
            answers.append(tokens)
    return np.asarray(answers, dtype=np.int64)


PASSKEY_PREFIX = 64  # tokens of text before the needle, so that it never sits at the document's start


@dataclass(frozen=True)
class LongDocuments:
    doc_ids: list[str]
    tokens: np.ndarray  # (n_docs, length + 1) int64: each document's first tokens, <|endoftext|> first

    @property
    def length(self) -> int:
        """Targets per document."""
        return self.tokens.shape[1] - 1


def long_documents(
    tokens: np.ndarray, doc_starts: np.ndarray, doc_ids: list[str], length: int, max_docs: int | None = None
) -> LongDocuments:
    """The documents of a split (tokens, their start offsets and ids) holding at least length + 1 tokens, cut to
    that; `max_docs` of them at most, evenly spaced in split order."""
    if length < 1:
        raise ValueError(f"length={length}: need at least one target per document")
    ends = np.append(doc_starts[1:], len(tokens))
    chosen = np.flatnonzero(ends - doc_starts >= length + 1)
    if len(chosen) == 0:
        longest = int((ends - doc_starts).max(initial=0))
        raise ValueError(
            f"no held-out document has length + 1 = {length + 1} tokens (the longest has {longest}); lower the "
            "evaluation length or use a corpus of long documents such as data=long_mix"
        )
    if max_docs is not None and max_docs < len(chosen):
        chosen = chosen[np.arange(max_docs) * len(chosen) // max_docs]
    windows = np.stack([np.asarray(tokens[doc_starts[i] : doc_starts[i] + length + 1]) for i in chosen])
    return LongDocuments([doc_ids[i] for i in chosen], windows.astype(np.int64))


def sliding_windows(length: int, context: int, stride: int) -> list[tuple[int, int]]:
    """(start, first scored target) of the windows that score each of `length` targets once. A window covers the
    inputs start..start + width - 1 (width = min(context, length)) and scores the targets from its second element
    to its end: the first window all of them, each later one the `stride` (or fewer, for the last) targets past the
    previous window's end."""
    if context < 1 or not 1 <= stride <= context:
        raise ValueError(f"need context >= 1 and 1 <= stride <= context; got context={context}, stride={stride}")
    width = min(context, length)
    windows, end = [(0, 0)], width
    while end < length:
        new_end = min(end + stride, length)
        windows.append((new_end - width, end))
        end = new_end
    return windows


@torch.no_grad()
def token_losses(
    model: nn.Module, docs: LongDocuments, context: int, stride: int, device: torch.device, batch_tokens: int
) -> np.ndarray:
    """Loss (nats, float64) of every target of every document, (n_docs, length), each target predicted with the
    history `sliding_windows` gives it. `model` maps token ids (B, T) to logits (B, T, V) for T <= context;
    batch_tokens bounds the tokens of one forward pass (at least one window)."""
    plan = sliding_windows(docs.length, context, stride)
    width = min(context, docs.length)
    jobs = list(itertools.product(range(len(docs.doc_ids)), plan))  # (document, (start, first scored))
    tokens = torch.from_numpy(docs.tokens)
    losses = np.full((len(docs.doc_ids), docs.length), np.nan)
    was_training = model.training
    model.eval()
    per_batch = max(1, batch_tokens // width)
    for batch in (jobs[i : i + per_batch] for i in range(0, len(jobs), per_batch)):
        rows = torch.tensor([doc for doc, _ in batch])
        starts = torch.tensor([start for _, (start, _) in batch])
        windows = tokens[rows[:, None], starts[:, None] + torch.arange(width + 1)].to(device)  # (b, width + 1)
        batch_losses = _per_target_loss(model, windows[:, :-1], windows[:, 1:], device).cpu().numpy()
        for (doc, (start, first)), row in zip(batch, batch_losses, strict=True):
            losses[doc, first : start + width] = row[first - start :]
    model.train(was_training)
    return losses


def _per_target_loss(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, device: torch.device
) -> torch.Tensor:
    with autocast(device):
        logits = _at_least_fp32(model(inputs))  # (b, T, V)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view_as(targets).double()


def _at_least_fp32(logits: torch.Tensor) -> torch.Tensor:
    """bf16 logits (autocast) in fp32 for the softmax; fp32 and fp64 as they are."""
    return logits.float() if logits.element_size() < 4 else logits


def position_bins(length: int, first: int) -> list[tuple[int, int]]:
    """[lo, hi) bins of absolute position covering 0..length - 1: [0, first), then doubling ([first, 2 first), ...)."""
    if first < 1:
        raise ValueError(f"the first position bin must hold at least one position, got {first}")
    bounds = [0, first]
    while bounds[-1] < length:
        bounds.append(2 * bounds[-1])
    return [(lo, min(hi, length)) for lo, hi in itertools.pairwise(bounds)]


def bin_name(lo: int, hi: int) -> str:
    return f"{lo}-{hi - 1}"


def summarize_losses(losses: np.ndarray, bins: list[tuple[int, int]]) -> dict:
    """Mean loss over all targets and per position bin, and the same per document (for paired comparisons)."""
    if np.isnan(losses).any():
        raise ValueError("some targets were not scored; the window plan does not cover the documents")
    return {
        "loss": float(losses.mean()),
        "bins": {bin_name(lo, hi): float(losses[:, lo:hi].mean()) for lo, hi in bins},
        "per_doc": losses.mean(axis=1).tolist(),
        "per_doc_bins": {bin_name(lo, hi): losses[:, lo:hi].mean(axis=1).tolist() for lo, hi in bins},
    }


# --- passkey retrieval ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PasskeyTrial:
    tokens: np.ndarray  # int64: <|endoftext|>, text, needle, `distance` tokens of text, question, answer
    answer_start: int  # index in tokens of the answer's first token (a number key takes 1 to 3 tokens)
    needle_start: int  # index in tokens of the needle's first token
    distractors: np.ndarray  # (CHOICES - 1, answer length) int64: other keys' answers, scored in the answer's place


def passkey_trials(
    docs: LongDocuments, distances: list[int], n_trials: int, seed: int, probe: Probe = PROBES["prose"]
) -> dict[int, list[PasskeyTrial]]:
    """n_trials trials per distance, the same for every model (they depend on the documents and the seed only). The
    text around the needle is a contiguous stretch of one long held-out document; within a distance every trial has
    the same length (the text before the needle makes up for keys of fewer tokens)."""
    encoding = get_tokenizer()
    trials = {}
    for distance in distances:
        if not 1 <= distance <= docs.length - 2 * PASSKEY_PREFIX:
            raise ValueError(
                f"passkey distance {distance} must be in [1, {docs.length - 2 * PASSKEY_PREFIX}]: the text around the "
                f"needle comes from one document of {docs.length} targets"
            )
        rng = np.random.default_rng([seed, distance])
        distractor_rng = np.random.default_rng([seed, distance, 1])  # its own stream: the trials stay as they were
        keys = _keys(probe, rng, n_trials)
        needles = [encoding.encode_ordinary(probe.needle.format(**key)) for key in keys]
        questions = [encoding.encode_ordinary(probe.question.format(**key)) for key in keys]
        answers = [encoding.encode_ordinary(probe.answer.format(**key)) for key in keys]
        longest = max(len(n) + len(q) + len(a) for n, q, a in zip(needles, questions, answers, strict=True))
        trials[distance] = []
        for key, needle, question, answer in zip(keys, needles, questions, answers, strict=True):
            before = PASSKEY_PREFIX + longest - len(needle) - len(question) - len(answer)
            doc = int(rng.integers(len(docs.doc_ids)))
            start = 1 + int(rng.integers(docs.length - before - distance + 1))  # past the <|endoftext|>
            text = docs.tokens[doc, start : start + before + distance]
            parts = [[EOT_ID], text[:before], needle, text[before:], question, answer]
            tokens = np.concatenate([np.asarray(part, dtype=np.int64) for part in parts])
            distractors = _distractors(probe, key, len(answer), distractor_rng, encoding)
            trials[distance].append(PasskeyTrial(tokens, len(tokens) - len(answer), 1 + before, distractors))
    return trials


@torch.no_grad()
def passkey_scores(
    model: nn.Module, trials: dict[int, list[PasskeyTrial]], context: int, device: torch.device, batch_tokens: int
) -> dict[int, dict[str, float | bool]]:
    """Per distance: accuracy (share of trials whose every key token is the argmax), the mean loss of a key token,
    choice accuracy (share of trials whose answer the model finds strictly more likely than each of its
    distractors), and the share of trials whose whole needle lies within the last `context` + 1 tokens the model
    is given (the rest are cut off). Trials of one distance have one length (passkey_trials)."""
    was_training = model.training
    model.eval()
    scores = {}
    for distance, group in trials.items():
        inputs = torch.from_numpy(np.stack([trial.tokens for trial in group]))[:, -(context + 1) :]
        cut = len(group[0].tokens) - inputs.shape[1]  # tokens dropped from the left
        answer_starts = torch.tensor([trial.answer_start - cut for trial in group])
        tail = int(answer_starts.min())  # the first target scored in any trial
        in_answer = torch.arange(tail, inputs.shape[1]) >= answer_starts[:, None]  # (n_trials, scored targets)
        exact, key_losses, likelihoods = _score_answers(model, inputs, in_answer, tail, device, batch_tokens)
        # The answer ends every trial: each distractor takes its place in a copy of the trial's inputs.
        others = inputs.repeat_interleave(CHOICES - 1, dim=0)  # (n_trials · (CHOICES - 1), context + 1)
        for i, trial in enumerate(group):
            rows = slice(i * (CHOICES - 1), (i + 1) * (CHOICES - 1))
            others[rows, -trial.distractors.shape[1] :] = torch.from_numpy(trial.distractors)
        in_other = in_answer.repeat_interleave(CHOICES - 1, dim=0)
        _, _, other_likelihoods = _score_answers(model, others, in_other, tail, device, batch_tokens)
        chosen = likelihoods > other_likelihoods.view(len(group), CHOICES - 1).max(dim=1).values
        scores[distance] = {
            "accuracy": exact.double().mean().item(),
            "key_loss": key_losses.mean().item(),
            "choice_accuracy": chosen.double().mean().item(),
            "needle_in_context": float(np.mean([trial.needle_start >= cut for trial in group])),
        }
    model.train(was_training)
    return scores


def _score_answers(
    model: nn.Module, inputs: Tensor, in_answer: Tensor, tail: int, device: torch.device, batch_tokens: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Per row of inputs (n, L), whose answer tokens are the targets marked in in_answer (n, L - tail): whether every
    answer token is the argmax, the mean loss of an answer token, and the answer's log-likelihood (float64)."""
    exact, mean_losses, likelihoods = [], [], []
    per_batch = max(1, batch_tokens // inputs.shape[1])
    for batch, mask in zip(inputs.split(per_batch), in_answer.split(per_batch), strict=True):
        batch = batch.to(device)
        with autocast(device):
            logits = _at_least_fp32(model(batch[:, :-1])[:, tail - 1 :])  # (b, scored targets, V)
        targets, mask = batch[:, tail:], mask.to(device)
        hit = (logits.argmax(-1) == targets) | ~mask
        loss = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none") * mask
        exact.append(hit.all(dim=1).cpu())
        mean_losses.append((loss.sum(1) / mask.sum(1)).cpu())
        likelihoods.append(-loss.double().sum(1).cpu())
    return torch.cat(exact), torch.cat(mean_losses).double(), torch.cat(likelihoods)
