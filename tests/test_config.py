"""Config composition with the real Hydra compose API over configs/, and the start-up checks on top of it."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import ConfigKeyError

from flashgpt.training.config import (
    Config,
    Device,
    WandbMode,
    grad_accum_steps,
    register_configs,
    typed_config,
    validate,
)

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "configs")
# The README's command line, minus what only the launcher reads (hydra.run.dir).
CONTRACT = [
    "model=gpt2-tiny", "attention=flash", "data=shakespeare", "seq_len=128", "train.batch_size=4",
    "train.grad_accum=1", "train.max_steps=30", "train.lr=1e-3", "eval.every=10", "eval.steps=2",
    "checkpoint.every=10", "log.every=1", "model.dropout=0.0", "wandb.mode=disabled", "device=cpu", "seed=0",
]  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def hydra_configs():
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        yield


def load(*overrides: str) -> Config:
    return typed_config(compose("config", overrides=list(overrides)))


def test_defaults_compose_to_gpt2_with_flash():
    cfg = load()
    assert (cfg.model.name, cfg.model.n_layer, cfg.model.d_model, cfg.model.vocab_size) == ("gpt2", 12, 768, 50304)
    assert cfg.attention.name == "flash" and cfg.seq_len == 1024
    assert cfg.data.name == "shakespeare"
    assert cfg.wandb.mode is WandbMode.offline and cfg.device is Device.auto and cfg.resume is None
    validate(cfg)


def test_the_contract_command_line_composes():
    cfg = load(*CONTRACT)
    assert (cfg.model.name, cfg.model.n_layer, cfg.seq_len, cfg.train.lr) == ("gpt2-tiny", 2, 128, 1e-3)
    assert (cfg.eval.every, cfg.checkpoint.every, cfg.log.every) == (10, 10, 1)
    assert cfg.wandb.mode is WandbMode.disabled and cfg.device is Device.cpu
    validate(cfg)


def test_quickstart_preset_is_a_short_cpu_job_with_flash():
    """configs/experiment/quickstart.yaml: what a new user runs first, without a GPU (the flash-on-CPU training
    path itself is run end to end in test_train.py)."""
    cfg = load("experiment=quickstart")
    validate(cfg)
    assert (cfg.model.name, cfg.attention.name, cfg.data.name) == ("gpt2-tiny", "flash", "shakespeare")
    assert cfg.device is Device.auto and cfg.wandb.mode is WandbMode.offline and cfg.resume is None
    tokens = cfg.train.max_steps * cfg.train.batch_size * cfg.seq_len * grad_accum_steps(cfg.train, cfg.seq_len, 1)
    assert tokens <= 35_000  # flash in the Triton interpreter trains ~200 tokens/s on 2 CPU cores: a few minutes
    assert cfg.checkpoint.every == cfg.train.max_steps  # one checkpoint, after the last step
    assert 0 < cfg.eval.every <= cfg.train.max_steps and cfg.train.warmup_steps < cfg.train.max_steps
    assert load("experiment=quickstart", "train.max_steps=200").checkpoint.every == 200  # follows max_steps


@pytest.mark.parametrize("model", ["gpt2-tiny", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"])
def test_every_model_has_gpt2_head_dim(model):
    cfg = load(f"model={model}")
    assert cfg.model.name == model and cfg.model.d_model // cfg.model.n_head == 64
    validate(cfg)


@pytest.mark.parametrize(("group", "choices"), [("attention", "flash naive sdpa"), ("model", "gpt2 gpt2-tiny")])
def test_unknown_group_option_lists_the_choices(group, choices):
    with pytest.raises(MissingConfigException, match=f"Could not find '{group}/nope'") as error:
        load(f"{group}=nope")
    assert f"Available options in '{group}'" in str(error.value)
    for choice in choices.split():
        assert f"\t{choice}\n" in str(error.value)


def test_unknown_data_source_lists_the_choices():
    with pytest.raises(MissingConfigException, match="Available options in 'data'") as error:
        load("data=nope")
    assert "\tshakespeare\n" in str(error.value)


@pytest.mark.parametrize("override", ["train.lrr=1", "modle.n_layer=2", "seq_length=64"])
def test_misspelt_key_fails_at_composition(override):
    with pytest.raises(ConfigCompositionException, match="Could not override"):
        load(override)


@pytest.mark.parametrize(("override", "message"), [("+train.lrr=1", "'lrr' not in 'TrainConfig'"), ("+foo=1", "'foo'")])
def test_a_key_added_with_plus_is_rejected_by_the_schema(override, message):
    with pytest.raises(ConfigKeyError, match=message):
        load(override)


@pytest.mark.parametrize("override", ["device=tpu", "wandb.mode=on", "seq_len=long", "train.max_steps=1.5"])
def test_wrongly_typed_value_fails_at_composition(override):
    with pytest.raises(ConfigCompositionException, match="Error merging override"):
        load(override)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["seq_len=0"], r"seq_len=0 is out of range: it must be in \[1, 65536\]"),
        (["seq_len=-8"], r"seq_len=-8 is out of range"),
        (["seq_len=65537"], r"seq_len=65537 is out of range"),
        (["seq_len=256", "eval.span_len=128"], r"eval.span_len=128 must be a multiple of seq_len=256"),
        (["seq_len=256", "eval.span_len=384"], r"eval.span_len=384 must be a multiple of seq_len=256"),
        (["attention.name=flesh"], r"attention.name='flesh'; choose one of: naive, flash, sdpa"),
        (["model.n_head=5"], r"model.d_model=768 is not divisible by model.n_head=5"),
        (["train.batch_size=0"], r"train.batch_size=0 must be positive"),
        (["train.lr=0"], r"train.lr=0.0 must be positive"),
        (["train.stop_at_step=0"], r"train.stop_at_step=0 must be in \[1, train.max_steps=1000\]"),
        (["checkpoint.every=-1"], r"checkpoint.every=-1 must be >= 0"),
        (["eval.every=-5"], r"eval.every=-5 must be >= 0"),
        (["train.grad_clip=-1"], r"train.grad_clip=-1.0 must be >= 0"),
        (["train.warmup_steps=-1"], r"train.warmup_steps=-1 must be >= 0"),
        (["train.min_lr=1e-2"], r"train.min_lr=0.01 must be in \[0, train.lr=0.0006\]"),
        (["log.every=0"], r"log.every=0 must be positive"),
        (["parallel.context=0"], r"parallel.context=0 must be >= 1"),
        (
            ["parallel.context=3", "seq_len=64"],
            r"parallel.context=3 cuts each sequence into 6 equal chunks: seq_len=64",
        ),
        (
            [
                "parallel.context=2",
                "seq_len=256",
                "attention.block_sparse.pattern=strided",
                "attention.block_sparse.stride=2",
            ],
            r"4 equal chunks of whole blocks \(attention.block_size=128\): seq_len=256",
        ),
        (["parallel.context=2", "compile=true"], r"compile=true with parallel.context > 1 is not supported yet"),
        (["parallel.context=2", "seq_len=131073"], r"seq_len=131073 is out of range: it must be in \[1, 131072\]"),
    ],
)
def test_validate_rejects_bad_values_with_a_clear_message(overrides, message):
    with pytest.raises(ValueError, match=message):
        validate(load(*overrides))


def test_span_len_defaults_to_seq_len_and_may_be_a_multiple():
    validate(load("seq_len=256"))
    validate(load("seq_len=256", "eval.span_len=1024"))


def test_tokens_per_step_derives_grad_accum():
    cfg = load("seq_len=1024", "train.batch_size=8", "train.tokens_per_step=524288")
    assert grad_accum_steps(cfg.train, cfg.seq_len, data_ranks=8) == 8
    assert grad_accum_steps(load("train.grad_accum=3").train, 1024, data_ranks=1) == 3
    with pytest.raises(ValueError, match=r"train.tokens_per_step=1000 is not divisible by .* = 8192"):
        grad_accum_steps(load("train.tokens_per_step=1000").train, 1024, data_ranks=1)
