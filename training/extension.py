"""Continue training at a longer context: context extension, and each stage of a short-to-long schedule.

`extend_from=<checkpoint>` starts a run from a checkpoint trained at a shorter seq_len as if this run had been
training all along: the weights, both Adam moments, the learning-rate schedule and the step count continue, so one
schedule spans every stage and train.max_steps is the whole budget (stop a stage early with train.stop_at_step).
The data sampler starts afresh with windows of the new length, and a learned position table grows, for the weights
and for both moments, as `extend_positions` says:
- tile (the default): row p of the new table is row p mod n_old of the trained one (model/hf.py's resize_positions,
  the rule GPT-2 imports use too). This is the copy initialisation of Longformer (Beltagy et al., 2020): the first
  n_old positions stay exactly as trained, and every new position starts from a trained embedding instead of noise,
  so the extended model is the trained one on any window of n_old tokens.
- interpolate: the trained rows stretched over the new length, row p read at p · (n_old - 1) / (n_new - 1) of the old
  table, linearly between its two neighbours: every new position lies between trained ones (first and last rows
  kept), as position interpolation does for rotary models (Chen et al., 2023); positions move, so the model is not
  the trained one on short windows any more.
Rotary positions (model.position_embedding=rope) have no table: the weights carry over as they are. model.rope_base
may change at the extension: raising it (e.g. 10^4 -> 5·10^5) slows every rotation so that the longer distances
take angles like those trained, the "adjusted base frequency" of Xiong et al. (2023) and Llama 3. The run's config
holds the new base, its result.json says so, and the log names both.

Extending is explicit: a resumed run (`resume`) refuses a changed seq_len, and a longer model never loads a shorter
table by accident. The checkpoint must come from the same model, corpus and schedule, at the same tokens per step,
so that a step means the same thing in every stage; any other difference (model.rope_base excepted) is refused,
naming the setting.
"""

import logging
from pathlib import Path
from typing import Any

import torch.nn.functional as F
from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from flashgpt.model.gpt import GPT
from flashgpt.model.hf import resize_positions
from flashgpt.training.checkpoint import load_training_state

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
    state = load_training_state(path)  # a file that is not a trainer's checkpoint is refused, naming it
    saved, train = state["config"], config["train"]
    last_step = train.get("stop_at_step") or train["max_steps"]
    if state["step"] >= last_step:
        raise ExtensionError(
            f"extend_from={path} is at step {state['step']}, but this run stops at step {last_step} "
            f"(train.max_steps={train['max_steps']}, train.stop_at_step={train.get('stop_at_step')}): it would train "
            f"nothing at seq_len={config['seq_len']}. Set train.max_steps (and stop_at_step) above {state['step']}"
        )
    _check_compatible(saved, config, _tokens_per_step(saved, len(state["rank_states"])), tokens_per_step, path)
    if model.wpe is None:  # rope: no weight depends on the context length
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        old_base, new_base = saved["model"]["rope_base"], config["model"]["rope_base"]
        change = f" -> {new_base:g} (adjusted base frequency)" if new_base != old_base else ", unchanged"
        positions = f"rotary positions, model.rope_base {old_base:g}{change}"
    else:
        init = config.get("extend_positions", "tile")
        resize = interpolate_positions if init == "interpolate" else resize_positions
        n_positions = model.wpe.weight.shape[0]
        weights = dict(state["model"])
        weights["wpe.weight"] = resize(weights["wpe.weight"], n_positions)
        model.load_state_dict(weights)
        optimizer_state = state["optimizer"]
        index = _parameter_index(optimizer, model.wpe.weight)
        moments = dict(optimizer_state["state"][index])
        for name in ("exp_avg", "exp_avg_sq"):
            moments[name] = resize(moments[name], n_positions)
        optimizer.load_state_dict({**optimizer_state, "state": {**optimizer_state["state"], index: moments}})
        positions = f"learned position table of {n_positions} rows from the trained {saved['seq_len']} ({init})"
    scheduler.load_state_dict(state["scheduler"])
    log.info(
        f"extend_from={path}: continuing at step {state['step']} with seq_len {saved['seq_len']} -> "
        f"{config['seq_len']}; {positions}"
    )
    return state["step"]


def interpolate_positions(table: Tensor, n_positions: int) -> Tensor:
    """The (n_old, C) table stretched to n_positions rows: row p is the old table read at x = p · (n_old - 1) /
    (n_positions - 1), linear between rows floor(x) and ceil(x); the first and last rows stay as they are."""
    stretched = F.interpolate(table.t()[None], size=n_positions, mode="linear", align_corners=True)  # (1, C, n)
    return stretched[0].t().contiguous()  # (n_positions, C)


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
        if key == "model":
            old, new = _architecture(old), _architecture(new)
        if old != new:
            problems.append(f"{key}={old} in the checkpoint, {key}={new} now")
    if saved_tokens != current_tokens:
        problems.append(f"{saved_tokens} tokens per step in the checkpoint, {current_tokens} now")
    if problems:
        raise ExtensionError(
            f"cannot extend {path} into this run:\n  " + "\n  ".join(problems) + "\nAn extension continues the "
            "checkpoint's model, corpus and learning-rate schedule at the same tokens per step, at a longer seq_len."
        )


def _architecture(model: dict[str, Any]) -> dict[str, Any]:
    """The model config an extension must keep: all of it but the rope base, which it may raise (ABF); a
    checkpoint from before rotary positions existed had learned ones."""
    return {key: value for key, value in {"position_embedding": "learned", **model}.items() if key != "rope_base"}


def _lookup(config: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        config = config[part]
    return config


def _parameter_index(optimizer: Optimizer, parameter: Tensor) -> int:
    """The index torch's optimizer state_dict gives `parameter`: its place in the param groups, in order."""
    flat = [p for group in optimizer.param_groups for p in group["params"]]
    return next(i for i, p in enumerate(flat) if p is parameter)
