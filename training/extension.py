"""Continue training at a longer context: context extension, and each stage of a short-to-long schedule.

`extend_from=<checkpoint>` starts a run from a checkpoint trained at a shorter seq_len as if this run had been
training all along: the weights, both Adam moments, the learning-rate schedule and the step count continue, so one
schedule spans every stage and train.max_steps is the whole budget (stop a stage early with train.stop_at_step).
The data sampler starts afresh with windows of the new length, and the position table grows: row p of the new table
is row p mod n_old of the trained one, for the weights and for both moments (model/hf.py's resize_positions, the rule
GPT-2 imports use too). This is the copy initialisation of Longformer (Beltagy et al., 2020): the first n_old
positions stay exactly as trained, and every new position starts from a trained embedding instead of noise, so the
extended model is the trained one on any window of n_old tokens.

Extending is explicit: a resumed run (`resume`) refuses a changed seq_len, and a longer model never loads a shorter
table by accident. The checkpoint must come from the same model, corpus and schedule, at the same tokens per step,
so that a step means the same thing in every stage; any other difference is refused, naming the setting.
"""

import logging
from pathlib import Path
from typing import Any

from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from flashgpt.model.gpt import GPT
from flashgpt.model.hf import resize_positions
from flashgpt.training.checkpoint import load_checkpoint

log = logging.getLogger(__name__)

# Settings an extension keeps from its checkpoint: what the weights are, which corpus, and the one schedule.
MUST_MATCH = (
    "model",
    "data.name",
    "data.val_fraction",
    "train.max_steps",
    "train.lr",
    "train.min_lr",
    "train.warmup_steps",
    "train.weight_decay",
    "train.beta1",
    "train.beta2",
)


class ExtensionError(ValueError):
    """A checkpoint that cannot be continued at this run's context."""


def extend_from_checkpoint(
    path: Path,
    model: GPT,
    optimizer: Optimizer,
    scheduler: LRScheduler,
    config: dict[str, Any],
    tokens_per_step: int,
) -> int:
    """Load the checkpoint at `path` into this run's longer model, its optimizer and scheduler (built as for a fresh
    run from `config`, the resolved config); returns the checkpoint's step, from which the run continues."""
    if not path.is_file():
        raise FileNotFoundError(f"extend_from={path}: no such checkpoint (a run's <run dir>/checkpoints/latest.pt)")
    state = load_checkpoint(path)
    saved = state["config"]
    _check_compatible(saved, config, _tokens_per_step(saved, len(state["rank_states"])), tokens_per_step, path)
    n_positions = model.wpe.weight.shape[0]
    weights = dict(state["model"])
    weights["wpe.weight"] = resize_positions(weights["wpe.weight"], n_positions)
    model.load_state_dict(weights)

    optimizer_state = state["optimizer"]
    index = _parameter_index(optimizer, model.wpe.weight)
    moments = dict(optimizer_state["state"][index])
    for name in ("exp_avg", "exp_avg_sq"):
        moments[name] = resize_positions(moments[name], n_positions)
    optimizer.load_state_dict({**optimizer_state, "state": {**optimizer_state["state"], index: moments}})
    scheduler.load_state_dict(state["scheduler"])
    log.info(
        f"extend_from={path}: continuing at step {state['step']} with seq_len {saved['seq_len']} -> "
        f"{config['seq_len']}; position rows {saved['seq_len']}..{n_positions - 1} tiled from the trained ones"
    )
    return state["step"]


def _tokens_per_step(saved: dict[str, Any], world_size: int) -> int:
    train = saved["train"]
    if train.get("tokens_per_step") is not None:
        return train["tokens_per_step"]
    return train["batch_size"] * saved["seq_len"] * train["grad_accum"] * world_size


def _check_compatible(
    saved: dict[str, Any], current: dict[str, Any], saved_tokens: int, current_tokens: int, path: Path
) -> None:
    problems = []
    if saved["seq_len"] >= current["seq_len"]:
        problems.append(
            f"seq_len={saved['seq_len']} in the checkpoint is not shorter than this run's {current['seq_len']} "
            "(to continue at the same length, resume the run itself)"
        )
    for key in MUST_MATCH:
        old, new = _lookup(saved, key), _lookup(current, key)
        if old != new:
            problems.append(f"{key}={old} in the checkpoint, {key}={new} now")
    if saved_tokens != current_tokens:
        problems.append(f"{saved_tokens} tokens per step in the checkpoint, {current_tokens} now")
    if problems:
        raise ExtensionError(
            f"cannot extend {path} into this run:\n  " + "\n  ".join(problems) + "\nAn extension continues the "
            "checkpoint's model, corpus and learning-rate schedule at the same tokens per step, at a longer seq_len."
        )


def _lookup(config: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        config = config[part]
    return config


def _parameter_index(optimizer: Optimizer, parameter: Tensor) -> int:
    """The index torch's optimizer state_dict gives `parameter`: its place in the param groups, in order."""
    flat = [p for group in optimizer.param_groups for p in group["params"]]
    return next(i for i, p in enumerate(flat) if p is parameter)
