"""Context parallelism on two CPU processes (gloo) against one process: the model for every backend and mask
(tests/context_parallel_worker.py), and train.py end to end."""

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from context_parallel_worker import CASES, build
from flashgpt.model.context_parallel import ContextShard
from flashgpt.training.distributed import DistContext, parallel_layout
from flashgpt.training.resume import ResumeConfigError, check_resume_config
from training_runs import REPO, assert_ok, finish, read_metrics, read_result, start, train

# One process sums over all keys in one matmul; two ranks in two chunks, K/V gradients summed by gloo. Measured:
# losses equal to the last bit or 5e-7, gradients within 1.1e-6 of their largest entry.
LOSS_TOL = {"rtol": 1e-6, "atol": 1e-6}
GRAD_TOL = 1e-5  # of the tensor's largest gradient
# train.py runs compare three optimizer steps: from step 2 on, each AdamW update carries the summation-order
# differences of the gradients (up to 1.1e-6 of a gradient's largest entry, above) into the weights, scaled by the
# update's normalisation. Measured on two machines: step 2's gradient norm 1.5e-6 apart (relative) on one, within
# 1e-6 on the other (step 1 to the last bit on both); 1e-5 is the gradients' own bound above.
TRAIN_TOL = {"rtol": 1e-5, "atol": 1e-6}
# One intra-op thread a process, as torchrun gives its workers: on the 2 shared cores of CI more only contend
# (measured 70x slower on tiny matmuls under load).
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cp_results(tmp_path_factory: pytest.TempPathFactory, one_process_started: tuple[Path, subprocess.Popen]) -> dict:
    out = tmp_path_factory.mktemp("context_parallel") / "results.pt"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [*command, "tests/context_parallel_worker.py", str(out)], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-8000:]}"
    return torch.load(out)


@pytest.mark.parametrize("case", [case for case, (_, opts) in CASES.items() if "dropout" not in opts])
def test_two_ranks_reproduce_one_process(case: str, cp_results: dict) -> None:
    model, x, y, ids = build(case)
    loss = model(x, y, document_ids=ids)
    loss.backward()
    torch.testing.assert_close(cp_results[case]["loss"], loss.detach(), **LOSS_TOL)
    for name, param in model.named_parameters():
        error = (cp_results[case]["grads"][name] - param.grad).abs().max()
        assert error <= GRAD_TOL * param.grad.abs().max(), f"{case}: {name} off by {error}"


@pytest.mark.parametrize("backend", ["naive", "sdpa", "flash"])
def test_dropout_trains_finite(backend: str, cp_results: dict) -> None:
    """Dropout draws per rank and per chunk, so no one-process run has the same masks: it only has to train."""
    result = cp_results[f"{backend}-dropout"]
    assert torch.isfinite(result["loss"]) and all(grad.isfinite().all() for grad in result["grads"].values())


# Both train.py tests: 3 steps of 4 sequences of 64 tokens under rope, a window and document masks.
RUN = [
    "train.max_steps=3", "eval.every=3", "checkpoint.every=3", "model.position_embedding=rope",
    "attention.window_size=24", "data.document_mask=true",
]  # fmt: skip


@pytest.fixture(scope="module")
def one_process_started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, subprocess.Popen]]:
    """The one-process reference run, started when the module's first fixture (cp_results) is: it trains on one
    thread while the model-level workers run."""
    run_dir = tmp_path_factory.mktemp("one_process")
    proc = start(run_dir, *RUN, env=ONE_THREAD)
    yield run_dir, proc
    if proc.poll() is None:  # no test waited for it
        proc.kill()
        proc.communicate()


@pytest.fixture(scope="module")
def one_process(one_process_started: tuple[Path, subprocess.Popen]) -> Path:
    run_dir, proc = one_process_started
    assert_ok(finish(proc))
    return run_dir


def assert_same_run(run_dir: Path, reference: Path) -> None:
    """The same losses, gradient norms and validation loss, and as many tokens a step (each counted once)."""
    metrics, reference_metrics = read_metrics(run_dir), read_metrics(reference)
    assert [m["step"] for m in metrics] == [m["step"] for m in reference_metrics] == [1, 2, 3]
    for key in ("train/loss", "train/grad_norm"):
        got, expected = torch.tensor([m[key] for m in metrics]), torch.tensor([m[key] for m in reference_metrics])
        torch.testing.assert_close(got, expected, **TRAIN_TOL, msg=key)
    result, reference_result = read_result(run_dir), read_result(reference)
    torch.testing.assert_close(result["val/loss"], reference_result["val/loss"], **TRAIN_TOL)
    assert result["tokens_per_step"] == reference_result["tokens_per_step"] == 4 * 64


def test_train_py_context_parallel_stopped_and_resumed_matches_one_process(tmp_path: Path, one_process: Path) -> None:
    """parallel.context=2 on two processes, stopped after step 2 and resumed."""
    assert_ok(train(tmp_path, *RUN, "parallel.context=2", "train.stop_at_step=2", nproc=2))
    proc = train(tmp_path, *RUN, "parallel.context=2", "resume=auto", nproc=2)
    assert_ok(proc)
    assert "at step 2" in proc.stdout
    assert_same_run(tmp_path, one_process)
    assert read_result(tmp_path)["world_size"] == 2 and read_result(tmp_path)["parallel_context"] == 2


def test_train_py_data_times_context_matches_one_process(tmp_path: Path, one_process: Path) -> None:
    """Four processes on a 2 x 2 mesh: two data ranks of 2 sequences, each split over two context ranks."""
    assert_ok(train(tmp_path, *RUN, "train.batch_size=2", "parallel.context=2", nproc=4))
    assert_same_run(tmp_path, one_process)


@pytest.mark.parametrize("size", [1, 2, 4])
def test_shards_balance_causal_work_and_put_back_in_order(size: int) -> None:
    """Rank r holds chunks r and 2N - 1 - r: the same number of causal (query, key) pairs on every rank, positions
    that are the tokens', and the rank-ordered concatenation of all shards (an all-gather) unshards to the whole."""
    seq_len = 8 * size
    tokens = torch.arange(seq_len)
    shards = [ContextShard(rank, size).shard(tokens, dim=0) for rank in range(size)]
    for rank, shard in enumerate(shards):
        torch.testing.assert_close(shard, ContextShard(rank, size).positions(seq_len, tokens.device))
    assert len({int((shard + 1).sum()) for shard in shards}) == 1  # query p sees p + 1 keys
    torch.testing.assert_close(ContextShard(0, size).unshard(torch.cat(shards)), tokens)


def test_layout_must_divide_the_processes() -> None:
    ctx = DistContext(rank=0, local_rank=0, world_size=3, device=torch.device("cpu"))
    with pytest.raises(ValueError, match=r"parallel.context=2 does not divide the 3 processes"):
        parallel_layout(ctx, 2)


def test_resume_refuses_another_layout(tmp_path: Path) -> None:
    saved = {"parallel": {"context": 2}, "seq_len": 64}
    with pytest.raises(ResumeConfigError, match=r"parallel.context=2 in the checkpoint, parallel.context=1 now"):
        check_resume_config(saved, {"parallel": {"context": 1}, "seq_len": 64}, tmp_path / "latest.pt")
