"""GPT-2 weights in and out of Hugging Face transformers (model/hf.py), checked against transformers itself: a
randomly initialised GPT2LMHeadModel (no network) -> import -> the same logits -> export -> from_pretrained -> the
same logits again."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_module
from safetensors.torch import load_file, save_file
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

from flashgpt.model import hf
from flashgpt.model.gpt import GPT, ModelConfig
from flashgpt.training import export
from flashgpt.training.checkpoint import save_checkpoint
from flashgpt.training.config import register_configs, typed_config, validate
from flashgpt.training.saved_model import model_from_checkpoint
from training_runs import assert_ok, read_result, train

VOCAB = 50257  # GPT-2's; ours is padded to 50304
N_POSITIONS = 32
SHAPE = {"n_layer": 2, "n_head": 2, "d_model": 64}


def source_model(seed: int = 0, **overrides) -> GPT2LMHeadModel:
    """A small GPT-2 in transformers with every tensor random: LayerNorm gains and all biases too, so that a
    swapped or untransposed tensor cannot go unnoticed."""
    torch.manual_seed(seed)
    config = GPT2Config(
        n_layer=SHAPE["n_layer"],
        n_head=SHAPE["n_head"],
        n_embd=SHAPE["d_model"],
        n_positions=N_POSITIONS,
        vocab_size=VOCAB,
        attn_implementation="eager",
        **overrides,
    )
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".ln_" in name and name.endswith("weight"):
                param.normal_(1.0, 0.2)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.05)
    return model


@pytest.fixture(scope="module")
def source_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpt2-small-random")
    source_model().save_pretrained(out)
    return out


def imported(source_dir: Path, block_size: int = N_POSITIONS, attention: str = "naive") -> GPT:
    model = GPT(ModelConfig(name="tiny", **SHAPE), block_size, attention).eval()
    hf.load_into(model, f"hf:{source_dir}")
    return model


def tokens(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_imported_weights_give_transformers_logits(source_dir: Path) -> None:
    idx = tokens(N_POSITIONS)
    theirs = source_model()(idx).logits  # (B, T, 50257)
    ours = imported(source_dir)
    torch.testing.assert_close(ours(idx)[..., :VOCAB], theirs, rtol=1e-5, atol=1e-5)
    # In float64 (sdpa: the naive backend scores in fp32) the two agree to rounding: the mapping itself is exact.
    theirs64 = source_model().double()(idx).logits
    ours64 = imported(source_dir, attention="sdpa").double()
    torch.testing.assert_close(ours64(idx)[..., :VOCAB], theirs64, rtol=0, atol=1e-12)


@torch.no_grad()
def test_imported_weights_give_transformers_logits_with_our_flash_kernel(source_dir: Path) -> None:
    idx = tokens(N_POSITIONS)
    theirs = source_model()(idx).logits
    ours = imported(source_dir, attention="flash")  # the Triton kernel, through the interpreter on a CPU
    torch.testing.assert_close(ours(idx)[..., :VOCAB], theirs, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_export_is_loaded_by_transformers_with_the_same_logits(source_dir: Path, tmp_path: Path) -> None:
    ours = imported(source_dir)
    hf.export(ours, tmp_path / "export")
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert (config["vocab_size"], config["n_positions"], config["n_embd"]) == (VOCAB, N_POSITIONS, 64)
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path / "export", attn_implementation="eager").eval()
    idx = tokens(N_POSITIONS, seed=2)
    # Import then export gives the source's tensors back bit for bit, so the same computation gives the same bits.
    assert torch.equal(reloaded(idx).logits, source_model()(idx).logits)
    torch.testing.assert_close(reloaded(idx).logits, ours(idx)[..., :VOCAB], rtol=1e-5, atol=1e-5)
    assert reloaded.lm_head.weight.data_ptr() == reloaded.transformer.wte.weight.data_ptr()  # still tied


@torch.no_grad()
@torch.no_grad()
def test_export_into_a_model_dir_needs_force_and_then_replaces_it_whole(source_dir: Path, tmp_path: Path) -> None:
    """A sharded model already there: without --force nothing changes; with it, no stale shard or index is left."""
    out = tmp_path / "export"
    source_model(seed=3).save_pretrained(out, max_shard_size="100KB")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert "model.safetensors.index.json" in before
    ours = imported(source_dir)
    with pytest.raises(FileExistsError, match=f"{out} exists and is not empty: pass --force to replace it"):
        hf.export(ours, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    hf.export(ours, out, force=True)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in source_dir.iterdir())
    reloaded = GPT2LMHeadModel.from_pretrained(out, attn_implementation="eager").eval()
    idx = tokens(N_POSITIONS, seed=2)
    assert torch.equal(reloaded(idx).logits, source_model()(idx).logits)


@pytest.mark.parametrize("vocab_size", [0, -5, 60000])
def test_export_vocab_size_must_fit_the_table(source_dir: Path, tmp_path: Path, vocab_size: int) -> None:
    with pytest.raises(ValueError, match=re.escape(f"vocab_size (--vocab-size) = {vocab_size}: must be in [1, 50304]")):
        hf.export(imported(source_dir), tmp_path / "export", vocab_size)
    assert not (tmp_path / "export").exists()


def _training_checkpoint(path: Path, **config) -> Path:
    model = GPT(ModelConfig(name="tiny", **SHAPE), N_POSITIONS, "naive")
    saved = {"model": {"name": "tiny", **SHAPE}, "attention": {"name": "naive"}, "seq_len": N_POSITIONS, **config}
    state = {"model": model.state_dict(), "optimizer": {}, "scheduler": {}, "step": 1, "rank_states": []}
    save_checkpoint({**state, "config": saved, "wandb_run_id": "x"}, path)
    return path


@pytest.mark.parametrize("checkpoint", ["document mask", "foreign"])
def test_export_refuses_what_gpt2_cannot_compute_or_is_no_checkpoint(
    tmp_path: Path, checkpoint: str, capsys: pytest.CaptureFixture
) -> None:
    if checkpoint == "document mask":
        path = _training_checkpoint(tmp_path / "latest.pt", data={"document_mask": True})
        message = "data.document_mask=True: GPT-2 in transformers attends to every earlier token"
    else:
        path = tmp_path / "weights.pt"
        torch.save({"weights": torch.ones(3)}, path)
        message = f"checkpoint {path} is not a training checkpoint: it lacks model, optimizer"
    with pytest.raises(SystemExit):
        export.main([str(path), str(tmp_path / "export")])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "export").exists()


def test_init_from_refuses_another_model_type_and_missing_weights(tmp_path: Path) -> None:
    model = GPT(ModelConfig(name="tiny", **SHAPE), N_POSITIONS, "naive")
    BertModel(
        BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256)
    ).save_pretrained(tmp_path / "bert")
    with pytest.raises(ValueError, match=r"hf:.*bert is a 'bert' model, not GPT-2"):
        hf.load_into(model, f"hf:{tmp_path / 'bert'}")
    source_model().save_pretrained(tmp_path / "gpt2")
    weights = load_file(tmp_path / "gpt2" / "model.safetensors")
    save_file({k: v for k, v in weights.items() if ".h.1." not in k}, tmp_path / "gpt2" / "model.safetensors")
    with pytest.raises(ValueError, match=r"lacks 12 of GPT-2's weights or has them in another shape \(transformer.h.1"):
        hf.load_into(model, f"hf:{tmp_path / 'gpt2'}")


def test_a_small_source_vocabulary_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    GPT2LMHeadModel(
        GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=N_POSITIONS, vocab_size=1000)
    ).save_pretrained(tmp_path)
    hf.load_into(GPT(ModelConfig(name="tiny", **SHAPE), N_POSITIONS, "naive"), f"hf:{tmp_path}")
    assert "has 1000 tokens, fewer than GPT-2's 50257: token ids from 1000 up start as the mean row" in caplog.text


def test_padded_vocab_rows_are_the_mean_row_and_cost_at_most_log_1_plus_n_over_v(source_dir: Path) -> None:
    ours, theirs = imported(source_dir), source_model()
    wte = ours.wte.weight
    n_pad = wte.size(0) - VOCAB
    assert n_pad == 47
    mean_row = theirs.transformer.wte.weight.mean(dim=0)
    assert torch.equal(wte[VOCAB:], mean_row.expand(n_pad, -1))
    idx = tokens(N_POSITIONS, seed=3)
    targets = tokens(N_POSITIONS, seed=4)
    loss_ours = F.cross_entropy(ours(idx).flatten(0, 1).double(), targets.flatten())
    loss_theirs = F.cross_entropy(theirs(idx).logits.flatten(0, 1).double(), targets.flatten())
    assert 0 < loss_ours - loss_theirs <= math.log1p(n_pad / VOCAB)  # Jensen's bound (model/hf.py)


@torch.no_grad()
def test_a_longer_context_tiles_the_position_table_and_keeps_the_first_positions_exact(source_dir: Path) -> None:
    source_wpe = source_model().transformer.wpe.weight
    ours = imported(source_dir, block_size=80)
    wpe = ours.wpe.weight
    assert torch.equal(wpe[:32], source_wpe) and torch.equal(wpe[32:64], source_wpe)
    assert torch.equal(wpe[64:], source_wpe[:16])
    idx = tokens(N_POSITIONS)
    torch.testing.assert_close(ours(idx)[..., :VOCAB], source_model()(idx).logits, rtol=1e-5, atol=1e-5)
    assert ours(tokens(80)).shape == (2, 80, 50304)


@torch.no_grad()
def test_a_shorter_context_keeps_the_first_rows(source_dir: Path) -> None:
    ours = imported(source_dir, block_size=16)
    assert torch.equal(ours.wpe.weight, source_model().transformer.wpe.weight[:16])
    idx = tokens(16)
    torch.testing.assert_close(ours(idx)[..., :VOCAB], source_model()(idx).logits, rtol=1e-5, atol=1e-5)


def test_a_model_config_of_another_shape_is_refused_with_the_fix(source_dir: Path) -> None:
    model = GPT(ModelConfig(name="gpt2-tiny", n_layer=3, n_head=2, d_model=64), N_POSITIONS, "naive")
    with pytest.raises(ValueError, match=r"has n_layer, n_head, d_model = \(2, 2, 64\), but model=gpt2-tiny has"):
        hf.load_into(model, f"hf:{source_dir}")


def test_another_architecture_is_refused(tmp_path: Path) -> None:
    source_model(activation_function="relu", scale_attn_by_inverse_layer_idx=True).save_pretrained(tmp_path)
    model = GPT(ModelConfig(name="tiny", **SHAPE), N_POSITIONS, "naive")
    with pytest.raises(ValueError, match="activation_function='relu', scale_attn_by_inverse_layer_idx=True"):
        hf.load_into(model, f"hf:{tmp_path}")


@pytest.mark.parametrize("init_from", ["gpt2", "hf:", "/models/gpt2"])
def test_init_from_needs_the_hf_prefix(init_from: str) -> None:
    with pytest.raises(ValueError, match=r"expected hf:<directory or Hub name>"):
        hf.hf_source(init_from)


def test_a_missing_source_says_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(OSError, match=r"model.init_from=hf:.*no-such-model: transformers could not load a GPT-2"):
        hf.load_hf_gpt2(str(tmp_path / "no-such-model"))


def test_a_trained_checkpoint_goes_out_to_transformers_and_back_in_through_init_from(
    tmp_path: Path, tiny_run: tuple[Path, subprocess.CompletedProcess]
) -> None:
    """train.py -> `python -m flashgpt.training.export` -> transformers loads it with the checkpoint's logits ->
    train.py model.init_from=hf:<export> starts from it: its validation loss (after one step at lr 1e-9) is the
    trained run's, up to the padded rows' bound. The trained run is test_train.py's 20 steps (tests/conftest.py)."""
    trained, proc = tiny_run
    assert_ok(proc)
    checkpoint, exported = trained / "checkpoints" / "latest.pt", tmp_path / "exported"
    command = [sys.executable, "-m", "flashgpt.training.export", str(checkpoint), str(exported)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"GPT2LMHeadModel.from_pretrained('{exported}')" in proc.stdout

    ours = model_from_checkpoint(checkpoint).model.eval()
    reloaded = GPT2LMHeadModel.from_pretrained(exported, attn_implementation="eager").eval()
    idx = tokens(64)
    with torch.no_grad():
        expected = ours(idx)[..., :VOCAB]
        # Two float32 implementations (transformers' Conv1D addmm, our F.linear) round in different orders: their
        # logits differ by a few hundred ulps of the largest logit at most (seen: up to 2^-18.4 of it, so 2^-16
        # leaves a 5x margin); a wrong weight mapping would differ by O(1).
        tolerance = 2**-16 * expected.abs().max().item()
        torch.testing.assert_close(reloaded(idx).logits, expected, rtol=0, atol=tolerance)

    started = tmp_path / "started"
    proc = train(
        started, f"model.init_from=hf:{exported}", "train.max_steps=1", "train.lr=1e-9", "train.warmup_steps=0"
    )
    assert_ok(proc)
    assert f"model weights from hf:{exported}" in proc.stdout
    trained_loss, started_loss = read_result(trained)["val/loss"], read_result(started)["val/loss"]
    assert trained_loss < 9.0  # it learned: a fresh model scores ln(50257) = 10.8
    assert abs(started_loss - trained_loss) <= math.log1p(47 / VOCAB)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.init_from=gpt2"], r"model.init_from='gpt2': expected hf:<directory or Hub name>"),
        (["model.init_from=hf:gpt2", "extend_from=run/latest.pt"], "model.init_from and extend_from both give"),
    ],
)
def test_init_from_is_checked_at_start_up(overrides: list[str], message: str) -> None:
    register_configs()
    with initialize_config_module(config_module="flashgpt.configs", version_base="1.3"):
        cfg = typed_config(compose("config", overrides=overrides))
    with pytest.raises(ValueError, match=message):
        validate(cfg)
