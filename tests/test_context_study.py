"""The context study: evaluations that isolate context (training/context_eval.py), context extension
(training/extension.py), and scripts/study.py + scripts/study_report.py end to end on tiny settings."""

import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from torch import nn

from flashgpt.data import DataConfig, get_tokenizer, load_splits
from flashgpt.data.python_code import stdlib_package_of, sympy_package_of
from flashgpt.data.shards import read_doc_ids
from flashgpt.model.gpt import GPT, ModelConfig
from flashgpt.model.rotary import rotary_tables
from flashgpt.training import jobs, study, study_plan, study_report
from flashgpt.training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from flashgpt.training.config import TrainConfig, register_configs, typed_config, validate
from flashgpt.training.context_eval import (
    CHOICES,
    KEY_WORDS,
    PROBES,
    RARE_WORDS,
    LongDocuments,
    long_documents,
    passkey_scores,
    passkey_trials,
    position_bins,
    sliding_windows,
    summarize_losses,
    token_losses,
)
from flashgpt.training.extension import ExtensionError, extend_from_checkpoint
from flashgpt.training.schedule import build_scheduler, lr_at

REPO = Path(__file__).resolve().parents[1]
CACHE = str(REPO / ".cache" / "data")
CPU = torch.device("cpu")
VOCAB = 50257


@pytest.fixture(scope="module")
def shakespeare_val() -> LongDocuments:
    """The first 600 targets of every held-out Shakespeare document (all are longer)."""
    cfg = DataConfig(cache_dir=CACHE)
    splits = load_splits(cfg)
    ids = read_doc_ids(Path(splits.meta["shard_dir"]))["val"]
    return long_documents(splits.val, splits.val_docs, ids, length=600)


def tiny_gpt(block_size: int, seed: int = 0, vocab_size: int = 50304, **model: object) -> GPT:
    """model: more ModelConfig fields, e.g. position_embedding="rope"."""
    torch.manual_seed(seed)
    cfg = ModelConfig(name="tiny", n_layer=2, n_head=2, d_model=32, vocab_size=vocab_size, **model)
    return GPT(cfg, block_size, "sdpa")


# --- long documents: CPython's library and tests, with prose ---


def _work_split(name: str, work_of) -> tuple[dict[str, list[str]], np.ndarray]:
    """The doc ids of each split of a code corpus, checking that no work (package) is on both sides; and the
    lengths of its held-out documents."""
    splits = load_splits(DataConfig(name=name, cache_dir=CACHE))
    ids = read_doc_ids(Path(splits.meta["shard_dir"]))
    works = {split: {work_of(doc) for doc in ids[split]} for split in ("train", "val")}
    assert works["train"] and works["val"] and not works["train"] & works["val"]
    return ids, np.diff(np.append(splits.val_docs, len(splits.val)))


def test_python_code_is_split_by_package_and_long_mix_adds_it_to_long_prose():
    stdlib, stdlib_val = _work_split("python_stdlib", lambda doc: stdlib_package_of(doc.removeprefix("python/")))
    sympy, sympy_val = _work_split("sympy", sympy_package_of)
    assert "python/asyncio/base_events.py" in stdlib["train"] + stdlib["val"]
    assert "sympy/polys/polytools.py" in sympy["train"] + sympy["val"]
    # Long held-out source files for the context evaluations.
    assert (stdlib_val >= 16385).sum() >= 20 and (sympy_val >= 16385).sum() >= 10
    prose_splits = load_splits(DataConfig(name="long_prose", cache_dir=CACHE))
    prose = read_doc_ids(Path(prose_splits.meta["shard_dir"]))
    mix_splits = load_splits(DataConfig(name="long_mix", cache_dir=CACHE))
    mix = read_doc_ids(Path(mix_splits.meta["shard_dir"]))
    for split in ("train", "val"):  # the split is by work, so each part keeps its own split inside the mix
        assert mix[split] == prose[split] + stdlib[split] + sympy[split]
    code = read_doc_ids(Path(load_splits(DataConfig(name="python_code", cache_dir=CACHE)).meta["shard_dir"]))
    for split in ("train", "val"):  # code alone: the same documents on the same sides
        assert code[split] == stdlib[split] + sympy[split]
    provenance = mix_splits.meta["provenance"]
    assert provenance["python_stdlib_skipped_not_utf8"] == 4 and len(provenance["python_stdlib"]) == 3
    assert "sympy-1.13.3.tar.gz" in provenance["sympy"] and "kjv" in provenance
    assert stdlib_package_of("test/test_asyncio/test_tasks.py") == "test/test_asyncio"
    assert stdlib_package_of("test/test_os.py") == "test/test_os" and stdlib_package_of("os.py") == "os"
    assert sympy_package_of("sympy/polys/tests/test_x.py") == sympy_package_of("sympy/polys/x.py") == "sympy/polys"


# --- loss by position and sliding windows ---


@pytest.mark.parametrize("length,context,stride", [(48, 16, 5), (48, 16, 16), (50, 16, 1), (10, 16, 4), (33, 8, 3)])
def test_sliding_windows_score_each_target_once_with_as_much_history_as_the_context_allows(length, context, stride):
    width = min(context, length)
    scored = np.zeros(length, dtype=int)
    history = np.zeros(length, dtype=int)
    for start, first in sliding_windows(length, context, stride):
        assert 0 <= start <= first < start + width <= length
        scored[first : start + width] += 1
        history[first : start + width] = np.arange(first, start + width) - start + 1  # inputs start..i
    assert (scored == 1).all()
    assert (history[:width] == np.arange(1, width + 1)).all()  # the first window: everything before
    assert (history[width:] >= context - stride + 1).all() and (history <= context).all()


