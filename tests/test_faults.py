"""Runs that cannot be lost, corrupted or hijacked: crafted and damaged checkpoints, run dirs that already hold a
run, changed settings on resume, leftovers of killed processes, and the start-up checks. The end-to-end cases
run train.py as a user does (tests/training_runs.py: gpt2-tiny, sdpa, Shakespeare, CPU)."""

import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from flashgpt.data import DataConfig, get_tokenizer, load_splits
from flashgpt.data.fetch import kjv_debs
from flashgpt.data.integrity import ShardError
from flashgpt.data.shards import shard_dir
from flashgpt.model.gpt import GPT, ModelConfig
from flashgpt.temporary_files import STALE_AFTER_S, owner_prefix
from flashgpt.training.checkpoint import (
    LATEST,
    CheckpointError,
    capture_rng_state,
    last_good_checkpoint,
    load_checkpoint,
    load_training_state,
    remove_abandoned_saves,
    restore_rng_state,
    save_checkpoint,
    verify_checkpoint,
)
from flashgpt.training.config import EvalConfig, TrainConfig, register_configs, typed_config, validate
from flashgpt.training.resume import (
    ResumeConfigError,
    apply_optimizer_settings,
    check_resume_config,
    optimizer_settings,
)
from flashgpt.training.schedule import build_scheduler, lr_at
from training_runs import REPO, TINY, assert_ok, read_metrics, read_result, train

CONFIG_DIR = str(REPO / "configs")
# A run of 4 steps stopped after step 2, with its checkpoint: the starting point of most tests here.
SCHEDULE = ["train.max_steps=4", "checkpoint.every=2", "eval.every=2"]
STOPPED = [*SCHEDULE, "train.stop_at_step=2"]
RESUME = [*SCHEDULE, "resume=auto"]


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("stopped") / "run"
    assert_ok(train(run_dir, *STOPPED))
    return run_dir


@pytest.fixture
def run_dir(stopped_run, tmp_path) -> Path:
    """A private copy of the stopped run."""
    return Path(shutil.copytree(stopped_run, tmp_path / "run"))


