"""The trainer: end-to-end runs of train.py (real Hydra, tokenizer, Shakespeare corpus, wandb offline) and unit
checks of the pieces whose failures a short run cannot show (schedule, MFU table, OOM parsing, atomic save)."""

import os
import re
from pathlib import Path

import pytest
import torch

from flashgpt.training.checkpoint import load_checkpoint, resolve_resume, save_checkpoint
from flashgpt.training.config import TrainConfig
from flashgpt.training.evaluation import position_buckets
from flashgpt.training.failures import oom_request_gib
from flashgpt.training.mfu import mfu, peak_flops_per_sec
from flashgpt.training.schedule import build_scheduler, lr_at
from training_runs import DETERMINISTIC_CPU, assert_ok, finish, read_metrics, read_result, start, train

STEP_KEYS = {
    "step", "train/loss", "train/lr", "train/grad_norm", "train/tokens", "perf/step_time_s",
    "perf/tokens_per_sec", "perf/mfu", "mem/peak_gib",
}  # fmt: skip
FLASH_WARNING = "attention=flash without CUDA runs through the Triton interpreter: slow but exact"


def wandb_offline_runs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "wandb").glob("offline-run-*"))


def test_tiny_run_learns_and_fills_its_run_dir(tiny_run):
    run_dir, proc = tiny_run  # tests/conftest.py
    assert_ok(proc)
    assert "resume=auto: no checkpoint in" in proc.stdout

    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, 21))
    assert all(m.keys() >= STEP_KEYS for m in metrics)
    assert metrics[-1]["train/tokens"] == 20 * 4 * 64
    assert metrics[0]["perf/mfu"] is None and metrics[0]["mem/peak_gib"] is None  # CPU: no known peak, no CUDA
    evals = [m for m in metrics if "val/loss" in m]
    assert [m["step"] for m in evals] == [10, 20]
    assert evals[-1]["val/loss_by_position"].keys() == {"0-127"}
    assert evals[-1]["val/loss"] < evals[0]["val/loss"] < 10.0  # from ln(50257) = 10.8 at initialisation
    assert metrics[-1]["train/loss"] < metrics[0]["train/loss"] - 2.0

    result = read_result(run_dir)
    assert result["status"] == "ok"
    assert (result["backend"], result["seq_len"], result["model"], result["step"]) == ("sdpa", 64, "gpt2-tiny", 20)
    assert result["val/loss"] == evals[-1]["val/loss"] and result["perf/tokens_per_sec"] > 0
    assert result["perf/mfu"] is None and result["mem/peak_gib"] is None

    assert (run_dir / ".hydra" / "config.yaml").is_file()
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    assert checkpoint["step"] == 20 and checkpoint["config"]["seq_len"] == 64
    [wandb_run] = wandb_offline_runs(run_dir)
    assert wandb_run.name.endswith(checkpoint["wandb_run_id"])
    assert list(wandb_run.glob("*.wandb"))


