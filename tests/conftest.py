"""Kernels run on the CPU through the Triton interpreter; it must be on before triton kernels are defined."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import subprocess
from pathlib import Path

import pytest

from training_runs import train


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """A 20-step run of the tiny model, evaluated and checkpointed at steps 10 and 20, logging to wandb offline:
    test_train.py checks what it wrote, test_hf.py exports its checkpoint (one run instead of two)."""
    run_dir = tmp_path_factory.mktemp("tiny") / "run"
    overrides = ["train.max_steps=20", "eval.every=10", "checkpoint.every=10", "wandb.mode=offline", "resume=auto"]
    return run_dir, train(run_dir, *overrides)