def latest(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / LATEST


def failed(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0, proc.stdout[-3000:]
    return proc.stderr


# --- 1. loading never runs code from a file ---


class Payload:
    """Unpickling this object runs `touch <marker>`: what a crafted checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_checkpoint_is_refused_without_running_its_payload(run_dir, tmp_path):
    marker = tmp_path / "payload-ran"
    state = load_checkpoint(latest(run_dir))
    state["config"] = Payload(marker)
    torch.save(state, latest(run_dir))  # a sound archive: only the pickle inside is hostile
    proc = train(run_dir, *RESUME)
    stderr = failed(proc)
    assert f"checkpoint {latest(run_dir)} holds an object of posix.system" in stderr
    assert "refusing to unpickle it" in stderr
    assert not marker.exists()


def test_a_payload_in_a_plain_pickle_or_a_torch_archive_never_runs(tmp_path):
    marker, path = tmp_path / "payload-ran", tmp_path / LATEST
    path.write_bytes(pickle.dumps({"model": Payload(marker)}))
    with pytest.raises(CheckpointError, match=f"checkpoint {path} is truncated or damaged"):
        load_checkpoint(path)
    save_checkpoint({"model": Payload(marker)}, path)
    verify_checkpoint(path)  # a sound archive this time
    with pytest.raises(CheckpointError, match=f"checkpoint {path} holds an object of posix.system"):
        load_checkpoint(path)
    assert not marker.exists()


def test_rng_states_are_plain_tensors_and_restore_every_stream(tmp_path):
    random.gauss(0, 1), np.random.standard_normal()  # leave a cached Gaussian in both
    state = capture_rng_state()
    save_checkpoint({"rng": state}, tmp_path / LATEST)
    expected = (random.random(), random.gauss(0, 1), np.random.standard_normal(3), torch.rand(3))
    restore_rng_state(load_checkpoint(tmp_path / LATEST)["rng"])  # weights_only=True inside
    again = (random.random(), random.gauss(0, 1), np.random.standard_normal(3), torch.rand(3))
    assert expected[:2] == again[:2]
    assert np.array_equal(expected[2], again[2]) and torch.equal(expected[3], again[3])


# --- 2. an existing run dir is never overwritten silently ---


def test_a_new_run_into_a_run_dir_that_holds_one_is_refused(run_dir):
    metrics_before = (run_dir / "metrics.jsonl").read_bytes()
    checkpoint_before = latest(run_dir).read_bytes()
    config_before = (run_dir / "resolved_config.yaml").read_bytes()
    stderr = failed(train(run_dir, "train.max_steps=2"))
    assert f"run dir {run_dir} already holds a run (metrics.jsonl, result.json, checkpoints/{LATEST})" in stderr
    assert "Pass resume=auto to continue it, overwrite=true to delete it and start again" in stderr
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics_before
    assert latest(run_dir).read_bytes() == checkpoint_before
    assert (run_dir / "resolved_config.yaml").read_bytes() == config_before  # the refused run's config is not it


def test_overwrite_true_starts_the_run_again(run_dir):
    assert_ok(train(run_dir, "train.max_steps=1", "overwrite=true"))
    assert [m["step"] for m in read_metrics(run_dir)] == [1]
    assert load_checkpoint(latest(run_dir))["step"] == 1
    assert "contradict each other" in failed(train(run_dir, "overwrite=true", "resume=auto"))


def test_resume_auto_in_a_run_dir_without_a_checkpoint_keeps_the_earlier_run(tmp_path):
    run_dir = tmp_path / "run"
    assert_ok(train(run_dir, "train.max_steps=2", "checkpoint.every=0"))
    before = {name: (run_dir / name).read_bytes() for name in ("metrics.jsonl", "result.json")}
    stderr = failed(train(run_dir, "train.max_steps=4", "checkpoint.every=0", "model.n_layer=1", "resume=auto"))
    assert f"resume=auto: run dir {run_dir} holds a run (metrics.jsonl, result.json) but no checkpoint of it" in stderr
    assert "Pass overwrite=true to delete it and start again, or another hydra.run.dir" in stderr
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    assert "It has no checkpoint to resume. Pass overwrite=true" in failed(train(run_dir, "train.max_steps=2"))


def test_overwrite_true_deletes_the_earlier_runs_files_and_nothing_else(tmp_path):
    run_dir = tmp_path / "run"
    assert_ok(train(run_dir, "train.max_steps=1", "wandb.mode=offline"))
    [earlier_wandb_run] = (run_dir / "wandb").glob("offline-run-*")
    notes = run_dir / "checkpoints" / "notes.txt"
    notes.write_text("the user's own file")
    assert_ok(train(run_dir, "train.max_steps=1", "wandb.mode=offline", "overwrite=true"))
    [wandb_run] = (run_dir / "wandb").glob("offline-run-*")  # `wandb sync` would upload the earlier one too
    assert wandb_run != earlier_wandb_run
    assert notes.read_text() == "the user's own file"


def test_overwrite_true_never_deletes_the_checkpoint_it_extends_from(run_dir):
    checkpoint_before = latest(run_dir).read_bytes()
    stderr = failed(train(run_dir, "seq_len=128", "overwrite=true", f"extend_from={latest(run_dir)}"))
    assert f"extend_from={latest(run_dir)} is the checkpoint of the run in {run_dir}, which overwrite=true" in stderr
    assert latest(run_dir).read_bytes() == checkpoint_before


# --- 3. a changed setting on resume is applied or refused ---


@pytest.mark.parametrize(
    ("override", "refusal"),
    [
        ("model.d_model=256", "model.d_model=128 in the checkpoint, model.d_model=256 now"),
        ("seq_len=32", "seq_len=64 in the checkpoint, seq_len=32 now"),
    ],
)
def test_a_setting_that_cannot_change_on_resume_is_refused_with_both_values(run_dir, override, refusal):
    stderr = failed(train(run_dir, *RESUME, override))
    assert f"cannot resume from {latest(run_dir)} with these settings changed" in stderr
    assert refusal in stderr
    assert "size mismatch" not in stderr


def test_a_changed_learning_rate_on_resume_is_applied(run_dir):
    proc = train(run_dir, *RESUME, "train.lr=1e-2", "train.warmup_steps=3")
    assert_ok(proc)
    assert "applied from the next step: train.lr: 0.003 -> 0.01" in proc.stdout
    metrics = read_metrics(run_dir)
    new_schedule = TrainConfig(lr=1e-2, warmup_steps=3, max_steps=4)
    assert [m["train/lr"] for m in metrics[2:]] == pytest.approx([lr_at(3, new_schedule), lr_at(4, new_schedule)])


def test_resume_policy_per_key(tmp_path):
    saved = {"seed": 0, "model": {"dropout": 0.0, "init_from": "hf:gpt2", "n_head": 2}, "train": {"lr": 1e-3}}
    applied = {"seed": 0, "model": {"dropout": 0.1, "init_from": None, "n_head": 2}, "train": {"lr": 2e-3}}
    assert check_resume_config(saved, applied, tmp_path / LATEST) == [
        "model.dropout: 0.0 -> 0.1",
        "train.lr: 0.001 -> 0.002",
    ]
    refused = {**applied, "seed": 1, "data": {"document_mask": True}, "attention": {"name": "naive"}}
    with pytest.raises(ResumeConfigError) as refusal:
        check_resume_config(
            {**saved, "data": {"document_mask": False}, "attention": {"name": "flash"}}, refused, tmp_path
        )
    assert "attention.name=flash in the checkpoint, attention.name=naive now" in str(refusal.value)
    assert "seed=0 in the checkpoint, seed=1 now (the seed orders the data windows" in str(refusal.value)
    assert "data.document_mask=False in the checkpoint, data.document_mask=True now" in str(refusal.value)


def test_a_setting_the_checkpoint_predates_is_compared_with_its_default(tmp_path):
    """A checkpoint written before model.position_embedding existed ran with its default, learned positions."""
    saved = {"seed": 0, "model": {"n_head": 2}}
    learned = {"seed": 0, "model": {"n_head": 2, "position_embedding": "learned", "rope_base": 10000.0}}
    assert check_resume_config(saved, learned, tmp_path / LATEST) == []
    rope = {"seed": 0, "model": {"n_head": 2, "position_embedding": "rope"}}
    with pytest.raises(ResumeConfigError, match=r"model.position_embedding not in the checkpoint \(so learned\), "):
        check_resume_config(saved, rope, tmp_path / LATEST)
    evaluated = check_resume_config(saved, {**saved, "eval": {"every": 7}}, tmp_path / LATEST)
    assert evaluated == [f"eval.every: {EvalConfig().every} -> 7"]


def test_resumed_optimizer_takes_the_new_hyperparameters_and_keeps_its_moments():
    old, new = TrainConfig(lr=1e-3, weight_decay=0.1, beta2=0.95), TrainConfig(lr=5e-3, weight_decay=0.0, beta2=0.99)
    model = GPT(ModelConfig(n_layer=1, n_head=2, d_model=32, vocab_size=64), 8, "naive")
    optimizer = model.configure_optimizer(old.lr, old.weight_decay, (old.beta1, old.beta2), "cpu")
    scheduler = build_scheduler(optimizer, old)
    for _ in range(3):
        model(torch.randint(0, 64, (2, 8))).sum().backward()
        optimizer.step(), scheduler.step()
    saved_optimizer, saved_scheduler = optimizer.state_dict(), scheduler.state_dict()

    resumed = model.configure_optimizer(new.lr, new.weight_decay, (new.beta1, new.beta2), "cpu")
    resumed_scheduler = build_scheduler(resumed, new)
    settings = optimizer_settings(resumed)
    resumed.load_state_dict(saved_optimizer)
    resumed_scheduler.load_state_dict(saved_scheduler)
    assert resumed.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]  # the saved state won, until:
    apply_optimizer_settings(resumed, resumed_scheduler, settings)

    decay, no_decay = resumed.param_groups
    assert decay["lr"] == no_decay["lr"] == lr_at(4, new)
    assert (decay["weight_decay"], no_decay["weight_decay"], decay["betas"]) == (0.0, 0.0, (0.9, 0.99))
    assert all(torch.equal(resumed.state[p]["exp_avg"], optimizer.state[p]["exp_avg"]) for p in model.parameters())
    resumed.step(), resumed_scheduler.step()
    assert resumed.param_groups[0]["lr"] == lr_at(5, new)


# --- 4. token caches are verified, and rebuilt or refused ---


@pytest.fixture
def corpus(tmp_path) -> DataConfig:
    """A text_files corpus of four small documents, with its own cache."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(4):
        (folder / f"doc{i}.txt").write_text(f"Document {i}. " + "All the world's a stage. " * (20 + 7 * i))
    return DataConfig(name="text_files", path=str(folder), cache_dir=str(tmp_path / "cache"), val_fraction=0.25)


def overwrite_with(tokens: np.ndarray):
    def damage(path: Path) -> None:
        data = np.fromfile(path, dtype=np.uint16)
        data[1 : 1 + len(tokens)] = tokens[: len(data) - 1]
        data.tofile(path)

    return damage


CACHE_DAMAGE = {
    "truncated": ("train.bin", lambda path: path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])),
    "empty": ("train.bin", lambda path: path.write_bytes(b"")),
    "odd-size": ("train.bin", lambda path: path.write_bytes(path.read_bytes() + b"\x00")),
    "random-in-vocab": ("train.bin", overwrite_with(np.random.default_rng(0).integers(0, 50256, 100, dtype=np.uint16))),
    "out-of-vocab": ("val.bin", overwrite_with(np.full(3, 60000, dtype=np.uint16))),
    "docs": ("train_docs.npy", lambda path: np.save(path, np.load(path)[::-1].copy())),
    "bad-meta": ("meta.json", lambda path: path.write_text(path.read_text()[:-40])),
    "old-meta": ("meta.json", lambda path: path.write_text(json.dumps({"format_version": 1}))),
}


