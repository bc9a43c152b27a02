"""The inner-attention backends, by their config name (`attention.name`): one module each, one line in the table.

A backend is an `InnerAttention` (`flashgpt.model.attention`): its forward, what it precomputes from a batch's masks
(`prepare`), what it needs of the device before anything else is imported (`prepare_device`), and the head dims it
runs (`check_head_dim`). Adding one: a module here with its class, and its line in ATTENTION_BACKENDS.
"""

import torch

from flashgpt.model.attention import InnerAttention

from .flash import FlashAttention
from .naive import NaiveAttention
from .sdpa import SdpaAttention

ATTENTION_BACKENDS: dict[str, type[InnerAttention]] = {
    "naive": NaiveAttention,
    "flash": FlashAttention,
    "sdpa": SdpaAttention,
}


def backend_class(name: str) -> type[InnerAttention]:
    """The backend registered as `name`; a ValueError naming the choices otherwise."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of: {', '.join(ATTENTION_BACKENDS)}")
    return ATTENTION_BACKENDS[name]


def build_attention(name: str) -> InnerAttention:
    """A fresh backend by its config name."""
    return backend_class(name)()


def prepare_backend(name: str, device: torch.device) -> bool:
    """Make backend `name` runnable on `device` (before its first use, and before the kernels are imported); True
    when it will run through an interpreter (slow)."""
    return backend_class(name).prepare_device(device)


def check_head_dim(name: str, head_dim: int) -> None:
    """Raise ValueError at start-up if backend `name` cannot run heads of `head_dim` (model.d_model / model.n_head),
    rather than at the first training step. Call it after prepare_backend."""
    backend_class(name).check_head_dim(head_dim)
