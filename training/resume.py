"""What a resumed run does with settings that differ from its checkpoint's: apply them, or refuse to start.

The checkpoint holds the config it was trained with. Every setting is compared with this run's, key by key:
- settings that decide what the weights mean or which data the run walks through (the model's shape, the
  attention backend, seq_len, the corpus, the seed that orders it) are refused, with both values;
- the rest (learning-rate schedule and optimizer hyperparameters, batch size, evaluation, logging, checkpointing,
  device) are applied from the next step on, and logged. The optimizer's saved hyperparameters would otherwise win
  over the new ones, so `apply_optimizer_settings` writes the new ones into it after its state is loaded.
"""

import logging
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from flashgpt.data.config import DataConfig
from flashgpt.model.attention import AttentionConfig
from flashgpt.model.gpt import ModelConfig
from flashgpt.training.config import Config

log = logging.getLogger(__name__)

# Keys under the refused prefixes below that change neither the weights' shapes, nor what the model computes, nor
# the data order: where the cache lives, how a source is read, and dropout and recomputation in training.
_APPLIED_EXCEPTIONS = ("model.dropout", "model.activation_checkpointing", "data.cache_dir", "data.streaming")
# Keys (or, ending in ".", groups of keys) a resumed run may not change, and why; the first match wins.
_REFUSED = {
    "model.": "the checkpoint's weights have the model's shape",
    "attention.": "the model was trained with that attention",
    "data.document_mask": "the model was trained with that attention mask",
    "seq_len": "the position table and the data windows have that length",
    "data.": "the data position continues in that corpus",
    "seed": "the seed orders the data windows the run walks through",
    "parallel.context": "each rank's saved data position and RNG streams belong to that data x context layout",
}
# Never compared: how this job was launched, and where a fresh run's first weights came from (a resumed run
# takes them from its checkpoint).
_IGNORED = ("resume", "overwrite", "model.init_from", "extend_from", "extend_positions")


class ResumeConfigError(ValueError):
    """A resumed run asks for a setting that cannot change mid-run."""


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"lr": 1e-3}} -> {"train.lr": 1e-3}."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def check_resume_config(saved: dict[str, Any], current: dict[str, Any], checkpoint: Path) -> list[str]:
    """Compare the checkpoint's config with this run's. Raises ResumeConfigError naming every refused change and
    both values; returns the applied changes as "key: old -> new" lines (logged here too)."""
    saved_flat, current_flat = flatten(saved), flatten(current)
    # A checkpoint written before a setting existed ran with its default (a new setting's default keeps the
    # earlier behaviour): compare with that, not skip it.
    defaults = _defaults()
    absent = {key: defaults[key] for key in current_flat.keys() - saved_flat.keys() if key in defaults}
    refused, applied = [], []
    for key in sorted((saved_flat.keys() & current_flat.keys()) | absent.keys()):
        old, new = saved_flat.get(key, absent.get(key)), current_flat[key]
        if old == new or key in _IGNORED:
            continue
        was = f"{key}={old} in the checkpoint" if key in saved_flat else f"{key} not in the checkpoint (so {old})"
        reason = _refusal(key)
        if reason:
            refused.append(f"{was}, {key}={new} now ({reason})")
        else:
            applied.append(f"{key}: {old} -> {new}")
    if refused:
        raise ResumeConfigError(
            f"cannot resume from {checkpoint} with these settings changed:\n  " + "\n  ".join(refused) + "\n"
            "Resume with the checkpoint's values, or start a new run (another hydra.run.dir)."
        )
    for change in applied:
        log.warning(f"resuming from {checkpoint} with a changed setting, applied from the next step: {change}")
    return applied


def _defaults() -> dict[str, Any]:
    """Every setting's default (the schema's, with the model, attention and data groups' own), flattened."""
    groups = {"model": ModelConfig, "attention": AttentionConfig, "data": DataConfig}
    schema = OmegaConf.merge(
        OmegaConf.structured(Config), {name: OmegaConf.structured(node) for name, node in groups.items()}
    )
    return flatten(OmegaConf.to_container(schema, enum_to_str=True))


def _refusal(key: str) -> str | None:
    if key in _APPLIED_EXCEPTIONS:
        return None
    for name, reason in _REFUSED.items():
        if key == name or (name.endswith(".") and key.startswith(name)):
            return reason
    return None


def optimizer_settings(optimizer: Optimizer) -> list[dict[str, Any]]:
    """The hyperparameters of each param group (all but the parameters), as built from this run's config; call it
    after the scheduler is built (its "initial_lr" is the base learning rate)."""
    return [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]


def apply_optimizer_settings(optimizer: Optimizer, scheduler: LambdaLR, settings: list[dict[str, Any]]) -> None:
    """After loading a checkpoint's optimizer and scheduler state: put this run's hyperparameters (`settings`,
    from optimizer_settings before the load) back in place of the saved ones, and set the learning rate of the
    next step from this run's schedule, as LambdaLR itself computes it. A no-op when nothing changed."""
    for group, fresh in zip(optimizer.param_groups, settings, strict=True):
        group.update({key: value for key, value in fresh.items() if key != "lr"})  # initial_lr: this run's lr
    scheduler.base_lrs = [fresh["initial_lr"] for fresh in settings]
    lrs = [
        base * lr_lambda(scheduler.last_epoch)
        for base, lr_lambda in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
    ]
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