@pytest.mark.parametrize("case", list(CACHE_DAMAGE))
def test_a_damaged_token_cache_is_refused_naming_the_file_or_rebuilt(corpus, case):
    name, damage = CACHE_DAMAGE[case]
    good = load_splits(corpus)
    directory = Path(good.meta["shard_dir"])
    train_tokens, val_tokens = np.array(good.train), np.array(good.val)
    damage(directory / name)
    with pytest.raises(ShardError, match=f"{directory / name}|{directory / name.split('.')[0]}"):
        load_splits(corpus, prepare_if_missing=False)
    rebuilt = load_splits(corpus)  # what the trainer does: tokenize again
    assert np.array_equal(rebuilt.train, train_tokens) and np.array_equal(rebuilt.val, val_tokens)


def test_edited_text_files_make_the_cache_stale(corpus):
    first = load_splits(corpus)
    directory, doc = Path(first.meta["shard_dir"]), Path(corpus.path) / "doc0.txt"
    os.utime(doc, ns=(0, 0))  # only the time changes (a copy): the same text, so the cache is kept
    assert load_splits(corpus, prepare_if_missing=False).meta["created_utc"] == first.meta["created_utc"]
    doc.write_text("Document 0, rewritten. " * 30)
    with pytest.raises(ShardError, match=f"{directory} is stale: .*doc0.txt \\(edited\\)"):
        load_splits(corpus, prepare_if_missing=False)
    (Path(corpus.path) / "doc4.txt").write_text("A fifth document. " * 30)
    with pytest.raises(ShardError, match=r"doc0.txt \(edited\).*doc4.txt \(added\)|doc4.txt \(added\).*doc0"):
        load_splits(corpus, prepare_if_missing=False)
    texts = decoded(load_splits(corpus))
    assert "Document 0, rewritten." in texts and "A fifth document." in texts


