"""The training step: the chunked linear + cross-entropy against the plain one in float64, the loss inside the
model, gradient accumulation, the on-device guard that never applies a non-finite update (in a TrainStep and in a
whole Trainer run that keeps its last good checkpoint), and scripts/bench_train.py's CPU smoke run."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from flashgpt.model.gpt import GPT, ModelConfig
from flashgpt.model.loss import linear_cross_entropy, per_token_cross_entropy
from flashgpt.training.checkpoint import load_checkpoint
from flashgpt.training.config import register_configs, typed_config
from flashgpt.training.distributed import DistContext
from flashgpt.training.loop import Trainer
from flashgpt.training.step import TrainStep
from training_runs import REPO, TINY, read_metrics, read_result

CPU = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
TINY_MODEL = ModelConfig(name="gpt2-tiny", n_layer=2, n_head=2, d_model=128)  # configs/model/gpt2-tiny.yaml
F64_TOL = {"rtol": 1e-10, "atol": 1e-12}


def fp64_problem(n_tokens: int, d_model: int, vocab: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_tokens, d_model, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(vocab, d_model, dtype=torch.float64, generator=gen, requires_grad=True)
    targets = torch.randint(0, vocab, (n_tokens,), generator=gen)
    return x, weight, targets


@pytest.mark.parametrize("chunk_tokens", [1, 7, 37, 64])  # one row, uneven chunks, exactly N, more than N
def test_linear_cross_entropy_equals_the_plain_loss_and_gradients_in_float64(chunk_tokens):
    x, weight, targets = fp64_problem(37, 16, 53, seed=chunk_tokens)
    upstream = 0.37  # a scaled loss (gradient accumulation divides it) must scale both gradients
    expected = F.cross_entropy(x @ weight.t(), targets)
    expected_grads = torch.autograd.grad(expected * upstream, (x, weight))
    loss = linear_cross_entropy(x, weight, targets, chunk_tokens=chunk_tokens)
    grads = torch.autograd.grad(loss * upstream, (x, weight))
    torch.testing.assert_close(loss, expected, **F64_TOL)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, **F64_TOL)


def test_per_token_cross_entropy_equals_the_plain_losses_and_gradients_in_float64():
    x, weight, targets = fp64_problem(37, 16, 53, seed=1)
    upstream = torch.randn(37, dtype=torch.float64, generator=torch.Generator().manual_seed(2))  # uneven weights
    expected = F.cross_entropy(x @ weight.t(), targets, reduction="none")
    losses = per_token_cross_entropy(x, weight, targets, chunk_tokens=8)
    torch.testing.assert_close(losses, expected, **F64_TOL)
    grads = torch.autograd.grad((losses * upstream).sum(), (x, weight))
    expected_grads = torch.autograd.grad((expected * upstream).sum(), (x, weight))
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, **F64_TOL)


def test_chunked_loss_keeps_no_logits_for_backward():
    """What autograd saves between forward and backward: the (N, V) logits for the plain loss; for the chunked one
    only dx (N, C) and dW (V, C), whatever the number of chunks."""
    n_tokens, d_model, vocab = 96, 8, 512

    def saved_elements(loss_fn) -> int:
        x, weight, targets = fp64_problem(n_tokens, d_model, vocab, seed=0)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            loss_fn(x, weight, targets)
        return sum(saved)

    plain = saved_elements(lambda x, w, t: F.cross_entropy(x @ w.t(), t))
    chunked = saved_elements(lambda x, w, t: linear_cross_entropy(x, w, t, chunk_tokens=16))
    assert plain >= n_tokens * vocab
    assert chunked == n_tokens * d_model + vocab * d_model


def test_chunked_loss_under_bf16_autocast_runs_the_matmuls_in_bf16():
    """Under autocast the chunk matmuls run in bf16 like lm_head's would, the softmax in fp32: it matches the
    logits path taken under the same autocast to bf16 rounding, and both match fp64 to bf16 precision."""
    x, weight, targets = fp64_problem(40, 32, 96, seed=3)
    x32, w32 = (t.detach().float().requires_grad_() for t in (x, weight))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        chunked = linear_cross_entropy(x32, w32, targets, chunk_tokens=16)
        plain = F.cross_entropy(F.linear(x32, w32).float(), targets)
    assert chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, plain, rtol=1e-6, atol=1e-6)  # same bf16 logits, fp32 softmax
    exact = F.cross_entropy(x @ weight.t(), targets)
    torch.testing.assert_close(chunked.double(), exact, rtol=2e-2, atol=0.0)
    grads = torch.autograd.grad(chunked, (x32, w32))
    exact_grads = torch.autograd.grad(exact, (x, weight))
    for grad, exact_grad in zip(grads, exact_grads, strict=True):
        assert grad.dtype == torch.float32
        assert (grad.double() - exact_grad).norm() < 2e-2 * exact_grad.norm()


def test_model_returns_the_loss_and_per_token_losses_of_its_own_logits():
    torch.manual_seed(0)
    model = GPT(TINY_MODEL, 32, "sdpa").double()
    idx = torch.randint(0, 50257, (2, 33))
    x, y = idx[:, :-1], idx[:, 1:]
    logits = model(x)
    assert logits.shape == (2, 32, TINY_MODEL.vocab_size)
    expected = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(2, 32)
    expected_grads = torch.autograd.grad(expected.mean(), list(model.parameters()))
    loss = model(x, y)
    torch.testing.assert_close(loss, expected.mean(), **F64_TOL)
    for grad, expected_grad in zip(torch.autograd.grad(loss, list(model.parameters())), expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, **F64_TOL)
    with torch.no_grad():
        torch.testing.assert_close(model(x, y, reduction="none"), expected.detach(), **F64_TOL)
    with pytest.raises(ValueError, match="reduction='sum'; choose"):
        model(x, y, reduction="sum")
    with pytest.raises(ValueError, match=r"targets of shape \(2, 31\) do not match idx \(2, 32\)"):
        model(x, y[:, 1:])


def tiny_step(seed: int = 0, grad_accum: int = 1, grad_clip: float = 1.0) -> tuple[GPT, TrainStep]:
    torch.manual_seed(seed)
    model = GPT(TINY_MODEL, 16, "sdpa")
    optimizer = model.configure_optimizer(1e-3, 0.1, (0.9, 0.95), "cpu")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda index: 1.0)
    return model, TrainStep(model, optimizer, scheduler, grad_accum=grad_accum, grad_clip=grad_clip, ctx=CPU)


def batches(n: int, batch_size: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    windows = [torch.randint(0, 50257, (batch_size, 17), generator=gen) for _ in range(n)]
    return [(w[:, :-1], w[:, 1:]) for w in windows]


def test_grad_accumulation_equals_one_big_batch():
    [(x, y)] = batches(1, 8, seed=0)
    big_model, big_step = tiny_step(grad_accum=1)
    big_stats = big_step(iter([(x, y)]).__next__)
    halves = iter([(x[:4], y[:4]), (x[4:], y[4:])])
    split_model, split_step = tiny_step(grad_accum=2)
    split_stats = split_step(halves.__next__)
    torch.testing.assert_close(split_stats, big_stats, rtol=1e-6, atol=1e-6)
    # After one step AdamW's first moment is (1 - beta1) x the clipped gradient: compare that, linear in the
    # gradient, rather than the update, which divides by sqrt(v) and amplifies rounding where the gradient is ~0.
    for big, split in zip(big_model.parameters(), split_model.parameters(), strict=True):
        expected = big_step.optimizer.state[big]["exp_avg"]
        scale = expected.abs().max().item()  # fp32 sums in another order: rounding relative to the largest entry
        torch.testing.assert_close(split_step.optimizer.state[split]["exp_avg"], expected, rtol=0, atol=1e-5 * scale)
    assert big_stats[1] > 1.0  # the norm before clipping, so clipping to 1 did change the update


def params_and_state(model: GPT, step: TrainStep) -> list[torch.Tensor]:
    state = [t for s in step.optimizer.state.values() for t in s.values()]
    return [p.detach().clone() for p in model.parameters()] + [t.clone() for t in state]


@pytest.mark.parametrize("where", ["loss", "gradient norm"])
def test_a_non_finite_step_and_every_later_one_leave_weights_and_optimizer_state_untouched(where):
    model, step = tiny_step()
    data = iter(batches(5, 2, seed=1))
    for _ in range(2):
        assert torch.isfinite(step(data.__next__)).all()
    before = params_and_state(model, step)

    if where == "loss":  # the hidden states turn NaN: so do the loss and every gradient
        handle = model.ln_f.register_forward_hook(lambda module, args, out: out * math.nan)
    else:  # a finite loss with a NaN gradient
        handle = model.wte.weight.register_hook(lambda grad: grad * math.nan)
    stats = step(data.__next__)
    handle.remove()
    assert math.isnan(stats[1]) and math.isnan(stats[0]) == (where == "loss")
    step(data.__next__)  # finite, but the flag stays set: the host has not stopped the run yet
    after = params_and_state(model, step)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert step.nonfinite.item() == 1.0


def test_train_step_refuses_an_optimizer_that_cannot_skip_on_the_device():
    model = GPT(TINY_MODEL, 16, "sdpa")
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda index: 1.0)
    with pytest.raises(ValueError, match="needs a fused AdamW"):
        TrainStep(model, optimizer, scheduler, grad_accum=1, grad_clip=1.0, ctx=CPU)


def tiny_trainer(run_dir: Path, *overrides: str) -> Trainer:
    """A Trainer in this process, from the real configs (tests/training_runs.py's TINY run)."""
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*TINY, *overrides])
    resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    return Trainer(typed_config(cfg), resolved, run_dir, CPU)


