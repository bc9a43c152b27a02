"""Numeric precision of the forward pass."""

from contextlib import AbstractContextManager, nullcontext

import torch


def autocast(device: torch.device) -> AbstractContextManager:
    """bf16 autocast on CUDA (tensor cores; bf16's fp32-sized exponent needs no loss scaling), fp32 on CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()