def decoded(splits) -> str:
    return get_tokenizer().decode(np.concatenate([splits.train, splits.val]).tolist())


def test_abandoned_staging_folders_are_removed_and_live_ones_kept(corpus):
    directory = shard_dir(corpus)
    directory.parent.mkdir(parents=True)
    dead = directory.parent / f"{owner_prefix(directory.name, pid=dead_pid())}abc"
    live = directory.parent / f"{owner_prefix(directory.name)}def"
    retired = directory.parent / f"{owner_prefix(directory.name + '.old', pid=dead_pid())}ghi"
    for folder in (dead, live, retired):
        folder.mkdir()
        (folder / "all.bin").write_bytes(b"\x00" * 64)
    load_splits(corpus)
    assert not dead.exists() and not retired.exists() and live.is_dir()


def test_a_tampered_cached_deb_is_refused_before_its_program_runs(tmp_path):
    if shutil.which("apt-get") is None:
        pytest.skip("the KJV Bible comes from Debian's apt")
    cached = kjv_debs(REPO / ".cache" / "data" / "downloads")  # downloads them if absent
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    for deb in cached.values():
        shutil.copy(deb, downloads)
    assert kjv_debs(downloads).keys() == cached.keys()
    reader = downloads / cached["bible-kjv"].name
    reader.write_bytes(reader.read_bytes() + b"#!/bin/sh\n")
    with pytest.raises(ValueError, match=f"{reader} has sha256 [0-9a-f]{{64}}; the trusted builds of it have"):
        kjv_debs(downloads)


# --- 5. damaged checkpoints are detected, and never named as the last good one ---


