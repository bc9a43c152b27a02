"""Train GPT-2 with a chosen attention backend: the Hydra entry point (configs/config.yaml).

Examples:
- python train.py experiment=quickstart (the first run: a few minutes on a CPU, configs/experiment/quickstart.yaml)
- python train.py model=gpt2-tiny attention=flash data=shakespeare seq_len=128 device=cpu
- python train.py ... resume=auto (continue the run dir's latest checkpoint)
- python train.py -m attention=naive,flash,sdpa seq_len=1024,4096,16384 (a sweep)
- torchrun --nproc_per_node=8 train.py ... (DDP, one process per GPU)
"""

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from flashgpt.training.config import register_configs
from flashgpt.training.loop import run

register_configs()


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(cfg: DictConfig) -> None:
    status = run(cfg, Path(HydraConfig.get().runtime.output_dir))
    if status == "nan":
        sys.exit(1)  # a diverged run is a failure; an OOM is a result (exit 0) so that a -m sweep goes on


if __name__ == "__main__":
    main()
