"""Learning-rate schedule: linear warmup, then cosine decay to min_lr at max_steps."""

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from flashgpt.training.config import TrainConfig


def lr_at(step: int, train: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (1-based: the first update uses lr_at(1))."""
    min_lr = train.lr / 10 if train.min_lr is None else train.min_lr
    if step <= train.warmup_steps:
        return train.lr * step / train.warmup_steps
    progress = min(1.0, (step - train.warmup_steps) / max(1, train.max_steps - train.warmup_steps))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (train.lr - min_lr)


def build_scheduler(optimizer: Optimizer, train: TrainConfig) -> LambdaLR:
    # LambdaLR multiplies the optimizer's base lr (train.lr); it counts from 0 while steps count from 1.
    return LambdaLR(optimizer, lambda index: lr_at(index + 1, train) / train.lr)