def flip_bytes(path: Path, count: int, seed: int = 0) -> None:
    data = bytearray(path.read_bytes())
    generator = torch.Generator().manual_seed(seed)
    for index in torch.randint(0, len(data), (count,), generator=generator).tolist():
        data[index] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda path: flip_bytes(path, 2000), "is damaged: record .* fails its CRC-32 check|is truncated or damaged"),
        (lambda path: flip_bytes(path, 1, seed=3), "is damaged: record .* fails its CRC-32 check|truncated or damaged"),
        (lambda path: path.write_bytes(path.read_bytes()[: path.stat().st_size // 2]), "is truncated or damaged"),
        (lambda path: path.write_bytes(b""), r"is empty \(0 bytes\)"),
    ],
    ids=["2000-flipped-bytes", "one-flipped-byte", "truncated", "empty"],
)
def test_a_damaged_checkpoint_fails_with_an_error_naming_it(tmp_path, damage, message):
    path = tmp_path / LATEST
    save_checkpoint({"weights": torch.randn(100_000), "step": 7}, path)
    verify_checkpoint(path)
    damage(path)
    with pytest.raises(CheckpointError, match=f"checkpoint {path} ({message})"):
        load_checkpoint(path)
    assert last_good_checkpoint(path) is None


def test_a_file_that_is_not_a_training_checkpoint_is_refused_naming_it(tmp_path):
    path = tmp_path / LATEST
    save_checkpoint({"step": 3}, path)
    with pytest.raises(CheckpointError, match=f"checkpoint {path} is not a training checkpoint: it lacks model, "):
        load_training_state(path)
    with zipfile.ZipFile(path, "w") as archive:  # a sound zip archive, but not torch's
        archive.writestr("notes.txt", "hello")
    with pytest.raises(CheckpointError, match=f"checkpoint {path} is not a torch checkpoint"):
        load_checkpoint(path)


@pytest.mark.parametrize("case", ["a run dir", "a foreign file", "temperature nan"])
def test_sample_names_what_is_wrong_with_its_arguments(stopped_run, tmp_path, case):
    if case == "a run dir":
        argv, message = [stopped_run], f"checkpoint {stopped_run} is a directory; pass the checkpoint file, e.g. "
    elif case == "a foreign file":
        torch.save({"weights": torch.ones(3)}, tmp_path / "weights.pt")
        argv, message = [tmp_path / "weights.pt"], f"checkpoint {tmp_path / 'weights.pt'} is not a training checkpoint"
    else:
        argv, message = [latest(stopped_run), "--temperature", "nan"], "--temperature nan is out of range: need"
    command = [sys.executable, "scripts/sample.py", *map(str, argv), "--max-new-tokens", "2"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_resume_from_a_damaged_checkpoint_stops_before_training(run_dir):
    flip_bytes(latest(run_dir), 2000)
    stderr = failed(train(run_dir, *RESUME))
    assert f"checkpoint {latest(run_dir)} is" in stderr and "resume from another checkpoint" in stderr
    assert read_result(run_dir)["step"] == 2  # the earlier run's result.json is untouched


# --- 6. leftovers and traps ---


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_only_abandoned_save_temporaries_are_removed(tmp_path):
    ours = owner_prefix(LATEST)  # .latest.pt.<pid>-<host>.
    live = tmp_path / f"{ours}live.tmp"
    dead = tmp_path / f"{owner_prefix(LATEST, pid=dead_pid())}dead.tmp"
    legacy_old, legacy_new = tmp_path / f".{LATEST}.abc123.tmp", tmp_path / f".{LATEST}.def456.tmp"
    other = tmp_path / "notes.tmp"
    for path in (live, dead, legacy_old, legacy_new, other):
        path.write_bytes(b"x")
    long_ago = time.time() - STALE_AFTER_S - 60
    os.utime(legacy_old, (long_ago, long_ago))
    assert sorted(remove_abandoned_saves(tmp_path)) == sorted([dead, legacy_old])
    assert sorted(tmp_path.iterdir()) == sorted([live, legacy_new, other])


def test_resuming_a_finished_run_keeps_its_result(run_dir):
    assert_ok(train(run_dir, *RESUME))
    finished = read_result(run_dir)
    assert finished["perf/tokens_per_sec"] > 0
    assert_ok(train(run_dir, *RESUME))  # nothing left to train: it evaluates again and keeps the measured speed
    assert read_result(run_dir) == finished


def test_a_torn_last_metrics_line_is_dropped_on_resume(run_dir):
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "train/lo')  # killed mid-write
    proc = train(run_dir, *RESUME)
    assert_ok(proc)
    assert "dropped its last line, cut short by an interrupted write" in proc.stdout
    assert [m["step"] for m in read_metrics(run_dir)] == [1, 2, 3, 4]


def test_resume_auto_in_a_new_timestamped_run_dir_names_the_runs_to_resume(stopped_run, tmp_path):
    runs = tmp_path / "runs"
    earlier = shutil.copytree(stopped_run, runs / "2026-01-01" / "10-00-00")
    fresh = runs / "2026-01-02" / "09-30-00"
    stderr = failed(train(fresh, *RESUME))
    assert f"resume=auto found no checkpoint in {fresh}: it is a new timestamped run dir" in stderr
    assert f"Newest runs with a checkpoint: {earlier}" in stderr


# --- 7. start-up checks ---


@pytest.fixture(scope="module")
def compose_config():
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        yield lambda *overrides: typed_config(compose("config", overrides=[*TINY, *overrides]))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.lr=inf", "train.lr=inf must be a finite number"),
        ("train.lr=nan", "train.lr=nan must be a finite number"),
        ("train.beta2=1.5", r"train.beta2=1.5 must be in \[0, 1\)"),
        ("model.d_model=0", "model.d_model=0 must be at least 1"),
        ("model.n_head=0", "model.n_head=0 must be at least 1"),
        ("model.n_layer=0", "model.n_layer=0 must be at least 1"),
        ("model.vocab_size=100", "model.vocab_size=100 is smaller than the tokenizer's 50257 tokens"),
    ],
)
def test_a_bad_setting_fails_at_start_up_naming_it(compose_config, override, message):
    with pytest.raises(ValueError, match=message):
        validate(compose_config(override))


