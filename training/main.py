"""The training entry point: `flashgpt-train` (installed) and `python train.py` (a checkout) run this Hydra main.

    flashgpt-train experiment=quickstart
    flashgpt-train -m experiment=long_context_speed attention=flash,sdpa seq_len=1024,4096,16384

The configs are the package `flashgpt.configs` (configs/ in a checkout), found the same way from a checkout and an
installed wheel. Each job prints its resolved config, saves it as <run dir>/resolved_config.yaml (.hydra/config.yaml
keeps the interpolations as written), trains, and returns the final validation loss: the objective a Hydra
sweeper plugin such as Optuna minimises.
"""

import gc
import json
import logging
import math
import os
import sys
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from flashgpt.training.config import register_configs
from flashgpt.training.loop import run
from flashgpt.training.metrics import RESULT_FILE

log = logging.getLogger(__name__)

register_configs()


@hydra.main(version_base="1.3", config_path="pkg://flashgpt.configs", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Train one job; returns its final validation loss (NaN when it ran out of memory first; None on ranks > 0).
    A diverged run exits with status 1."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    source = HydraConfig.get().runtime.choices.get("data")
    if source is not None and cfg.data.name != source:  # the other source's settings (path, files) would stay
        raise ValueError(f"data.name={cfg.data.name} contradicts data={source}: choose the source with data=NAME alone")
    is_main_rank = int(os.environ.get("RANK", "0")) == 0
    if is_main_rank:
        resolved = OmegaConf.to_yaml(cfg, resolve=True)
        log.info(f"config, resolved:\n{resolved}")
        run_dir.mkdir(parents=True, exist_ok=True)
    log.info(f"CPU threads: {_reproducible_cpu_math()} (fixed for the run; OMP_NUM_THREADS chooses the count)")
    try:
        status = run(cfg, run_dir)
    finally:
        _release_memory(compiled=cfg.compile)
    if status == "nan":
        sys.exit(1)  # a diverged run is a failure; an OOM is a result (exit 0) so that a -m sweep goes on
    return _final_val_loss(run_dir) if is_main_rank else None


def _reproducible_cpu_math() -> int:
    """Make MKL, which runs the CPU's matmuls, give the same bits every run; returns the (fixed) thread count.

    Without it two identical CPU runs differed in the 6th digit of a loss now and then when the cores were busy;
    with it they still did, more rarely (one thread and MKL_CBWR=COMPATIBLE, tests/training_runs.py, remove that).
    The conditions of Intel's reproducibility guide: MKL's conditional numerical reproducibility mode (MKL_CBWR,
    read at MKL's first call, so set here before any; a user's own value is kept), a fixed thread count (torch's
    default, OMP_NUM_THREADS or one per core) and no dynamic threading (torch.set_num_threads turns MKL's off)."""
    os.environ.setdefault("MKL_CBWR", "AUTO")
    threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    return threads


def _release_memory(compiled: bool) -> None:
    """A -m sweep runs its jobs one after another in this process: give the next job the memory back (an OOM's
    activations included), a fresh peak-memory counter, and, after torch.compile, fresh compiler caches (else
    dynamo recompiles the next model with dynamic shapes, and it runs slower)."""
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    if compiled:
        torch._dynamo.reset()


def _final_val_loss(run_dir: Path) -> float:
    """val/loss from the result.json the run wrote; NaN when it has none (out of memory): a failed trial to Optuna."""
    loss = json.loads((run_dir / RESULT_FILE).read_text())["val/loss"]
    return math.nan if loss is None else float(loss)