def test_token_losses_equal_a_float64_reference_that_runs_each_target_on_its_own_history():
    model = tiny_gpt(block_size=64, vocab_size=256).double()  # a small vocabulary keeps the float64 runs quick
    rng = np.random.default_rng(1)
    docs = LongDocuments(["a", "b"], rng.integers(0, 256, size=(2, 49)))
    context, stride = 16, 5
    got = token_losses(model, docs, context, stride, CPU, batch_tokens=40)  # several windows a batch
    expected = np.empty_like(got)
    for doc in range(2):
        for i in range(docs.length):
            # the window that scores target i ends at the first end past i: min(context + k·stride, length)
            k = max(0, -(-(i + 1 - context) // stride))
            start = min(context + k * stride, docs.length) - context if i >= context else 0
            x = torch.from_numpy(docs.tokens[doc, start : i + 1])[None]
            with torch.no_grad():
                expected[doc, i] = F.cross_entropy(model(x)[0, -1], torch.tensor(docs.tokens[doc, i + 1])).item()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    # With the whole document as context, each target sees everything before it: one forward pass.
    whole = token_losses(model, docs, context=64, stride=64, device=CPU, batch_tokens=1)
    with torch.no_grad():
        x, y = torch.from_numpy(docs.tokens[:, :-1]), torch.from_numpy(docs.tokens[:, 1:])
        full = F.cross_entropy(model(x).transpose(1, 2), y, reduction="none").numpy()
    np.testing.assert_allclose(whole, full, rtol=0, atol=1e-12)


def test_position_bins_double_from_the_first_and_cover_every_position():
    assert position_bins(16384, 1024) == [(0, 1024), (1024, 2048), (2048, 4096), (4096, 8192), (8192, 16384)]
    assert position_bins(100, 32) == [(0, 32), (32, 64), (64, 100)]
    losses = np.arange(200, dtype=float).reshape(2, 100)
    summary = summarize_losses(losses, position_bins(100, 32))
    assert summary["bins"]["64-99"] == pytest.approx((np.arange(64, 100).mean() + np.arange(164, 200).mean()) / 2)
    assert summary["per_doc"] == [49.5, 149.5] and summary["loss"] == pytest.approx(99.5)
    with pytest.raises(ValueError, match="not scored"):
        summarize_losses(np.full((1, 4), np.nan), position_bins(4, 2))


def test_long_documents_are_whole_held_out_documents_cut_to_length(shakespeare_val):
    docs = shakespeare_val
    assert docs.tokens.shape == (len(docs.doc_ids), 601) and len(docs.doc_ids) >= 5
    assert (docs.tokens[:, 0] == 50256).all() and not (docs.tokens[:, 1:] == 50256).any()  # one document each
    cfg = DataConfig(cache_dir=CACHE)
    splits = load_splits(cfg)
    with pytest.raises(ValueError, match="no held-out document has"):
        long_documents(splits.val, splits.val_docs, docs.doc_ids, length=10**8)
    fewer = long_documents(splits.val, splits.val_docs, read_doc_ids(Path(splits.meta["shard_dir"]))["val"], 600, 3)
    assert len(fewer.doc_ids) == 3 and set(fewer.doc_ids) <= set(docs.doc_ids)


# --- passkey retrieval ---


class InductionOracle(nn.Module):
    """Predicts the token that followed the latest earlier occurrence of the last three tokens: a perfect
    induction head. It retrieves a passkey exactly when the needle is within its input."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*idx.shape, VOCAB, dtype=torch.float64)
        for b, row in enumerate(idx.tolist()):
            latest: dict[tuple[int, ...], int] = {}
            for t in range(2, len(row)):
                gram = tuple(row[t - 2 : t + 1])
                if gram in latest:
                    logits[b, t, row[latest[gram] + 1]] = 1.0
                latest[gram] = t
        return logits


def test_passkey_trials_are_fixed_and_of_one_length_per_distance(shakespeare_val):
    trials = passkey_trials(shakespeare_val, [10, 200], n_trials=6, seed=0)
    again = passkey_trials(shakespeare_val, [10, 200], n_trials=6, seed=0)
    encoding = get_tokenizer()
    for distance, group in trials.items():
        assert len({len(trial.tokens) for trial in group}) == 1
        for trial, same in zip(group, again[distance], strict=True):
            assert np.array_equal(trial.tokens, same.tokens)
            text = encoding.decode(trial.tokens[trial.needle_start :].tolist())
            key = encoding.decode(trial.tokens[trial.answer_start :].tolist()).strip()
            assert len(key) == 5 and text.startswith(f" The pass key is {key}. Remember it.")
            assert text.endswith(f"What is the pass key? The pass key is {key}")
    other_seed = passkey_trials(shakespeare_val, [10], n_trials=6, seed=1)
    assert not np.array_equal(other_seed[10][0].tokens, trials[10][0].tokens)
    with pytest.raises(ValueError, match="passkey distance"):
        passkey_trials(shakespeare_val, [590], n_trials=1, seed=0)


def test_the_code_probe_words_the_same_trials_as_python(shakespeare_val):
    prose = passkey_trials(shakespeare_val, [10, 200], n_trials=6, seed=0)
    code = passkey_trials(shakespeare_val, [10, 200], n_trials=6, seed=0, probe=PROBES["code"])
    encoding = get_tokenizer()
    for distance, group in code.items():
        assert len({len(trial.tokens) for trial in group}) == 1
        for trial, same in zip(group, prose[distance], strict=True):
            text = encoding.decode(trial.tokens[trial.needle_start :].tolist())
            key = encoding.decode(trial.tokens[trial.answer_start :].tolist()).strip()
            assert key == encoding.decode(same.tokens[same.answer_start :].tolist()).strip()  # the same keys
            assert text.startswith(f"\nPASS_KEY = {key}  # the pass key\n")
            assert text.endswith(f"\nassert PASS_KEY == {key}")


def test_the_code_probe_asks_for_a_binding_that_copying_cannot_answer(shakespeare_val):
    """`assert PASS_KEY ==` never occurs in the needle `PASS_KEY = <key>`: a perfect induction head, which
    answers the prose probe, cannot answer this one even with the needle in view."""
    trials = passkey_trials(shakespeare_val, [20], n_trials=4, seed=0, probe=PROBES["code"])
    scores = passkey_scores(InductionOracle(), trials, context=200, device=CPU, batch_tokens=1000)
    assert scores[20]["needle_in_context"] == 1.0 and scores[20]["accuracy"] == 0.0


def test_the_identifier_probe_asks_for_the_rest_of_a_name_assigned_in_the_needle(shakespeare_val):
    trials = passkey_trials(shakespeare_val, [10, 200], n_trials=6, seed=0, probe=PROBES["identifier"])
    encoding = get_tokenizer()
    for group in trials.values():
        assert len({len(trial.tokens) for trial in group}) == 1
        for trial in group:
            needle_text = encoding.decode(trial.tokens[trial.needle_start :].tolist())
            name = needle_text.split(" = None", 1)[0].removeprefix("\n")
            words = name.split("_")
            assert len(words) == len(set(words)) == 5 and set(words) <= set(KEY_WORDS)
            question_and_answer = encoding.decode(trial.tokens[trial.answer_start - 4 :].tolist())
            assert question_and_answer == "\n" + name  # the question: a line starting with the name's two words
            answer = trial.tokens[trial.answer_start :]
            assert encoding.decode(answer.tolist()) == "_" + "_".join(words[2:]) and len(answer) == 6
            # The needle holds the answer's very tokens, so copying them answers it.
            needle = trial.tokens[trial.needle_start : trial.needle_start + 10].tolist()  # "\n", w1, "_", w2, ...
            assert needle[4:] == answer.tolist()


def test_the_repeat_probe_asks_for_the_rest_of_a_run_of_rare_words(shakespeare_val):
    encoding = get_tokenizer()
    assert all(len(encoding.encode_ordinary(" " + word)) == 1 for word in RARE_WORDS)
    assert len(set(RARE_WORDS)) == len(RARE_WORDS)
    trials = passkey_trials(shakespeare_val, [10, 200], n_trials=6, seed=0, probe=PROBES["repeat"])
    for group in trials.values():
        assert len({len(trial.tokens) for trial in group}) == 1
        for trial in group:
            needle = trial.tokens[trial.needle_start : trial.needle_start + 8].tolist()
            words = encoding.decode(needle).split()
            assert encoding.decode(needle) == " " + " ".join(words)
            assert len(words) == len(set(words)) == 8 and set(words) <= set(RARE_WORDS)
            # the question is the run's first three tokens, the answer its other five: the needle's very tokens
            assert trial.tokens[trial.answer_start - 3 : trial.answer_start].tolist() == needle[:3]
            assert trial.tokens[trial.answer_start :].tolist() == needle[3:]


@pytest.mark.parametrize("probe", list(PROBES))
def test_each_trial_carries_distractors_of_the_answers_length_that_could_follow_its_question(shakespeare_val, probe):
    trials = passkey_trials(shakespeare_val, [10, 200], n_trials=6, seed=0, probe=PROBES[probe])
    again = passkey_trials(shakespeare_val, [10, 200], n_trials=6, seed=0, probe=PROBES[probe])
    encoding = get_tokenizer()
    for distance, group in trials.items():
        for trial, same in zip(group, again[distance], strict=True):
            answer = trial.tokens[trial.answer_start :]
            assert trial.distractors.shape == (CHOICES - 1, len(answer))
            assert np.array_equal(trial.distractors, same.distractors)  # fixed, like the trials
            texts = [encoding.decode(row.tolist()) for row in (answer, *trial.distractors)]
            assert len(set(texts)) == CHOICES  # every distractor differs from the answer and from the others
            if PROBES[probe].words:  # the rest of a run: words of the vocabulary that the question has not used
                separator, n_head = PROBES[probe].separator, PROBES[probe].head_words
                head_tokens = n_head if separator == " " else 2 * n_head - 1  # a "_" is a token of its own
                head = encoding.decode(trial.tokens[trial.answer_start - head_tokens : trial.answer_start].tolist())
                head_words = {word.strip() for word in head.split(separator)} - {""}
                assert len(head_words) == n_head and head_words <= set(PROBES[probe].vocabulary)
                for text in texts:
                    words = text.split(separator)[1:]
                    assert len(words) == len(set(words)) == PROBES[probe].words - n_head
                    assert set(words) <= set(PROBES[probe].vocabulary) and not set(words) & head_words
            else:
                assert all(len(text.strip()) == 5 and text.strip().isdigit() for text in texts)


def test_passkey_is_retrieved_exactly_when_the_needle_is_within_the_context(shakespeare_val):
    trials = passkey_trials(shakespeare_val, [20, 100, 300], n_trials=4, seed=0)
    scores = passkey_scores(InductionOracle(), trials, context=200, device=CPU, batch_tokens=1000)
    assert scores[20]["accuracy"] == 1.0 and scores[20]["needle_in_context"] == 1.0
    assert scores[100]["accuracy"] == 1.0 and scores[100]["needle_in_context"] == 1.0
    assert scores[300]["accuracy"] == 0.0 and scores[300]["needle_in_context"] == 0.0
    assert scores[20]["key_loss"] < scores[300]["key_loss"]
    # The oracle finds the answer more likely than every distractor with the needle in view; cut off, it scores
    # them all alike, and a tie is no choice.
    assert scores[20]["choice_accuracy"] == scores[100]["choice_accuracy"] == 1.0
    assert scores[300]["choice_accuracy"] == 0.0
    for probe in ("identifier", "repeat"):
        copies = passkey_trials(shakespeare_val, [20, 300], n_trials=4, seed=0, probe=PROBES[probe])
        scores = passkey_scores(InductionOracle(), copies, context=200, device=CPU, batch_tokens=1000)
        assert scores[20]["accuracy"] == 1.0 and scores[300]["accuracy"] == 0.0, probe
        assert scores[20]["choice_accuracy"] == 1.0 and scores[300]["choice_accuracy"] == 0.0, probe


# --- context extension ---


def _trained_state(block_size: int, train: TrainConfig, steps: int, **model_fields: object) -> tuple[GPT, dict]:
    """A tiny model trained `steps` steps at `block_size`, and a checkpoint of it as the trainer writes one."""
    model = tiny_gpt(block_size, **model_fields)
    optimizer = model.configure_optimizer(train.lr, train.weight_decay, (train.beta1, train.beta2), "cpu")
    scheduler = build_scheduler(optimizer, train)
    for _ in range(steps):
        x = torch.randint(0, VOCAB, (2, block_size + 1))
        F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten()).backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    config = {
        "model": json.loads(json.dumps(dataclasses.asdict(model.cfg))),  # plain values, enums as strings
        "data": {"name": "long_mix", "val_fraction": 0.1},
        "train": dataclasses.asdict(train),
        "seq_len": block_size,
    }
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "step": steps,
        "rank_states": [{}],
        "config": config,
        "wandb_run_id": None,
    }
    return model, state


def _fresh(block_size: int, train: TrainConfig, **model_fields: object):
    model = tiny_gpt(block_size, seed=7, **model_fields)
    optimizer = model.configure_optimizer(train.lr, train.weight_decay, (train.beta1, train.beta2), "cpu")
    return model, optimizer, build_scheduler(optimizer, train)


def test_extension_tiles_the_position_table_and_continues_weights_moments_and_schedule(tmp_path):
    train = TrainConfig(batch_size=2, max_steps=10, warmup_steps=2, lr=1e-3)
    short, state = _trained_state(16, train, steps=3)
    save_checkpoint(state, tmp_path / "latest.pt")
    model, optimizer, scheduler = _fresh(40, train)
    config = {**state["config"], "seq_len": 40}
    step = extend_from_checkpoint(tmp_path / "latest.pt", model, optimizer, scheduler, config, tokens_per_step=32)
    assert step == 3
    old_table, new_table = short.wpe.weight.detach(), model.wpe.weight.detach()
    assert new_table.shape == (40, 32)
    for p in range(40):
        assert torch.equal(new_table[p], old_table[p % 16])
    x = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():
        assert torch.equal(model(x), short(x))  # on windows of the old length it is the trained model
    index = [p is model.wpe.weight for group in optimizer.param_groups for p in group["params"]].index(True)
    old_moments = state["optimizer"]["state"][index]
    new_moments = optimizer.state[model.wpe.weight]
    for name in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(new_moments[name], torch.cat([old_moments[name]] * 3)[:40])
    assert float(new_moments["step"]) == 3
    assert scheduler.last_epoch == 3 and optimizer.param_groups[0]["lr"] == pytest.approx(lr_at(4, train))


def test_extension_refuses_a_checkpoint_of_another_schedule_model_or_a_longer_context(tmp_path):
    train = TrainConfig(batch_size=2, max_steps=10, warmup_steps=2, lr=1e-3)
    _, state = _trained_state(16, train, steps=1)
    save_checkpoint(state, tmp_path / "latest.pt")
    config = {**state["config"], "seq_len": 32, "train": {**state["config"]["train"], "lr": 2e-3}}
    with pytest.raises(ExtensionError, match=r"train.lr=0.001 in the checkpoint, train.lr=0.002 now"):
        extend_from_checkpoint(tmp_path / "latest.pt", *_fresh(32, train), config, tokens_per_step=32)
    with pytest.raises(ExtensionError, match="32 tokens per step in the checkpoint, 64 now"):
        extend_from_checkpoint(tmp_path / "latest.pt", *_fresh(32, train), {**state["config"], "seq_len": 32}, 64)
    with pytest.raises(ExtensionError, match="not shorter than this run's 16"):
        extend_from_checkpoint(tmp_path / "latest.pt", *_fresh(16, train), state["config"], tokens_per_step=32)
    with pytest.raises(FileNotFoundError, match="extend_from="):
        extend_from_checkpoint(tmp_path / "missing.pt", *_fresh(32, train), state["config"], tokens_per_step=32)


def test_extension_refuses_a_checkpoint_at_the_runs_last_step_or_a_file_that_is_no_checkpoint(tmp_path):
    """Extending from step 3 into a run that stops at step 3 or before would train nothing and report ok."""
    train = TrainConfig(batch_size=2, max_steps=10, warmup_steps=2, lr=1e-3)
    _, state = _trained_state(16, train, steps=3)
    save_checkpoint(state, tmp_path / "latest.pt")
    for fields, last_step in (({"max_steps": 3}, 3), ({"stop_at_step": 2}, 2)):
        config = {**state["config"], "seq_len": 32, "train": {**state["config"]["train"], **fields}}
        with pytest.raises(ExtensionError, match=f"is at step 3, but this run stops at step {last_step}"):
            extend_from_checkpoint(tmp_path / "latest.pt", *_fresh(32, train), config, tokens_per_step=32)
    torch.save({"weights": torch.ones(2)}, tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match=r"foreign\.pt is not a training checkpoint: it lacks model"):
        extend_from_checkpoint(tmp_path / "foreign.pt", *_fresh(32, train), state["config"], tokens_per_step=32)


def test_extension_can_interpolate_the_position_table_instead(tmp_path):
    train = TrainConfig(batch_size=2, max_steps=10, warmup_steps=2, lr=1e-3)
    short, state = _trained_state(16, train, steps=3)
    save_checkpoint(state, tmp_path / "latest.pt")
    model, optimizer, scheduler = _fresh(46, train)
    config = {**state["config"], "seq_len": 46, "extend_positions": "interpolate"}
    extend_from_checkpoint(tmp_path / "latest.pt", model, optimizer, scheduler, config, tokens_per_step=32)
    index = [p is model.wpe.weight for group in optimizer.param_groups for p in group["params"]].index(True)
    old = {"table": short.wpe.weight.detach(), **state["optimizer"]["state"][index]}
    new = {"table": model.wpe.weight.detach(), **optimizer.state[model.wpe.weight]}
    for name in ("table", "exp_avg", "exp_avg_sq"):
        # Row p sits at x = p · 15 / 45 = p / 3 of the old table: every third row is a trained one, the two
        # between are 1/3 and 2/3 of the way to the next.
        for p in range(46):
            lo, frac = divmod(p, 3)
            hi = min(lo + 1, 15)
            expected = (1 - frac / 3) * old[name][lo] + frac / 3 * old[name][hi]
            torch.testing.assert_close(new[name][p], expected, rtol=1e-6, atol=1e-7)
        assert torch.equal(new[name][0], old[name][0]) and torch.equal(new[name][45], old[name][15])


def test_a_rope_extension_keeps_every_weight_and_may_raise_the_base(tmp_path, caplog):
    train = TrainConfig(batch_size=2, max_steps=10, warmup_steps=2, lr=1e-3)
    short, state = _trained_state(16, train, steps=3, position_embedding="rope")
    save_checkpoint(state, tmp_path / "latest.pt")
    assert not any("rope" in key or "wpe" in key for key in state["model"])  # no table, no saved rotations
    config = {**state["config"], "seq_len": 64, "model": {**state["config"]["model"], "rope_base": 500000.0}}
    model, optimizer, scheduler = _fresh(64, train, position_embedding="rope", rope_base=500000.0)
    caplog.set_level("INFO", logger="flashgpt.training.extension")
    step = extend_from_checkpoint(tmp_path / "latest.pt", model, optimizer, scheduler, config, tokens_per_step=32)
    assert step == 3 and "model.rope_base 10000 -> 500000 (adjusted base frequency)" in caplog.text
    for name, value in short.state_dict().items():
        assert torch.equal(model.state_dict()[name], value)
    saved_moments, loaded = state["optimizer"]["state"], optimizer.state_dict()["state"]
    assert saved_moments.keys() == loaded.keys()
    for index, moments in saved_moments.items():
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(loaded[index][name], moments[name])
    # The same weights turned more slowly: the angles are the raised base's (head dim 16).
    assert torch.equal(model.rope_cos, rotary_tables(64, 16, 500000.0)[0])
    assert not torch.equal(model.rope_cos[:16], short.rope_cos)
    x = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():  # at an unchanged base, the longer model is the trained one on short windows
        same_base = tiny_gpt(64, position_embedding="rope")
        same_base.load_state_dict(model.state_dict())
        torch.testing.assert_close(same_base(x), short(x), rtol=0, atol=0)
    learned = {**config, "model": {**config["model"], "position_embedding": "learned"}}
    with pytest.raises(ExtensionError, match=r"'position_embedding': 'rope'.* in the checkpoint"):
        extend_from_checkpoint(tmp_path / "latest.pt", *_fresh(64, train), learned, tokens_per_step=32)


# --- the study: plan, runner, report ---


def test_recipes_share_their_common_first_stages_and_branch_where_a_longer_context_starts():
    spec = study_plan.load_spec("context")
    plan = study_plan.build_plan(spec)
    root = plan.nodes["seed0/1024"]
    # The 1K baseline trains once, stopping where the extensions (75%) and short-to-long (60%) branch off.
    assert root.parent is None and root.segments() == [1200, 1500, 2000]
    assert plan.finals[("fixed-1k", 0)] is root
    extension = plan.finals[("ext-16k", 0)]
    assert (extension.name, extension.parent, extension.branch_step) == ("seed0/1024x1500_16384", root, 1500)
    chain = study_plan.recipe_chain(plan, "short-to-long", 1)
    assert [(n.seq_len, first, last) for n, first, last in chain] == [
        (1024, 1, 1200), (2048, 1201, 1400), (4096, 1401, 1600), (8192, 1601, 1800), (16384, 1801, 2000)
    ]  # fmt: skip
    assert plan.finals[("fixed-16k", 0)].parent is None
    # An equal-time run gets its step count once its reference has trained.
    assert plan.finals[("fixed-1k-time", 0)].max_steps is None
    measured = study_plan.build_plan(spec, {("fixed-1k-time", 0): 2300})
    assert measured.finals[("fixed-1k-time", 0)].segments() == [2300]
    assert len(plan.nodes) == 2 * 18  # 9 runs of learned positions and 9 of rope a seed


def test_rope_recipes_share_their_arm_runs_and_raise_the_base_where_the_context_grows():
    spec = study_plan.load_spec("context")
    plan = study_plan.build_plan(spec)
    root = plan.nodes["seed0/rope/1024"]
    # rope's 1K run is its own (not learned positions' seed0/1024), and stops where its recipes branch off.
    assert plan.finals[("rope-fixed-1k", 0)] is root and root.segments() == [1500, 1800, 2000]
    assert root.overrides == ("model.position_embedding=rope",)
    plain, abf = plan.finals[("rope-ext-16k-90", 0)], plan.finals[("rope-ext-16k-90-abf", 0)]
    assert (plain.name, plain.parent, plain.branch_step) == ("seed0/rope/1024x1800_16384", root, 1800)
    assert (abf.name, abf.parent, abf.branch_step) == ("seed0/rope/1024x1800_16384+rope_base500000", root, 1800)
    assert abf.overrides == ("model.position_embedding=rope", "model.rope_base=500000")
    chain = study_plan.recipe_chain(plan, "rope-staged-abf", 0)
    assert [(n.seq_len, first, last, n.overrides[1:]) for n, first, last in chain] == [
        (1024, 1, 1500, ()),
        (4096, 1501, 1800, ("model.rope_base=500000",)),
        (16384, 1801, 2000, ("model.rope_base=500000",)),
    ]
    assert spec.recipes["rope-ext-16k-75-abf"].describe() == "rope: 1024 -> 16384 at 75% with model.rope_base=500000"
    # The job's command carries the arm and the stage's overrides after the spec's, and train.py accepts them.
    command = study.train_command(spec, REPO / "runs" / "context", abf, stop_step=2000)
    assert command[-3:] == [*abf.overrides, "hydra.run.dir=runs/context/seed0/rope/1024x1800_16384+rope_base500000"]
    assert "extend_from=runs/context/seed0/rope/1024/checkpoints/branch-1800.pt" in command
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = typed_config(compose("config", overrides=command[2:-1]))  # all but python train.py and the run dir
    validate(cfg)
    assert (cfg.model.position_embedding.value, cfg.model.rope_base, cfg.seq_len) == ("rope", 500000.0, 16384)
    # Learned positions' runs are where they were: results exported before arms existed still match the plan.
    assert plan.finals[("ext-16k", 0)].name == "seed0/1024x1500_16384" and plan.nodes["seed0/1024"].overrides == ()


def test_a_shared_run_trains_only_as_far_as_the_selected_recipes_branch_off_it(tmp_path):
    spec = study_plan.load_spec("context_code")
    plan = study_plan.build_plan(spec)
    root, branch = plan.nodes["seed0/rope/1024"], plan.finals[("rope-ext-16k-75-abf5m", 0)]
    assert root.segments() == [750, 1125, 1350, 1500] and branch.branch_step == 1125

    def finish(node: study_plan.Node, step: int) -> None:  # what a train.py job leaves behind
        (tmp_path / node.name / "checkpoints").mkdir(parents=True, exist_ok=True)
        (tmp_path / node.name / "checkpoints" / "latest.pt").write_text(f"step {step}")
        (tmp_path / node.name / "result.json").write_text(json.dumps({"status": "ok", "step": step}))

    only_branch = study.select(spec, ["rope-ext-16k-75-abf5m"], [0])
    assert study.next_job(plan, tmp_path, only_branch) == ("train", root, 750)
    finish(root, 750)
    assert study.next_job(plan, tmp_path, only_branch) == ("train", root, 1125)
    finish(root, 1125)
    # The 1K run stops at the branch step: its last 375 steps serve no selected recipe.
    assert study.next_job(plan, tmp_path, only_branch) == ("train", branch, 1500)
    assert (tmp_path / root.name / "checkpoints" / "branch-1125.pt").read_text() == "step 1125"
    # Selected itself later, it continues from where it stopped.
    with_root = study.select(spec, ["rope-fixed-1k", "rope-ext-16k-75-abf5m"], [0])
    assert study.next_job(plan, tmp_path, with_root) == ("train", root, 1350)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"recipes": {"a": {"stages": [[1024, 0.5], [512, 1.0]]}}, "baseline": "a"}, "longer seq_len"),
        ({"recipes": {"a": {"stages": [[1024, 0.5]]}}, "baseline": "a"}, "must end at 1.0"),
        ({"recipes": {"a": {"stages": [[1024, 1.0]], "equal_time_to": "b"}}, "baseline": "a"}, "equal_time_to"),
        ({"recipes": {"a": {"stages": "1024"}}, "baseline": "a"}, "pairs"),
        ({"baseline": "nope"}, "baseline 'nope' is not a recipe"),
        ({"max_step": 3}, "unknown keys"),
        ({"recipes": {"a": {"stages": [[64, 1.0]], "arm": "rope"}}}, "arm 'rope' is not one of the spec's arms"),
        ({"recipes": {"a": {"stages": [[64, 1.0, "model.rope_base=5"]]}}}, r"\[16384, 1.0, \{model.rope_base"),
        ({"recipes": {"a": {"stages": [[64, 1.0, {"model.rope_base": "5 0"}]]}}}, "names its run dir"),
        (
            {"recipes": {"a": {"stages": [[64, 1.0, {"model.x": 1}]]}, "b": {"stages": [[64, 1.0, {"data.x": 1}]]}}},
            "another recipe's run of that name",
        ),
    ],
)
def test_a_bad_study_spec_is_refused_naming_the_file_and_the_problem(change, message):
    raw = {"preset": "context_study", "max_steps": 100, "baseline": "a", "recipes": {"a": {"stages": [[64, 1.0]]}}}
    with pytest.raises(ValueError, match=message) as error:
        study_plan.parse_spec("bad", {**raw, **change}, where="configs/study/bad.yaml")
    assert "configs/study/bad.yaml" in str(error.value)


def test_each_arm_is_compared_with_its_own_fixed_context_baseline():
    spec = study_plan.load_spec("context")
    recipes = spec.recipes
    for name in ("rope-ext-16k-90-abf", "rope-ext-16k-75", "rope-staged-abf", "rope-fixed-16k", "rope-fixed-1k-time"):
        assert study_report.baseline_name(spec, recipes[name]) == "rope-fixed-1k"
    # The arm's baseline against the study's: the position encoding alone; the learned recipes as before.
    assert study_report.baseline_name(spec, recipes["rope-fixed-1k"]) == "fixed-1k"
    assert study_report.baseline_name(spec, recipes["ext-16k"]) == "fixed-1k"
    assert study_report.baseline_name(spec, recipes["fixed-1k"]) is None

    def model(recipe: str, seed: int) -> study_report.Model:
        return study_report.Model(recipes[recipe], seed, recipe, {}, None, None)

    models = [model(r, s) for r in ("fixed-1k", "rope-fixed-1k", "rope-ext-16k-90-abf") for s in (0, 1)]
    base = study_report.baseline_of(spec, models, models[5])
    assert (base.recipe.name, base.seed) == ("rope-fixed-1k", 1)
    assert study_report.baseline_of(spec, models[:2], models[5]) is None  # no rope-fixed-1k: no comparison


def _raw_dir(root: Path, runs: dict[str, int]) -> Path:
    """A raw/ folder as `study.py export` writes it, with runs {name: reached step}, each evaluated once finished."""
    nodes = {}
    for name, step in runs.items():
        (root / "runs" / name).mkdir(parents=True)
        (root / "runs" / name / study.STUDY_STATE).write_text(
            json.dumps({"jobs": [{"wall_s": 1.0}], "where": str(root)})
        )
        if step == 8:
            (root / "evals" / name).parent.mkdir(parents=True, exist_ok=True)
            (root / "evals" / f"{name}.json").write_text(json.dumps({"where": str(root)}))
        nodes[name] = {"seq_len": 64, "reached_step": step, "max_steps": 8}
    finals = [{"recipe": name, "seed": 0, "node": name} for name in runs]
    (root / "plan.json").write_text(json.dumps({"study": "context_smoke", "nodes": nodes, "finals": finals}))
    (root / "spec.yaml").write_text(f"from: {root}\n")
    return root


def test_import_merge_keeps_the_runs_the_export_lacks_and_the_further_of_two(tmp_path):
    import tarfile

    results = tmp_path / "results"
    _raw_dir(results / "raw", {"seed0/64": 8, "seed0/64x6_256": 8, "seed0/rope/64": 8})
    export = _raw_dir(tmp_path / "export", {"seed0/rope/64": 6, "seed0/rope/64x6_256": 8})
    with tarfile.open(tmp_path / "raw.tar.gz", "w:gz") as archive:
        for path in export.iterdir():
            archive.add(path, arcname=path.name)

    raw = study.import_results(tmp_path / "raw.tar.gz", results, merge=True)
    plan = json.loads((raw / "plan.json").read_text())
    origin = {
        name: json.loads((raw / "runs" / name / study.STUDY_STATE).read_text())["where"] for name in plan["nodes"]
    }
    old, new = str(results / "raw"), str(export)
    # Kept from raw/: the other arm's runs, and the run that had gone further there; the rest is the export's.
    assert origin == {"seed0/rope/64": old, "seed0/rope/64x6_256": new, "seed0/64": old, "seed0/64x6_256": old}
    assert plan["nodes"]["seed0/rope/64"]["reached_step"] == 8
    assert sorted(f["node"] for f in plan["finals"]) == sorted(origin)
    assert {p.relative_to(raw / "evals").as_posix() for p in (raw / "evals").rglob("*.json")} == {
        "seed0/64.json", "seed0/64x6_256.json", "seed0/rope/64.json", "seed0/rope/64x6_256.json"
    }  # fmt: skip
    assert (raw / "spec.yaml").read_text() == f"from: {export}\n"
    assert not (results / ".raw.new").exists()

    # Without --merge the export replaces raw/; a raw/ of another study is refused and left as it was.
    raw = study.import_results(tmp_path / "raw.tar.gz", results)
    assert sorted(json.loads((raw / "plan.json").read_text())["nodes"]) == ["seed0/rope/64", "seed0/rope/64x6_256"]
    plan = json.loads((raw / "plan.json").read_text())
    (raw / "plan.json").write_text(json.dumps({**plan, "study": "other"}))
    with pytest.raises(SystemExit, match="cannot merge study 'context_smoke'"):
        study.import_results(tmp_path / "raw.tar.gz", results, merge=True)
    assert json.loads((raw / "plan.json").read_text())["study"] == "other"


def test_a_job_past_its_deadline_is_stopped_and_a_failed_one_names_its_error(tmp_path):
    """training/jobs.py, the runner of the study's and the sweep's jobs."""
    log = tmp_path / "job.log"
    command = ["python", "-c", "import time; print('started', flush=True); time.sleep(60)"]
    returncode, stopped, wall_s = jobs.run_job(command, log, cwd=tmp_path, deadline=time.monotonic() + 2)
    assert stopped and returncode != 0 and wall_s < 30
    assert "started" in log.read_text()

    failing = ["python", "-c", "print('working'); raise ValueError('no such shard: x.bin')"]
    assert jobs.run_job(failing, log, cwd=tmp_path) == (1, False, pytest.approx(0, abs=30))
    assert jobs.failure_line(log) == "ValueError: no such shard: x.bin"


def test_pack_data_ships_the_shards_and_run_unpacks_them_where_missing(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    spec = dataclasses.replace(
        study_plan.load_spec("context_smoke"), overrides=("data=shakespeare", f"data.cache_dir={cache}")
    )
    source = Path(load_splits(DataConfig(cache_dir=CACHE)).meta["shard_dir"])
    shutil.copytree(source, cache / source.name)
    monkeypatch.setattr(study, "SHIP_DIR", tmp_path / "ship")
    pack = study.pack_data(spec)
    assert pack == tmp_path / "ship" / f"{source.name}.tar.xz" and pack.stat().st_size < 0.5 * 2**20 * 6
    shutil.rmtree(cache / source.name)
    study.ensure_data(spec)
    for file in source.iterdir():
        assert (cache / source.name / file.name).read_bytes() == file.read_bytes()


def test_the_smoke_study_runs_resumes_exports_and_reports_end_to_end(tmp_path):
    runs, results = tmp_path / "runs", tmp_path / "results" / "context_smoke"
    cli = [sys.executable, "scripts/study.py"]

    def call(*args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([*cli, *args], cwd=REPO, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-4000:]}"
        return proc

    first = call("run", "context_smoke", "--runs-dir", str(runs), "--recipes", "fixed-64")
    assert "study complete" in first.stdout and not (runs / "seed0" / "64x6_256").exists()
    second = call("run", "context_smoke", "--runs-dir", str(runs), "--export", str(tmp_path / "raw.tar.gz"))
    assert "seed0/64:" not in second.stdout  # done in the first piece: continued, not redone
    assert "study complete" in second.stdout

    # The extension continued the baseline's checkpoint at step 6, at a longer context, to the last step.
    spec = study_plan.load_spec("context_smoke")
    plan = study_plan.current_plan(spec, runs)
    extension = runs / "seed0" / "64x6_256"
    steps = [json.loads(line)["step"] for line in (extension / "metrics.jsonl").read_text().splitlines()]
    assert steps[0] == 7 and steps[-1] == 8
    assert (runs / "seed0" / "64" / "checkpoints" / "branch-6.pt").is_file()
    # The equal-time baseline got the extension's training time in steps of the 1K... here 64-token run.
    expected = round(
        study_plan.train_seconds(plan, runs, "ext-256", 0)
        / statistics.median(study_plan.step_times(runs, plan.nodes["seed0/64"], 1, 8))
    )
    assert plan.finals[("fixed-64-time", 0)].max_steps == max(1, expected)

    # The evaluation file is what context_eval computes from the run's checkpoint.
    def model_at(run_dir: Path, block_size: int) -> GPT:
        model = GPT(ModelConfig(name="gpt2-tiny", n_layer=2, n_head=2, d_model=128), block_size, "sdpa")
        model.load_state_dict(load_checkpoint(run_dir / "checkpoints" / "latest.pt")["model"])
        return model

    evaluation = json.loads((runs / "evals" / "seed0" / "64x6_256.json").read_text())
    model = model_at(extension, 256)
    splits = load_splits(DataConfig(cache_dir=CACHE))
    val_ids = read_doc_ids(Path(splits.meta["shard_dir"]))["val"]
    docs = long_documents(splits.val, splits.val_docs, val_ids, length=256, max_docs=3)
    assert docs.doc_ids == evaluation["doc_ids"]
    losses = token_losses(model, docs, context=256, stride=64, device=CPU, batch_tokens=2048)
    assert evaluation["contexts"]["256"]["loss"] == pytest.approx(losses.mean(), rel=1e-6)
    assert set(evaluation["contexts"]) == {"64", "128", "256"} and set(evaluation["passkey"]) == {"16", "100"}
    assert evaluation["passkey"]["100"]["needle_in_context"] == 1.0
    assert set(evaluation["passkey_code"]) == set(evaluation["passkey_identifier"]) == {"16", "100"}
    assert set(evaluation["passkey_repeat"]) == {"16", "100"}
    assert all(0 <= score["choice_accuracy"] <= 1 for score in evaluation["passkey_repeat"].values())
    # Read in consecutive windows: at its own 256 tokens the extension reads each 256-target document in one window.
    assert evaluation["consecutive"]["loss"] == pytest.approx(losses.mean(), rel=1e-6)
    baseline = json.loads((runs / "evals" / "seed0" / "64.json").read_text())
    restarts = token_losses(model_at(runs / "seed0" / "64", 64), docs, context=64, stride=64, device=CPU,
                            batch_tokens=2048)  # fmt: skip
    assert baseline["consecutive"]["loss"] == pytest.approx(restarts.mean(), rel=1e-6)

    # The report is built from the exported raw files alone: the runs are gone by then.
    shutil.rmtree(runs)
    study.import_results(tmp_path / "raw.tar.gz", results)
    report = subprocess.run([sys.executable, "scripts/study_report.py", str(results)], cwd=REPO,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert report.returncode == 0, report.stderr[-4000:]
    text = (results / "report.md").read_text()
    for recipe in ("fixed-64", "ext-256", "fixed-64-time"):
        assert f"| {recipe} |" in text
    assert "| fixed-64 | 0 | 64 | 0.00 | 0.00 (cut off) |" in text  # the 100-token passkey is beyond 64 tokens
    assert "extend_from=" in text and "train.stop_at_step=6" in text  # the commands that made each run
    sections = (
        "### Change against the baseline, by position",
        "## Reading in consecutive windows",
        "Mean loss of a key token",
        "## Passkey retrieval, code",
        "## Identifier copy",
        "## Repeated words",
        f"Choice accuracy: the share of trials where the model finds the answer strictly more likely than each of "
        f"{CHOICES - 1} distractors",
    )
    for section in sections:
        assert section in text
    assert "repeated-words copy choice accuracy (chance 0.10)" in text
    assert "read in consecutive windows of each model's own context" in text  # ext-256 against fixed-64
    for plot in ("loss_by_position.png", "context.png", "passkey.png", "passkey_choice.png"):
        assert matplotlib.image.imread(results / plot).shape[0] > 100