def test_a_warmup_longer_than_the_run_is_warned_about(compose_config, caplog):
    validate(compose_config("train.max_steps=10", "train.warmup_steps=40"))
    assert "train.warmup_steps=40 is longer than the run (train.max_steps=10)" in caplog.text
    assert "climbs to 25% of train.lr" in caplog.text


def test_flash_with_an_unsupported_head_dim_fails_before_any_data_is_read(tmp_path):
    no_data = ["data=text_files", f"data.path={tmp_path / 'no-corpus'}"]  # reading data would fail too
    stderr = failed(train(tmp_path / "run", "attention=flash", "model.n_head=16", *no_data))
    assert "attention=flash runs head dims (model.d_model / model.n_head) that are multiples of 8" in stderr
    assert "this model's is 8" in stderr


# --- 8. kill -9 during checkpoint saves ---


def test_a_run_killed_during_checkpoint_saves_resumes_from_a_verified_checkpoint(tmp_path):
    """Kill the trainer at several points of a save (80 ms and 20 ms into the write, and as the temporary file
    appears), each time resuming the same run dir: the checkpoint must always verify, the final run must remove
    the killed saves' temporaries and log every step exactly once."""
    run_dir = tmp_path / "run"
    every_step = ["train.max_steps=400", "checkpoint.every=1", "log.every=1", "eval.every=0"]
    checkpoints = run_dir / "checkpoints"
    for attempt, delay in enumerate((0.08, 0.02, 0.0)):  # the last kill, at once, leaves a temporary for sure
        overrides = [*every_step, *(["resume=auto"] if attempt else [])]
        proc = _start_training(run_dir, overrides)
        try:
            _wait_for_a_save_in_progress(checkpoints, proc)
            time.sleep(delay)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        verify_checkpoint(latest(run_dir))  # a kill after the save's rename (longer delays) is as good
    assert list(checkpoints.glob(f".{LATEST}.*.tmp")), "the last kill did not land during a save"
    step = load_checkpoint(latest(run_dir))["step"]
    proc = train(run_dir, *every_step, f"train.stop_at_step={step + 2}", "resume=auto")
    assert_ok(proc)
    assert f"resumed from {latest(run_dir)} at step {step}" in proc.stdout
    assert "left behind by a process killed while writing latest.pt" in proc.stdout
    assert not list(checkpoints.glob(f".{LATEST}.*"))
    assert [m["step"] for m in read_metrics(run_dir)] == list(range(1, step + 3))


def _start_training(run_dir: Path, overrides: list[str]) -> subprocess.Popen:
    command = [sys.executable, "train.py", *TINY, *overrides, f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_for_a_save_in_progress(checkpoints: Path, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    """Return as soon as a save's temporary file exists, after a first checkpoint is in place."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the training run ended before it could be killed"
        if (checkpoints / LATEST).exists() and any(checkpoints.glob(f".{LATEST}.*.tmp")):
            return
        time.sleep(0.0005)
    raise AssertionError(f"no checkpoint save seen in {checkpoints} within {timeout_s} s")
