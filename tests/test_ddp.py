"""DDP under torchrun: two CPU processes on gloo train like one process with the same global batch."""

import torch

from flashgpt.training.checkpoint import load_checkpoint
from training_runs import assert_ok, finish, read_metrics, read_result, start

# Gradients are averaged across ranks by gloo's all-reduce instead of summed inside one matmul: the same
# numbers in another order. Measured: 1e-6 on a loss of 10 and 2e-7 on the gradient norm after 4 steps.
LOSS_TOL = {"rtol": 1e-6, "atol": 1e-6}


def test_two_processes_match_one_with_the_same_global_batch(tmp_path):
    """2 ranks x 2 micro-steps (gradient sync on the last only) x 2 windows = 1 process x 8 windows a step."""
    steps = ["train.max_steps=4", "eval.every=4", "checkpoint.every=4"]
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    runs = [
        start(ddp, *steps, "train.batch_size=2", "train.grad_accum=2", nproc=2),
        start(single, *steps, "train.batch_size=8"),
    ]
    for done in [finish(proc) for proc in runs]:  # independent: side by side
        assert_ok(done)

    ddp_metrics, single_metrics = read_metrics(ddp), read_metrics(single)
    assert [m["step"] for m in ddp_metrics] == [1, 2, 3, 4]  # rank 0 alone writes metrics
    assert sorted(p.parent.name for p in tmp_path.rglob("metrics.jsonl")) == ["ddp", "single"]
    for key in ("train/loss", "train/grad_norm", "val/loss"):
        torch.testing.assert_close(
            torch.tensor([m[key] for m in ddp_metrics if key in m]),
            torch.tensor([m[key] for m in single_metrics if key in m]),
            **LOSS_TOL,
            msg=key,
        )
    result = read_result(ddp)
    assert result["status"] == "ok" and result["world_size"] == 2
    assert result["tokens_per_step"] == read_result(single)["tokens_per_step"] == 8 * 64
    checkpoint = load_checkpoint(ddp / "checkpoints" / "latest.pt")
    assert len(checkpoint["rank_states"]) == 2  # each rank's sampler and RNG streams