def test_resumed_run_matches_the_uninterrupted_one_bit_for_bit(tmp_path):
    """Dropout is on, so the resumed run must also restore the RNG streams to match. The CPU math is made
    deterministic across processes (DETERMINISTIC_CPU), so that any difference is the resume's."""
    common = ["train.max_steps=8", "model.dropout=0.1", "eval.every=3", "checkpoint.every=3"]
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    env = {**os.environ, **DETERMINISTIC_CPU}
    # The uninterrupted run and the first half of the interrupted one are independent: they run side by side.
    runs = [
        start(full, *common, env=env),
        start(resumed, *common, "train.stop_at_step=5", "wandb.mode=offline", env=env),
    ]
    for done in [finish(proc) for proc in runs]:
        assert_ok(done)
    assert read_metrics(resumed)[-1]["step"] == 5
    proc = train(resumed, *common, "resume=auto", "wandb.mode=offline", env=env)
    assert_ok(proc)
    assert f"resumed from {resumed / 'checkpoints' / 'latest.pt'} at step 5" in proc.stdout

    full_metrics, resumed_metrics = read_metrics(full), read_metrics(resumed)
    assert [m["step"] for m in resumed_metrics] == list(range(1, 9))
    for key in ("train/loss", "train/grad_norm", "train/lr"):
        assert torch.equal(
            torch.tensor([m[key] for m in resumed_metrics]), torch.tensor([m[key] for m in full_metrics])
        ), key
    assert read_result(resumed)["val/loss"] == read_result(full)["val/loss"]
    first_job, second_job = wandb_offline_runs(resumed)  # both log to the same wandb run
    assert first_job.name.split("-")[-1] == second_job.name.split("-")[-1]


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="only an MKL build runs CPU matmuls in MKL")
def test_a_cpu_run_puts_mkl_in_its_reproducible_mode(tmp_path):
    """The conditions under which a CPU run repeats bit for bit (training/main.py): MKL's conditional numerical
    reproducibility on (CNR) and dynamic threading off (Dyn:0), in every MKL call MKL_VERBOSE reports."""
    env = {key: value for key, value in os.environ.items() if key != "MKL_CBWR"}
    proc = train(tmp_path / "run", "train.max_steps=1", env={**env, "MKL_VERBOSE": "1"})
    assert_ok(proc)
    assert set(re.findall(r"CNR:\S+ Dyn:\d", proc.stdout)) == {"CNR:AUTO Dyn:0"}


def test_diverging_loss_stops_with_a_clear_message_and_keeps_the_last_good_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc = train(run_dir, "train.lr=1e6", "train.warmup_steps=0", "train.max_steps=10", "checkpoint.every=1")
    assert proc.returncode == 1, proc.stderr[-3000:]
    match = re.search(r"loss became (nan|inf) at step (\d+); last good checkpoint: (\S+)", proc.stdout)
    assert match, proc.stdout
    step, last_good = int(match[2]), Path(match[3])
    assert last_good == run_dir / "checkpoints" / "latest.pt"
    checkpoint = load_checkpoint(last_good)
    assert checkpoint["step"] == step - 1  # the diverged step was never saved
    assert all(torch.isfinite(t).all() for t in checkpoint["model"].values())
    result = read_result(run_dir)
    assert result["status"] == "nan" and result["step"] == step and result["last_checkpoint"] == str(last_good)
    assert read_metrics(run_dir)[-1] == {
        "step": step,
        "status": "nan",
        "message": f"loss became {match[1]} at step {step}",
        "last_checkpoint": str(last_good),
    }


def test_flash_without_cuda_runs_through_the_interpreter_with_one_warning(tmp_path):
    run_dir = tmp_path / "run"
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}  # train.py sets it
    overrides = ["attention=flash", "model.dropout=0.1", "train.max_steps=2", "train.batch_size=2"]
    proc = train(run_dir, *overrides, "eval.steps=1", "eval.batch_size=2", env=env)
    assert_ok(proc)
    assert proc.stdout.count(FLASH_WARNING) == 1
    result = read_result(run_dir)
    assert result["status"] == "ok" and result["backend"] == "flash" and result["val/loss"] < 11.0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("attention=flesh", "Could not find 'attention/flesh'\n\nAvailable options in 'attention':\n\tflash\n"),
        ("experiment=quickstrat", "Could not find 'experiment/quickstrat'\n\nAvailable options in 'experiment':"),
        ("train.lrr=1", "Could not override 'train.lrr'"),
        ("seq_len=0", "seq_len=0 is out of range: it must be in [1, 65536]"),
        ("data.name=text_files", "data.name=text_files contradicts data=shakespeare: choose the source with data=NAME"),
        ("eval.span_len=32", "eval.span_len=32 must be a multiple of seq_len=64"),
    ],
)
def test_a_bad_command_line_fails_at_start_up(tmp_path, override, message):
    proc = train(tmp_path / "run", override)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_missing_data_reports_the_data_package_message(tmp_path):
    proc = train(tmp_path / "run", "data=text_files", f"data.path={tmp_path / 'no-such-corpus'}")
    assert proc.returncode != 0
    assert "matches no file; data=text_files needs a folder or a glob" in proc.stderr


