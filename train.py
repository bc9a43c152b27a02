"""Train GPT-2 with a chosen attention backend, from a checkout: the same Hydra main as the installed
`flashgpt-train` command (training/main.py; the configs are configs/).

Examples:
- python train.py experiment=quickstart (the first run: a few minutes on a CPU, configs/experiment/quickstart.yaml)
- python train.py model=gpt2-tiny attention=flash data=shakespeare seq_len=128 device=cpu
- python train.py ... resume=auto (continue the run dir's latest checkpoint)
- python train.py -m experiment=long_context_speed attention=flash,sdpa seq_len=1024,4096,16384 (a sweep; the
  preset derives the batch from seq_len, so every point trains on the same tokens per step)
- python train.py model=gpt2 model.init_from=hf:gpt2 (start from GPT-2's weights: a Hub name or a local directory)
- python train.py ... profile=true (a torch.profiler trace of a few steady-state steps in <run dir>/profile/)
- python train.py ... model.activation_checkpointing=true (recompute each block in the backward: less memory)
- torchrun --nproc_per_node=8 train.py ... (DDP, one process per GPU)
"""

from flashgpt.training.main import main

if __name__ == "__main__":
    main()
