"""The model a training checkpoint holds, rebuilt from the run config it was saved with: one way for every reader
of checkpoints (sampling, the context study's evaluation, the GPT-2 export). A run that continues from a
checkpoint (`resume`, `extend_from`) loads into the model its own config built instead."""

from pathlib import Path
from typing import NamedTuple

import torch
from omegaconf import OmegaConf

from flashgpt.model.backends import prepare_backend
from flashgpt.model.gpt import GPT
from flashgpt.training.checkpoint import load_training_state
from flashgpt.training.config import Config, typed_config


class SavedModel(NamedTuple):
    model: GPT
    config: Config  # the run's, as typed dataclasses
    step: int  # the training step the checkpoint was saved at


def model_from_checkpoint(path: Path, device: torch.device | str = "cpu", attention: str | None = None) -> SavedModel:
    """The model of the trainer's checkpoint at `path`, with its size, context and attention masks as trained and
    the weights loaded (verified, weights only), on `device` in train mode; its run config and step. `attention`
    replaces the backend by name (the weights do not depend on it). Raises CheckpointError for a file that is not
    a trainer's checkpoint."""
    state = load_training_state(path)
    config = typed_config(OmegaConf.create(state["config"]))
    if attention is not None:
        config.attention.name = attention
    device = torch.device(device)
    prepare_backend(config.attention.name, device)
    model = GPT(config.model, config.seq_len, config.attention)
    model.load_state_dict(state["model"])
    return SavedModel(model.to(device), config, state["step"])