def test_a_failed_save_leaves_the_previous_checkpoint_intact(tmp_path):
    path = tmp_path / "latest.pt"
    save_checkpoint({"step": 1, "weights": torch.ones(1000)}, path)
    before = path.read_bytes()
    with pytest.raises(AttributeError, match="pickle"):  # fails mid-write, after the tensor went out
        save_checkpoint({"step": 2, "weights": torch.zeros(1000), "hook": lambda: None}, path)
    assert path.read_bytes() == before
    assert load_checkpoint(path)["step"] == 1
    assert list(tmp_path.iterdir()) == [path]  # the temporary file is gone too


def test_resume_resolves_auto_and_paths(tmp_path):
    assert resolve_resume(None, tmp_path) is None
    assert resolve_resume("auto", tmp_path) is None  # nothing saved yet: start fresh
    save_checkpoint({"step": 3}, tmp_path / "checkpoints" / "latest.pt")
    assert resolve_resume("auto", tmp_path) == tmp_path / "checkpoints" / "latest.pt"
    assert resolve_resume(str(tmp_path / "checkpoints" / "latest.pt"), Path("elsewhere")).is_file()
    with pytest.raises(FileNotFoundError, match=r"resume=.*missing\.pt: no such checkpoint file"):
        resolve_resume(str(tmp_path / "missing.pt"), tmp_path)


def test_schedule_warms_up_then_follows_the_cosine_to_min_lr():
    train_cfg = TrainConfig(lr=1e-3, warmup_steps=10, max_steps=110)
    assert lr_at(1, train_cfg) == pytest.approx(1e-4)
    assert lr_at(10, train_cfg) == pytest.approx(1e-3)
    assert lr_at(60, train_cfg) == pytest.approx((1e-3 + 1e-4) / 2)  # halfway down: min_lr defaults to lr / 10
    assert lr_at(110, train_cfg) == pytest.approx(1e-4)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=train_cfg.lr)
    scheduler = build_scheduler(optimizer, train_cfg)
    for step in range(1, 111):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(lr_at(step, train_cfg))
        optimizer.step()
        scheduler.step()


def test_mfu_uses_known_peaks_and_never_guesses():
    assert peak_flops_per_sec("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops_per_sec("NVIDIA H100 PCIe") == 756e12
    assert peak_flops_per_sec("NVIDIA H200") == 989e12
    assert peak_flops_per_sec("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops_per_sec("NVIDIA L4") == 121e12
    assert peak_flops_per_sec("NVIDIA L40S") == 362e12
    assert peak_flops_per_sec("NVIDIA A10G") is None
    assert peak_flops_per_sec("cpu") is None
    assert mfu(6e8, 1e5, 989e12, n_devices=1) == pytest.approx(6e13 / 989e12)
    assert mfu(6e8, 2e5, 989e12, n_devices=2) == pytest.approx(6e13 / 989e12)
    assert mfu(6e8, 1e5, None, n_devices=1) is None


def test_oom_message_gives_the_requested_memory():
    message = (
        "CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
        "1.06 GiB is free. Of the allocated memory 75.2 GiB is allocated by PyTorch"
    )
    assert oom_request_gib(message) == 2.5
    assert oom_request_gib("CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 ...") == 0.5
    assert oom_request_gib("CUDA error: out of memory") is None


def test_position_buckets_double_from_128():
    assert position_buckets(64) == [(0, 128)]
    assert position_buckets(1024) == [(0, 128), (128, 256), (256, 512), (512, 1024)]
    assert position_buckets(16384)[-1] == (8192, 16384)