@pytest.mark.parametrize("where", ["loss", "gradient norm"])
def test_a_nan_mid_run_stops_it_with_the_weights_and_checkpoint_of_the_last_good_step(tmp_path, where):
    """Step 5 goes bad. Logging every 10 steps and checkpointing every 4, the host reads step 5 only while the
    device runs step 6, whose update the latched flag skips too: the weights must still be step 4's, which is also
    the checkpoint."""
    trainer = tiny_trainer(tmp_path, "train.max_steps=12", "log.every=10", "checkpoint.every=4", "eval.every=0")
    calls = {"n": 0}

    def poison_step_5(value: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        return value * math.nan if calls["n"] == 5 else value

    model = trainer.raw_model
    if where == "loss":
        model.ln_f.register_forward_hook(lambda module, args, out: poison_step_5(out))
    else:
        model.wte.weight.register_hook(poison_step_5)
    assert trainer.train() == "nan"
    assert calls["n"] == 6  # step 6 ran before the host saw step 5's numbers

    checkpoint = load_checkpoint(tmp_path / "checkpoints" / "latest.pt")
    assert checkpoint["step"] == 4
    for name, value in model.state_dict().items():
        assert torch.equal(value, checkpoint["model"][name]), name
    result = read_result(tmp_path)
    assert result["status"] == "nan" and result["step"] == 5
    assert result["message"] == f"{where} became nan at step 5"
    assert result["last_checkpoint"] == str(tmp_path / "checkpoints" / "latest.pt")
    assert read_metrics(tmp_path)[-1]["status"] == "nan"


def test_bench_train_smoke_times_every_step_and_writes_json(tmp_path):
    """scripts/bench_train.py --smoke on the CPU: the reference and train.py's step for every backend, with learned
    and rotary positions, each traced whole by torch.compile (aot_eager) and run for two steps."""
    out = tmp_path / "bench.json"
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}  # the script sets it
    command = [sys.executable, "scripts/bench_train.py", "--smoke", "--positions", "learned,rope", "--out", str(out)]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["command"] == f"python scripts/bench_train.py --smoke --positions learned,rope --out {out}"
    assert report["complete"]
    rows = {(row["provider"], row["positions"]): row for row in report["rows"]}
    backends = [(p, e) for p in ("naive", "flash", "sdpa") for e in ("learned", "rope")]
    assert list(rows) == [("reference", "learned"), *backends]  # the reference has no rotary variant
    for provider, row in rows.items():
        assert row["status"] == "ok" and row["tokens_per_sec"] > 0, row
        assert (row["seq_len"], row["batch"], row["dropout"]) == (64, 4, 0.1)
        assert 10.0 < row["loss"] < 11.5, row  # random tokens: about ln(50257) = 10.8 at initialisation
        assert row.get("fullgraph", True), f"{provider}: torch.compile broke the graph"
    assert "| train.py attention=flash |" in done.stdout and "| flash / sdpa |" in done.stdout
    assert "| train.py attention=flash, rope |" in done.stdout and "| flash: rope / learned |" in done.stdout
