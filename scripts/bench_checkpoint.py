"""Time saving, loading and verifying a full training checkpoint of GPT-2 124M (model + AdamW state), on the CPU.

The state is what the trainer saves: randomly initialised weights, AdamW's two moments after one update, the
schedule, the sampler position and every RNG state. Each timing is the median of --repeats saves (or loads) into
--dir, fsync included; the JSON written to --out holds every sample.

    python scripts/bench_checkpoint.py --out results/faults/checkpoint_save.json
"""

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from flashgpt.command_line import command_line
from flashgpt.model.gpt import GPT, ModelConfig
from flashgpt.training.checkpoint import LATEST, capture_rng_state, load_checkpoint, save_checkpoint, verify_checkpoint
from flashgpt.training.config import TrainConfig
from flashgpt.training.schedule import build_scheduler


def training_state(seq_len: int) -> dict[str, Any]:
    """A GPT-2 124M training state as the trainer saves it, after one optimizer step on random gradients."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(), seq_len, "naive")
    optimizer = model.configure_optimizer(6e-4, 0.1, (0.9, 0.95), "cpu")
    scheduler = build_scheduler(optimizer, TrainConfig())
    for param in model.parameters():
        param.grad = torch.randn_like(param)
    optimizer.step()
    scheduler.step()
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "step": 1,
        "rank_states": [{"sampler": {"consumed": 8}, "rng": capture_rng_state()}],
        "config": {"model": {"name": "gpt2"}, "seq_len": seq_len},
        "wandb_run_id": "bench",
    }


def timed(function: Any) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--dir", type=Path, default=None, help="where to save (default: a temporary folder)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--label", default="", help="a note stored with the numbers, e.g. before/after")
    args = parser.parse_args(argv)

    state = training_state(args.seq_len)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        path = Path(folder) / LATEST
        save_s = [timed(lambda: save_checkpoint(state, path)) for _ in range(args.repeats)]
        size = path.stat().st_size
        load_s = [timed(lambda: load_checkpoint(path)) for _ in range(args.repeats)]
        verify_s = [timed(lambda: verify_checkpoint(path)) for _ in range(args.repeats)]
    result = {
        "what": "save / load / verify_checkpoint of GPT-2 124M + AdamW state (CPU, fsync included)",
        "label": args.label,
        "command": command_line("bench_checkpoint.py", argv),
        "bytes": size,
        "save_s_median": statistics.median(save_s),
        "load_s_median": statistics.median(load_s),
        "verify_s_median": statistics.median(verify_s),  # the CRC-32 check, part of every load
        "save_s": save_s,
        "load_s": load_s,
        "verify_s": verify_s,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_threads": torch.get_num_threads(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("label", "bytes", "save_s_median", "load_s_median", "verify_s_median")}))


if __name__ == "__main__":
    main(sys.argv[1:])
